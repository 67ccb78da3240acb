"""One checkpoint file holds everything needed to reuse a model.

Weights, model shape, discretizer, dataset metadata and the resolved run config, plus the
training state (optimiser, position, RNG) for resuming. Only tensors and plain Python values
are stored, so `torch.load(path, weights_only=True)` reads it.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import pickle
import tempfile
import warnings
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

import torch

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.episodes import DISCOUNT, TERMINAL_PENALTY
from trajectory_transformer.data.goals import continuing_rewards_of
from trajectory_transformer.data.minari_source import DatasetInfo
from trajectory_transformer.model import GPTConfig, TrajectoryGPT

FORMAT_VERSION = 4
"""4: the model may take the whole observation as one more input (`observation_vector`), and
its value inputs may come without the tokens' embeddings or through a periodic embedding;
3: the model may take real values as inputs (`value_inputs`, with its normalisation in the
weights) and the discretizer stores its data's mean and standard deviation; 2: the
discretizer stores what each token decodes to (bin means); 1: edges only (midpoints).
Older formats load as they were trained, the fields they lack at their defaults."""
READABLE_FORMATS = (1, 2, 3, 4)


class CheckpointError(ValueError):
    """A checkpoint cannot be used here; the message says what differs."""


RUN_STATE = "checkpoint.pt"
"""The file a run resumes from: its last state, optimiser included."""
PLANNING_MODEL = "model.pt"
"""The file a finished run hands over to plan with (`write_planning_model`)."""


PRETRAINED = "pretrained:"
"""Where a checkpoint's path is expected, `pretrained:<dataset id>` names a pretrained one."""
BEHAVIOUR = "behaviour:"
"""Where tt-eval expects a checkpoint, `behaviour:<dataset id>` names no checkpoint but the
policy that made an embedded dataset, played as an agent (`suites.behaviour_agent`)."""
PRETRAINED_DIR_VARIABLE = "TT_PRETRAINED_DIR"
"""An environment variable naming another folder of pretrained checkpoints (its own
`manifest.json`) than the one installed with the package."""


def pretrained_dir() -> Path:
    """The folder of the pretrained checkpoints and their `manifest.json`: the package's own
    (`trajectory_transformer.pretrained`), or the one `TT_PRETRAINED_DIR` names."""
    if folder := os.environ.get(PRETRAINED_DIR_VARIABLE):
        return Path(folder)
    return Path(str(importlib.resources.files("trajectory_transformer.pretrained")))


def pretrained_manifest() -> dict[str, dict]:
    """The pretrained checkpoints' manifest entries, by dataset id."""
    path = pretrained_dir() / "manifest.json"
    if not path.is_file():
        return {}
    return json.loads(path.read_text())["checkpoints"]


def pretrained_entry(name: str) -> dict:
    """The manifest entry of the pretrained checkpoint of dataset `name`; an unknown name is
    refused in one line that lists the known ones."""
    entries = pretrained_manifest()
    if name not in entries:
        known = ", ".join(sorted(entries)) or "none in this installation"
        raise CheckpointError(
            f"no pretrained checkpoint is named {name!r}; the pretrained ones: {known} "
            f"({pretrained_dir() / 'manifest.json'})"
        )
    return entries[name]


def pretrained_file(name: str) -> Path:
    """The file of the pretrained checkpoint of dataset `name` (`pretrained_entry`)."""
    return pretrained_dir() / pretrained_entry(name)["file"]


def pretrained_planner_settings(name: str) -> dict:
    """The planner settings the manifest's scores of checkpoint `name` were measured with,
    where they differ from `PlannerConfig`'s defaults (its `planner_settings`)."""
    return dict(pretrained_entry(name).get("planner_settings", {}))


def pretrained_name(path: str | os.PathLike) -> str | None:
    """The dataset id named by a `pretrained:<dataset id>` path; None for any other path."""
    text = str(path)
    return text[len(PRETRAINED) :] if text.startswith(PRETRAINED) else None


def behaviour_name(path: str | os.PathLike) -> str | None:
    """The dataset id named by a `behaviour:<dataset id>` path; None for any other path."""
    text = str(path)
    return text[len(BEHAVIOUR) :] if text.startswith(BEHAVIOUR) else None


def is_pretrained(path: str | os.PathLike) -> bool:
    return pretrained_name(path) is not None


def checkpoint_file(path: str | os.PathLike, to_resume: bool = False) -> Path:
    """`path` itself, or in a run directory the file to use: `model.pt` to plan with (a run
    from before it existed: `checkpoint.pt`), `checkpoint.pt` to resume; `pretrained:<dataset
    id>`, the pretrained checkpoint of that dataset."""
    name = pretrained_name(path)
    if name is not None and not to_resume:
        return pretrained_file(name)
    path = Path(path)
    if not path.is_dir():
        return path
    names = (RUN_STATE,) if to_resume else (PLANNING_MODEL, RUN_STATE)
    for name in names:
        if (path / name).is_file():
            return path / name
    raise CheckpointError(
        f"{path} is a directory without {' or '.join(names)}: give tt-train's run directory "
        "(a finished run), or a checkpoint file."
    )


def write_planning_model(run_dir: str | os.PathLike, validated: bool) -> Path:
    """`model.pt`, the model a finished run hands over: the weights of its best validation
    loss where it has a validation split (`best_validation.pt`), else its last weights. One rule
    for every schedule: where a run overfits, the best validation played far better than the
    last weights, and never worse beyond the standard errors (reacher, 30 minutes: cosine
    85-88 against 76-80, wsd 86-88 against 62-73, schedule_free 84-86 against 85-87). It keeps
    no optimiser state: resume reads `checkpoint.pt`."""
    run_dir = Path(run_dir)
    source = run_dir / ("best_validation.pt" if validated else RUN_STATE)
    if not source.is_file():
        source = run_dir / RUN_STATE
    payload = read_payload(source)
    training = payload.get("training") or {}
    kept = ("step", "finished", "best_validation", "elapsed_seconds", "schedule")
    payload["training"] = {key: training[key] for key in kept if key in training}
    payload["training"]["weights_of"] = source.name
    return save_atomic(payload, run_dir / PLANNING_MODEL)


def compact_planning_payload(payload: dict, dtype: torch.dtype = torch.float16) -> dict:
    """A planning model's payload (`model.pt`) with its parameters stored as `dtype`, half the
    bytes in float16; buffers (the real-value inputs' normalisation) keep their precision.
    Loading casts them back: `load_state_dict` copies into the model's float32 parameters."""
    model = TrajectoryGPT(GPTConfig(**payload["model_config"]))
    parameters = {name for name, _ in model.named_parameters()}
    compact = dict(payload)
    compact["model"] = {
        name: tensor.to(dtype) if name in parameters and tensor.is_floating_point() else tensor
        for name, tensor in payload["model"].items()
    }
    return compact


@dataclass
class Checkpoint:
    model: TrajectoryGPT
    discretizer: Discretizer
    dataset: DatasetInfo
    config: dict  # the resolved run config
    training: dict | None  # optimiser and progress; None in a weights-only export
    path: Path | None = None


def value_targets_of(config: dict) -> tuple[float, float]:
    """(discount, terminal_penalty) that a checkpoint's reward and value tokens were trained
    with, from its resolved tt-train config (the defaults where it names none)."""
    dataset = config.get("dataset", {})
    return dataset.get("discount", DISCOUNT), dataset.get("terminal_penalty", TERMINAL_PENALTY)


def build_payload(
    model: TrajectoryGPT,
    discretizer: Discretizer,
    dataset: DatasetInfo,
    config: dict,
    training: dict | None,
    validation: dict | None = None,
) -> dict:
    """`validation`: the held-out episodes (fraction, seed, indices), when there are any."""
    return {
        "format_version": FORMAT_VERSION,
        "model_config": asdict(model.config),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "discretizer": discretizer.state_dict(),
        "dataset": dataset.to_dict(),
        "config": config,
        "training": training,
        "validation": validation,
    }


def save_atomic(payload: dict, path: str | os.PathLike) -> Path:
    """Write to a temporary file in the same folder, then rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_stored(path: str | os.PathLike, kind: str, missing: str) -> object:
    """What the checkpoint file `path` stores, its tensors on the CPU wherever they were saved,
    read without running code from it (a model's or a critic's). `kind` names what the file
    should be in errors ("a critic checkpoint"); `missing` is the error where there is none."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(missing)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's own message advises loading with weights_only=False: never for a file that
        # is not known, since that runs code from it.
        raise CheckpointError(
            f"{path} is not {kind} (it holds Python objects that a checkpoint never holds, so "
            "it was not loaded)."
        ) from None
    except Exception as error:  # which error a damaged or foreign file raises varies by release
        raise CheckpointError(
            f"{path} is not {kind}, or is damaged (torch cannot read it: "
            f"{type(error).__name__}); use another checkpoint, or train again."
        ) from None


def read_payload(path: str | os.PathLike) -> dict:
    """The stored dictionary of a checkpoint, its tensors on the CPU wherever they were saved."""
    missing = f"no checkpoint at {path}; training writes one as <run dir>/checkpoint.pt."
    payload = read_stored(path, "a trajectory-transformer checkpoint", missing)
    if not isinstance(payload, dict) or "format_version" not in payload:
        found = (
            f"a dict with keys {sorted(map(str, payload))[:8]}"
            if isinstance(payload, dict)
            else f"a {type(payload).__name__}"
        )
        raise CheckpointError(
            f"{path} is not a trajectory-transformer checkpoint (it holds {found}, "
            f"without a format_version)."
        )
    if payload.get("kind") == "iql-critic":
        raise CheckpointError(
            f"{path} is a critic checkpoint (tt-train-critic), not a model's: tt-eval plays its "
            "policy with planner=iql, or scores a model's beams with it with "
            f"planner.value=critic planner.critic={path}"
        )
    version = payload["format_version"]
    if version not in READABLE_FORMATS:
        raise CheckpointError(
            f"{path} is a trajectory-transformer checkpoint of format {version!r}; this "
            f"version reads formats {', '.join(map(str, READABLE_FORMATS))}."
        )
    if version == 1:
        warnings.warn(
            f"{path} is a checkpoint of format 1: its tokens decode to bin midpoints, as it was "
            "trained; a model trained now decodes them to the mean of the data in each bin",
            UserWarning,
            stacklevel=2,
        )
    return payload


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> Checkpoint:
    """Load a checkpoint's model (in eval mode, on `device`) and everything that goes with it;
    `path` may be a run directory (its `model.pt`)."""
    path = checkpoint_file(path)
    payload = read_payload(path)
    model = TrajectoryGPT(GPTConfig(**payload["model_config"]))
    model.load_state_dict(payload["model"])
    model.to(device).eval()
    return Checkpoint(
        model=model,
        discretizer=Discretizer.from_state_dict(payload["discretizer"]).to(device),
        dataset=DatasetInfo.from_dict(payload["dataset"]),
        config=payload["config"],
        training=payload["training"],
        path=Path(path),
    )


def check_compatible(
    payload: dict,
    model_config: GPTConfig,
    dataset: DatasetInfo,
    dataset_config: dict,
    validation: dict | None = None,
) -> None:
    """Refuse to resume a checkpoint made for another dataset, other training targets (discount,
    terminal penalty, discretizer), another model shape or another validation split, listing
    everything that differs."""
    differences = []

    def compare(name: str, saved: object, now: object) -> None:
        if saved != now:
            differences.append(f"{name}: checkpoint {saved!r}, now {now!r}")

    saved_model = payload["model_config"]
    # A field that an older checkpoint lacks had its default then (value_inputs: off).
    defaults = {f.name: f.default for f in fields(GPTConfig) if f.default is not MISSING}
    for key, value in asdict(model_config).items():
        if key not in GPTConfig.EXECUTION_FIELDS:  # how training runs may change on resume
            compare(f"model.{key}", saved_model.get(key, defaults.get(key)), value)
    saved_data = payload["dataset"]
    for key in ("dataset_id", "observation_dim", "action_dim", "num_transitions"):
        compare(f"dataset.{key}", saved_data.get(key), getattr(dataset, key))
    if saved_data.get("fingerprint") is not None:  # the same numbers (a rebuild may differ)
        compare("dataset.fingerprint", saved_data["fingerprint"], dataset.fingerprint)
    # The value and reward tokens were built with these; new ones would silently change them.
    saved_discount, saved_penalty = value_targets_of(payload["config"])
    compare("dataset.discount", saved_discount, dataset_config["discount"])
    compare("dataset.terminal_penalty", saved_penalty, dataset_config["terminal_penalty"])
    # The scale of the rewards past a relabelled goal, where both runs have such windows.
    saved_scale = continuing_rewards_of(payload["config"].get("dataset", {}))
    now_scale = continuing_rewards_of(dataset_config)
    if saved_scale is not None and now_scale is not None:
        compare("dataset.relabel_continuing_rewards", saved_scale, now_scale)
    saved_strategy = payload["discretizer"]["strategy"]
    compare("dataset.discretizer", saved_strategy, dataset_config["discretizer"])
    compare("dataset.n_bins", saved_model.get("n_bins"), dataset_config["n_bins"])
    saved_decoding = payload["discretizer"].get("bin_values", "midpoint")  # format 1: midpoints
    compare("dataset.bin_values", saved_decoding, dataset_config["bin_values"])
    saved_split = (payload.get("validation") or {}).get("episodes", [])
    compare("validation episodes", saved_split, (validation or {}).get("episodes", []))
    if differences:
        raise CheckpointError(
            "the checkpoint was made with other settings:\n  "
            + "\n  ".join(differences)
            + "\nResume with the same dataset, targets and model settings, or start a new run."
        )
