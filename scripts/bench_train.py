"""Training throughput: time per step, tokens per second and peak memory of the training step.

Runs `Trainer.train_step` (forward, weighted loss, backward, clip, AdamW) on random tokens for
two shapes, the paper's HalfCheetah model and the demo's Pendulum model, under each setting
asked for: activation checkpointing (`model.activation_checkpointing`), precision
(`trainer.precision`) and compilation (`trainer.compile`). The last line of output is one JSON
object with every measurement.

Settings: each of --checkpointing, --precision, --compile and --attention takes a comma
list. By default (`--grid axes`) the first value of every list is the baseline and each other
value is tried with the rest of the baseline, one axis at a time; `--grid cross` runs the
whole cross product.

Peak memory ("step peak"): on CUDA, `torch.cuda.max_memory_allocated` during the timed steps
minus what was allocated before them. On the CPU, one extra (untimed) step runs under
`torch.profiler` with `profile_memory=True`; the step peak is the highest point of the running
sum of its allocation and free events, i.e. the most memory the step's own tensors held at
once above what was held before it (parameters, gradients and optimiser state from earlier
steps are not counted; the first step's optimiser state would be). It doubles when the batch
doubles, unlike the process RSS high-water mark (`peak_rss_mib`, also reported), which also
holds the allocator's caches, the libraries and everything before. Allocations made by
intra-op worker threads are not seen; they are scratch buffers of a few MiB at most.

`--isolate` runs every setting in a fresh process (this script, for that one setting), so
RSS, allocator caches and compiled code do not carry over from one setting to the next.

`--published PATH` also times the published faster-trajectory-transformer model
(github:Howuhh/faster-trajectory-transformer, a work tree at PATH) on the same shape: same
vocabulary, block, layers, width, heads, dropout and batch; its forward, its weighted loss,
backward, gradient clip and AdamW with its weight-decay groups, in float32 and uncompiled as
it ships. Each of our settings then carries `speedup_vs_published` (its time per step over
ours).

    python scripts/bench_train.py                 # both presets, on the default device
    python scripts/bench_train.py --preset paper --steps 30 --device cuda
    python scripts/bench_train.py --preset paper --steps 3 --warmup 1 --isolate \\
        --checkpointing none,full,selective --precision fp32,bf16 --compile off,on \\
        --published /tmp/ftt
    python scripts/bench_train.py --preset paper --attention model,sdpa --isolate
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import platform
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from bench_common import peak_rss_mib

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.model import GPTConfig, TrajectoryGPT, gpt
from trajectory_transformer.training.trainer import Trainer, TrainerConfig

PRESETS = {
    # 17 obs + 6 act dims (25 tokens a transition), 4 layers x 4 heads x 128, window 10,
    # batch 256, N = 100.
    "paper": (GPTConfig(17, 6, 100, 10, 4, 4, 128, 0.1), 256),
    # configs/model/demo.yaml + configs/trainer/demo.yaml on Pendulum (3 obs + 1 act dims).
    "demo": (GPTConfig(3, 1, 100, 10, 3, 4, 64, 0.0), 128),
}
# The published model's loss weights, learning rate, betas, decay and clip (its HalfCheetah
# config); ours are the same by default.
PUBLISHED_TRAINING = {"action_weight": 5.0, "lr": 6e-4, "betas": (0.9, 0.95), "decay": 0.1}


@dataclasses.dataclass(frozen=True)
class Setting:
    checkpointing: str = "none"
    precision: str = "fp32"
    compile: bool = False
    sdpa: bool = False  # the training attention replaced by F.scaled_dot_product_attention

    def label(self) -> str:
        compiled = "on" if self.compile else "off"
        label = f"ckpt={self.checkpointing} {self.precision} compile={compiled}"
        return label + (" sdpa" if self.sdpa else "")


def step_peak_bytes(step: Callable[[], None]) -> int:
    """The most bytes the CPU step's own allocations held at once (see the docstring)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    held = peak = 0
    for _, nbytes in events:
        held += nbytes
        peak = max(peak, held)
    return peak


def measure(
    step: Callable[[], None], steps: int, warmup: int, device: torch.device, memory: bool
) -> dict:
    """Time `steps` calls of `step` one by one after `warmup`, then measure one step's peak
    memory."""

    def timed() -> float:
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - start)

    for _ in range(warmup):
        timed()
    if device.type == "cuda":
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    result = {"step_ms": [timed() for _ in range(steps)]}
    if device.type == "cuda":
        result["step_peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    elif memory:
        result["step_peak_mib"] = step_peak_bytes(step) / 2**20
    return result


def bench(
    name: str,
    setting: Setting,
    steps: int,
    warmup: int,
    device: torch.device,
    batch_size: int | None,
    memory: bool,
) -> dict:
    config, preset_batch = PRESETS[name]
    batch_size = batch_size or preset_batch
    config = dataclasses.replace(config, activation_checkpointing=setting.checkpointing)
    if setting.sdpa:  # what the model ran before it had its own CPU dropout attention

        def sdpa(q, k, v, mask, p):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)

        gpt.dropout_attention = sdpa
    rng = np.random.default_rng(0)
    transitions = rng.uniform(size=(20_000, config.transition_dim)).astype(np.float32)
    discretizer = Discretizer.fit(transitions, config.n_bins, "uniform")
    windows = TokenWindows(
        transitions, np.array([len(transitions)]), discretizer, config.sequence_transitions
    )
    torch.manual_seed(0)
    model = TrajectoryGPT(config).to(device)
    trainer_config = TrainerConfig(
        batch_size=batch_size,
        max_steps=warmup + steps + 1,
        precision=setting.precision,
        compile=setting.compile,
    )
    trainer = Trainer(model, windows, trainer_config, save=lambda state: None, progress=False)
    model.train()
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        trainer.train_step(torch.randint(len(windows), (batch_size,), generator=generator))

    return timings(
        {
            "preset": name,
            "setting": dataclasses.asdict(setting),
            "model": dataclasses.asdict(config),
            "parameters": model.num_parameters(),
            "batch_size": batch_size,
            "tokens_per_step": batch_size * (config.block_size - 1),
            **measure(step, steps, warmup, device, memory),
            "peak_rss_mib": peak_rss_mib(),
        }
    )


def import_published(path: Path) -> type:
    """The published `GPT` class from a faster-trajectory-transformer work tree at `path`.

    Its `trajectory.models.gpt` package imports the trainer too, which needs wandb,
    stable-baselines3, gym and d4rl; a stand-in package module (with the real directory as
    its path) skips that `__init__` and loads only the model's own modules.
    """
    root = Path(path).resolve()
    package_dir = root / "trajectory" / "models" / "gpt"
    if not (package_dir / "gpt.py").is_file():
        raise SystemExit(f"--published {path}: no trajectory/models/gpt/gpt.py under it")
    sys.path.insert(0, str(root))
    package = types.ModuleType("trajectory.models.gpt")
    package.__path__ = [str(package_dir)]
    sys.modules["trajectory.models.gpt"] = package
    return importlib.import_module("trajectory.models.gpt.gpt").GPT


def published_decay_groups(model: torch.nn.Module) -> list[dict]:
    """Its optimiser's parameter groups, from its own `weight_decay_groups`."""
    common = importlib.import_module("trajectory.utils.common")
    ein = importlib.import_module("trajectory.models.gpt.ein_linear")
    groups = common.weight_decay_groups(
        model=model,
        whitelist_modules=(torch.nn.Linear, torch.nn.MultiheadAttention, ein.EinLinear),
        blacklist_modules=(torch.nn.LayerNorm, torch.nn.Embedding),
        blacklist_named=("pos_emb",),
    )
    decay = PUBLISHED_TRAINING["decay"]
    return [
        {"params": groups["decay"], "weight_decay": decay},
        {"params": groups["nodecay"], "weight_decay": 0.0},
    ]


def bench_published(
    path: Path,
    name: str,
    steps: int,
    warmup: int,
    device: torch.device,
    batch_size: int | None,
    memory: bool,
) -> dict:
    config, preset_batch = PRESETS[name]
    batch_size = batch_size or preset_batch
    gpt_class = import_published(path)
    T, p = config.transition_dim, config.dropout
    torch.manual_seed(0)
    model = gpt_class(
        vocab_size=config.n_bins,
        transition_dim=T,
        observation_dim=config.observation_dim,
        action_dim=config.action_dim,
        seq_len=config.block_size,
        embedding_dim=config.embedding_dim,
        num_layers=config.n_layer,
        num_heads=config.n_head,
        embedding_dropout=p,
        residual_dropout=p,
        attention_dropout=p,
        use_sep_heads=True,  # as its MuJoCo configs: one head per transition dimension
    ).to(device)
    model.train()
    optimizer = torch.optim.AdamW(
        published_decay_groups(model),
        lr=PUBLISHED_TRAINING["lr"],
        betas=PUBLISHED_TRAINING["betas"],
    )
    # Its loss: per-token cross-entropy weighted by the target's dimension (actions x5),
    # times the padding mask, averaged over every position.
    weights = torch.ones(T, device=device)
    weights[config.observation_dim : config.observation_dim + config.action_dim] = (
        PUBLISHED_TRAINING["action_weight"]
    )
    weights = weights.repeat(config.sequence_transitions)[1:]  # (block - 1,), by target
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        joined = torch.randint(config.n_bins, (batch_size, config.block_size), generator=generator)
        joined = joined.to(device)
        tokens, targets = joined[:, :-1], joined[:, 1:]
        pad_mask = torch.ones(targets.shape, device=device)
        logits, _ = model(tokens)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none"
        )
        loss = (loss * weights.repeat(batch_size) * pad_mask.view(-1)).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return timings(
        {
            "preset": name,
            "setting": "published",
            "parameters": sum(q.numel() for q in model.parameters()),
            "batch_size": batch_size,
            "tokens_per_step": batch_size * (config.block_size - 1),
            **measure(step, steps, warmup, device, memory),
            "peak_rss_mib": peak_rss_mib(),
        }
    )


def timings(result: dict) -> dict:
    """Mean and best (fastest) step of `result["step_ms"]`, and tokens/s at each."""
    times = result["step_ms"]
    result["steps"] = len(times)
    result["ms_per_step"] = sum(times) / len(times)
    result["best_ms_per_step"] = min(times)
    result["tokens_per_s"] = 1000 * result["tokens_per_step"] / result["ms_per_step"]
    result["best_tokens_per_s"] = 1000 * result["tokens_per_step"] / result["best_ms_per_step"]
    return result


def merge(rounds: list[dict]) -> dict:
    """One setting's results from several rounds: every step's time, the highest memory."""
    merged = dict(rounds[0], step_ms=[t for r in rounds for t in r["step_ms"]])
    for key in ("step_peak_mib", "peak_rss_mib"):
        if key in merged:
            merged[key] = max(r[key] for r in rounds)
    merged["rounds"] = len(rounds)
    return timings(merged)


def settings_of(args: argparse.Namespace) -> list[Setting]:
    axes = {
        "checkpointing": args.checkpointing.split(","),
        "precision": args.precision.split(","),
        "compile": [{"off": False, "on": True}[v] for v in args.compile.split(",")],
        "sdpa": [{"model": False, "sdpa": True}[v] for v in args.attention.split(",")],
    }
    if args.grid == "cross":
        return [Setting(*values) for values in itertools.product(*axes.values())]
    base = Setting(**{axis: values[0] for axis, values in axes.items()})
    settings = [base]
    for axis, values in axes.items():
        settings += [dataclasses.replace(base, **{axis: v}) for v in values[1:]]
    return settings


def run_isolated(args: argparse.Namespace, name: str, setting: Setting | None) -> list[dict]:
    """One setting (None: the published model) in a fresh process; its results."""
    command = [
        sys.executable,
        __file__,
        "--preset",
        name,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--device",
        args.device,
    ]
    if args.batch_size:
        command += ["--batch-size", str(args.batch_size)]
    if args.no_memory:
        command.append("--no-memory")
    if setting is None:
        command += ["--published", str(args.published), "--published-only"]
    else:
        command += [
            "--checkpointing",
            setting.checkpointing,
            "--precision",
            setting.precision,
            "--compile",
            "on" if setting.compile else "off",
            "--attention",
            "sdpa" if setting.sdpa else "model",
        ]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["results"]


def describe(result: dict) -> str:
    setting = result["setting"]
    label = setting if isinstance(setting, str) else Setting(**setting).label()
    line = (
        f"{result['preset']:6s} {label:39s} {result['parameters']:>9,} params  "
        f"batch {result['batch_size']}  {result['ms_per_step']:8.1f} ms/step "
        f"(best {result['best_ms_per_step']:.1f})  {result['tokens_per_s']:>9,.0f} tokens/s"
    )
    if "step_peak_mib" in result:
        line += f"  step peak {result['step_peak_mib']:7.0f} MiB"
    line += f"  peak RSS {result['peak_rss_mib']:.0f} MiB"
    if "speedup_vs_published" in result:
        line += f"  {result['speedup_vs_published']:.2f}x published"
        line += f" (best {result['best_speedup_vs_published']:.2f}x)"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--preset", choices=[*PRESETS, "all"], default="all")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per setting")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, help="instead of the preset's batch")
    parser.add_argument(
        "--checkpointing", default="none", help="comma list of none, full, selective"
    )
    parser.add_argument("--precision", default="fp32", help="comma list of fp32, bf16")
    parser.add_argument("--compile", default="off", help="comma list of off, on")
    parser.add_argument(
        "--attention",
        default="model",
        help="comma list of model, sdpa: the CPU training attention, or\n"
        "F.scaled_dot_product_attention (SDPA's math path: the model before its own)",
    )
    parser.add_argument(
        "--grid",
        choices=["axes", "cross"],
        default="axes",
        help="axes: the first values, then one axis changed at a time; cross: every setting",
    )
    parser.add_argument("--isolate", action="store_true", help="each setting in its own process")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds over every setting (and the published model), interleaved, so that a\n"
        "busy spell of the machine does not fall on one setting; steps of all rounds pooled",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the CPU memory step")
    parser.add_argument("--published", type=Path, help="faster-trajectory-transformer work tree")
    parser.add_argument("--published-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = torch.device(args.device)
    names = list(PRESETS) if args.preset == "all" else [args.preset]
    settings = [] if args.published_only else settings_of(args)
    memory = not args.no_memory
    jobs: list[Setting | None] = [*settings, *([None] if args.published else [])]
    results = []
    for name in names:

        def run(job: Setting | None, name: str = name) -> dict:
            if args.isolate:
                return run_isolated(args, name, job)[0]
            if job is None:
                return bench_published(
                    args.published, name, args.steps, args.warmup, device, args.batch_size, memory
                )
            return bench(name, job, args.steps, args.warmup, device, args.batch_size, memory)

        rounds: list[list[dict]] = [[] for _ in jobs]
        for _ in range(args.repeat):
            for i, job in enumerate(jobs):
                rounds[i].append(run(job))
                print(describe(rounds[i][-1]), flush=True)
        found = [merge(r) for r in rounds]
        if args.published:
            published = found[-1]
            for result in found[:-1]:
                result["speedup_vs_published"] = published["ms_per_step"] / result["ms_per_step"]
                result["best_speedup_vs_published"] = (
                    published["best_ms_per_step"] / result["best_ms_per_step"]
                )
        if args.repeat > 1 or args.published:
            print("all rounds:" if args.repeat > 1 else "against the published model:")
            for result in found:
                print(f"  {describe(result)}")
        results += found
    machine = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(device)
    print(json.dumps({"machine": machine, "results": results}))


if __name__ == "__main__":
    main()
