"""Reading checkpoints: files that are not ours, and checkpoints written on a GPU."""

from __future__ import annotations

import contextlib
import pickle
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import results_table as script
import torch
from conftest import tiny_training, tiny_training_info

from trajectory_transformer.checkpoint import (
    CheckpointError,
    build_payload,
    load_checkpoint,
    read_payload,
    save_atomic,
)
from trajectory_transformer.planning import BeamPlanner
from trajectory_transformer.training.trainer import Trainer


@contextlib.contextmanager
def tagged_as_cuda():
    """Make `torch.save` record every storage as living on `cuda:0`, as a checkpoint written on a
    GPU machine does, so that such a file can be made and read on a CPU-only one."""
    registry = torch.serialization._package_registry
    entry = (-1000, lambda storage: "cuda:0", lambda storage, location: None)
    registry.insert(0, entry)
    try:
        yield
    finally:
        registry.remove(entry)


def trained_checkpoint(
    path: Path, steps: int = 3, finished: bool = False, value_inputs: bool = False
) -> Path:
    model, windows, discretizer, cfg = tiny_training(value_inputs=value_inputs)
    trainer = Trainer(
        model, windows, replace(cfg, max_steps=6), lambda s: path, seed=0, progress=False
    )
    trainer.log = lambda metrics, step: trainer.request_stop() if step == steps else None
    with contextlib.suppress(KeyboardInterrupt):
        trainer.train()
    payload = build_payload(
        model, discretizer, tiny_training_info(), {}, trainer.state(finished=finished)
    )
    return save_atomic(payload, path)


@pytest.fixture
def cuda_checkpoint(tmp_path) -> Path:
    with tagged_as_cuda():
        path = trained_checkpoint(tmp_path / "cuda" / "checkpoint.pt", finished=True)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):  # the file really claims the GPU
            torch.load(path, weights_only=True)
    return path


def test_a_checkpoint_written_on_cuda_loads_on_the_cpu(cuda_checkpoint, tmp_path):
    plain = trained_checkpoint(tmp_path / "cpu" / "checkpoint.pt", finished=True)
    loaded, reference = load_checkpoint(cuda_checkpoint), load_checkpoint(plain)
    assert all(p.device.type == "cpu" for p in loaded.model.parameters())
    tokens = torch.randint(0, 16, (2, 8))
    torch.testing.assert_close(loaded.model(tokens), reference.model(tokens))


def test_training_resumes_on_the_cpu_from_a_cuda_checkpoint(cuda_checkpoint):
    payload = read_payload(cuda_checkpoint)
    model, windows, _, cfg = tiny_training()
    model.load_state_dict(payload["model"])
    trainer = Trainer(model, windows, replace(cfg, max_steps=6), lambda s: cuda_checkpoint)
    trainer.progress = False
    trainer.load_state(payload["training"])
    for state in trainer.optimizer.state.values():
        assert all(v.device.type == "cpu" for v in state.values() if torch.is_tensor(v))
    assert trainer.step == 3
    trainer.train()
    assert trainer.step == 6


def test_results_table_reads_a_cuda_checkpoint(cuda_checkpoint, monkeypatch):
    monkeypatch.setattr(script, "run", lambda command: pytest.fail(f"retrained: {command}"))
    # A finished checkpoint is reused, not trained again.
    assert script.train("pendulum-medium", 0, cuda_checkpoint.parent, []) == cuda_checkpoint


class Foreign:
    """Something another program pickled."""


def foreign_files(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    real = trained_checkpoint(folder / "real.pt")
    files = {
        "random bytes": folder / "random.pt",
        "truncated": folder / "truncated.pt",
        "a tensor": folder / "tensor.pt",
        "a state dict": folder / "state_dict.pt",
        "another program's object": folder / "object.pt",
        "a plain pickle": folder / "plain.pt",
    }
    files["random bytes"].write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy())
    files["truncated"].write_bytes(real.read_bytes()[:5000])
    torch.save(torch.zeros(3), files["a tensor"])
    torch.save({"weight": torch.zeros(3)}, files["a state dict"])
    torch.save({"format_version": 1, "model": Foreign()}, files["another program's object"])
    files["a plain pickle"].write_bytes(pickle.dumps([1, 2, 3]))
    return files


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_file_that_is_not_a_checkpoint_is_named_as_such(tmp_path):
    for kind, path in foreign_files(tmp_path).items():
        with pytest.raises(CheckpointError, match="is not a trajectory-transformer checkpoint"):
            load_checkpoint(path)
        with pytest.raises(CheckpointError) as error:
            read_payload(path)
        message = str(error.value)
        assert message.startswith(str(path)) and "\n" not in message, kind
        # Never torch's advice to load an unknown file with weights_only=False.
        assert "weights_only" not in message and "trust" not in message, kind
    damaged = read_error(foreign_files(tmp_path)["truncated"])
    assert re.search(r"or is damaged \(torch cannot read it: \w+\); use another", damaged)
    assert "it holds Python objects that a checkpoint never holds, so it was not loaded" in (
        read_error(foreign_files(tmp_path)["another program's object"])
    )


def read_error(path: Path) -> str:
    with pytest.raises(CheckpointError) as error:
        read_payload(path)
    return str(error.value)


def test_a_checkpoint_of_another_format_version_says_which(tmp_path):
    path = trained_checkpoint(tmp_path / "checkpoint.pt")
    payload = torch.load(path, weights_only=True)
    save_atomic(payload | {"format_version": 99}, path)
    with pytest.raises(CheckpointError, match="format 99; this version reads formats 1, 2, 3"):
        load_checkpoint(path)


def test_a_format_1_checkpoint_decodes_as_before_with_one_notice(tmp_path):
    """Format 1 stored the discretizer's edges alone; its tokens decode to bin midpoints."""
    path = trained_checkpoint(tmp_path / "checkpoint.pt")
    payload = torch.load(path, weights_only=True)
    edges = payload["discretizer"]["edges"]
    payload["format_version"] = 1
    payload["discretizer"] = {"edges": edges, "strategy": "uniform"}
    save_atomic(payload, path)

    with pytest.warns(UserWarning, match="format 1: its tokens decode to bin midpoints") as seen:
        loaded = load_checkpoint(path)
    assert len(seen) == 1
    tokens = torch.arange(16)[:, None].expand(16, edges.shape[0])  # every token of every dim
    midpoints = (0.5 * (edges[:, 1:] + edges[:, :-1])).T
    assert torch.equal(loaded.discretizer.decode(tokens), midpoints)
    x = torch.linspace(-3, 3, 50)[:, None].expand(50, edges.shape[0]).contiguous()
    before = torch.searchsorted(edges[:, 1:-1].contiguous(), x.T.contiguous(), right=True).T
    assert torch.equal(loaded.discretizer.encode(x), before)


def greedy_plan(path: Path):
    """The plan of the checkpoint at `path`, greedy, for two steps of a fixed episode."""
    planner = BeamPlanner.from_checkpoint(
        path, deterministic=True, horizon=2, beam_width=3, context_transitions=1
    )
    planner.reset(1)
    observation = np.array([[0.3, -0.2]], dtype=np.float32)
    planner.act(observation)
    planner.observe(np.array([0.5]), np.array([False]))
    return planner.plan(observation + 0.01)


def test_a_model_with_value_inputs_round_trips_with_its_normalisation(tmp_path):
    path = trained_checkpoint(tmp_path / "checkpoint.pt", value_inputs=True)
    payload = torch.load(path, weights_only=True)
    assert payload["format_version"] == 4 and payload["model_config"]["value_inputs"]
    loaded = load_checkpoint(path)
    discretizer = loaded.discretizer
    assert discretizer.mean is not None and discretizer.std is not None
    low, high, loc, scale = discretizer.value_normalisation()
    model = loaded.model
    assert torch.equal(model.input_loc, loc) and torch.equal(model.input_scale, scale)
    assert torch.equal(model.input_low, low) and torch.equal(model.input_high, high)
    dims = torch.arange(model.config.transition_dim)
    expected = model.normalise_values(discretizer.values.T, dims).T
    assert torch.equal(model.token_inputs, expected)
    first, second = greedy_plan(path), greedy_plan(path)
    assert torch.equal(first.tokens, second.tokens)


def test_a_format_3_checkpoint_loads_and_plans_as_before(tmp_path):
    """Format 3 knew value inputs, but no observation vector: it loads without one."""
    path = trained_checkpoint(tmp_path / "checkpoint.pt", value_inputs=True)
    before = greedy_plan(path)
    payload = torch.load(path, weights_only=True)
    payload["format_version"] = 3
    del payload["model_config"]["observation_vector"]
    old = save_atomic(payload, tmp_path / "old" / "checkpoint.pt")
    loaded = load_checkpoint(old)
    assert loaded.model.config.value_inputs and not loaded.model.config.observation_vector
    after = greedy_plan(old)
    assert torch.equal(after.tokens, before.tokens)
    assert torch.equal(after.scores, before.scores)


def test_a_format_2_checkpoint_loads_resumes_and_plans_as_before(tmp_path):
    """Format 2 knew no value inputs and no data moments: it loads as the paper's model,
    plans as it did, and resumes under a config without value inputs."""
    from trajectory_transformer.checkpoint import check_compatible
    from trajectory_transformer.model import GPTConfig

    path = trained_checkpoint(tmp_path / "checkpoint.pt")
    before = greedy_plan(path)
    payload = torch.load(path, weights_only=True)
    payload["format_version"] = 2
    del payload["model_config"]["value_inputs"]
    for key in ("mean", "std"):
        del payload["discretizer"][key]
    old = save_atomic(payload, tmp_path / "old" / "checkpoint.pt")
    loaded = load_checkpoint(old)
    assert not loaded.model.config.value_inputs and loaded.discretizer.mean is None
    after = greedy_plan(old)
    assert torch.equal(after.tokens, before.tokens)
    assert torch.equal(after.scores, before.scores)
    dataset_config = {"discount": 0.99, "terminal_penalty": -100.0, "discretizer": "uniform"}
    dataset_config |= {"n_bins": 16, "bin_values": "mean"}
    config = GPTConfig(**read_payload(old)["model_config"])
    check_compatible(read_payload(old), config, tiny_training_info(), dataset_config)
    with pytest.raises(CheckpointError, match=r"model\.value_inputs: checkpoint False, now True"):
        check_compatible(
            read_payload(old),
            replace(config, value_inputs=True),
            tiny_training_info(),
            dataset_config,
        )
    with pytest.raises(ValueError, match="format 1 or 2"):
        loaded.discretizer.value_normalisation()


def test_a_run_directory_names_the_model_to_plan_with_and_the_state_to_resume(tmp_path):
    from trajectory_transformer.checkpoint import checkpoint_file

    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(CheckpointError, match=r"directory without model\.pt or checkpoint\.pt"):
        checkpoint_file(run)
    (run / "checkpoint.pt").write_bytes(b"")
    assert checkpoint_file(run) == run / "checkpoint.pt"  # a run from before model.pt
    (run / "model.pt").write_bytes(b"")
    assert checkpoint_file(run) == run / "model.pt"
    assert checkpoint_file(run, to_resume=True) == run / "checkpoint.pt"
    assert checkpoint_file(run / "best.pt") == run / "best.pt"  # a file is itself


def test_resuming_refuses_another_scale_of_the_rewards_past_a_relabelled_goal(tmp_path):
    """A run that relabels windows with episodes going on past their goal trained its values
    on one scale of their rewards; runs before the setting had raw ones."""
    from trajectory_transformer.checkpoint import check_compatible
    from trajectory_transformer.model import GPTConfig

    payload = read_payload(trained_checkpoint(tmp_path / "checkpoint.pt"))
    saved = payload["config"].setdefault("dataset", {})
    saved |= {"discount": 0.99, "terminal_penalty": -100.0, "relabel_reached": 0.25}
    saved.pop("relabel_continuing_rewards", None)  # before the setting: raw
    config = GPTConfig(**payload["model_config"])
    now = {"discount": 0.99, "terminal_penalty": -100.0, "discretizer": "uniform"}
    now |= {"n_bins": 16, "bin_values": "mean", "relabel_reached": 0.25}
    now |= {"relabel_continuing_rewards": "scaled"}
    with pytest.raises(
        CheckpointError, match=r"relabel_continuing_rewards: checkpoint 'raw', now 'scaled'"
    ):
        check_compatible(payload, config, tiny_training_info(), now)
    check_compatible(
        payload, config, tiny_training_info(), now | {"relabel_continuing_rewards": "raw"}
    )
    # Without windows that go on past their goal now, the scale names nothing trained.
    check_compatible(payload, config, tiny_training_info(), now | {"relabel_reached": 0.0})
