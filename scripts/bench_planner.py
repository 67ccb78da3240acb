"""Time whole beam-search plan calls on a random-weight model sized by flags.

    python scripts/bench_planner.py                 # paper HalfCheetah settings, 1 env, cached
    python scripts/bench_planner.py --envs 10
    python scripts/bench_planner.py --naive --reps 1
    python scripts/bench_planner.py --compare-torch  # native CPU kernel vs PyTorch, alternated
    python scripts/bench_planner.py --contend 1      # next to one busy process

`--contend N` starts N busy processes (Python spin loops) before the warm-up and stops them
after the timed calls: the planner's speed on a machine shared with other jobs.

Prints a short summary, then as its last line one JSON object with `ms_per_plan`,
`ms_per_env_step` (= ms_per_plan / envs), the settings, the matmul FLOPs of one plan call
(counted analytically), the achieved GFLOP/s, and the bytes of cached keys and values that the
decode steps' attention reads (with each env's context shared by its beams, as the planner
does, and as it would be with a copy of the context per beam).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import trajectory_transformer  # first: sets the OpenMP wait before torch loads

# isort: split
import numpy as np
import torch
from bench_common import (
    add_model_flags,
    add_search_flags,
    model_config,
    planning_precision,
    search_settings,
)
from torch.utils._python_dispatch import TorchDispatchMode

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.model import GPTConfig, TrajectoryGPT
from trajectory_transformer.model.decode import fused, native
from trajectory_transformer.planning import BeamPlanner, PlannerConfig, naive_plan


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--obs", type=int, default=17, help="observation dimensions")
    parser.add_argument("--act", type=int, default=6, help="action dimensions")
    add_model_flags(parser)
    add_search_flags(parser)
    parser.add_argument("--envs", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5, help="timed plan calls")
    parser.add_argument("--warmup", type=int, default=1, help="untimed plan calls first")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--naive", action="store_true", help="time the naive planner instead")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--no-native", action="store_true", help="decode without the native CPU kernel"
    )
    parser.add_argument(
        "--contend", type=int, default=0, help="busy processes running during the measurement"
    )
    parser.add_argument(
        "--compare-torch",
        action="store_true",
        help="alternate plan calls with and without the native CPU kernel in this process",
    )
    parser.add_argument(
        "--count-operators",
        action="store_true",
        help="count the ATen operators of one plan call, inside the decode steps and around them",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="profile one plan call (after the warm-up) and print its N costliest kernels",
    )
    parser.add_argument(
        "--compare-decodes",
        default=None,
        help="alternate plan calls of these decode paths (planner.decode/planner.cuda_graph) "
        "in this process, e.g. eager/none,eager/step,compile/search,eager/step+bf16 (+bf16: "
        "under bfloat16 autocast; +tf32: float32 matrix products in TF32 on CUDA; +mlp32: the "
        "fused step's MLP kernel over tiles of 32 rows with eight warps); with "
        "--greedy, also whether each plans what the first does",
    )
    return parser.parse_args()


def planner_with_history(
    model: TrajectoryGPT, discretizer: Discretizer, settings: dict, history: torch.Tensor
) -> BeamPlanner:
    """A planner over `model` with `settings`, each of its envs given its row of `history`
    (envs, context transitions, T) as its past real transitions."""
    planner = BeamPlanner(model, discretizer, **settings)
    planner.reset(history.shape[0])
    for env, transitions in enumerate(history):
        planner.set_history(env, transitions)
    return planner


def plan_flops(model: GPTConfig, planner: PlannerConfig, envs: int) -> int:
    """Matmul FLOPs of one cached plan call with a full context (2 per multiply-add).

    Per token and layer: projections q, k, v, out (4 d^2 MACs), MLP (8 d^2), attention scores
    and weighted values over the `length` visible keys (2 d length); per token one d x N head.
    The prefill computes heads at every context position, as `TrajectoryGPT.prefill` does.
    """
    d, L, N = model.embedding_dim, model.n_layer, model.n_bins
    O, A, T = model.observation_dim, model.action_dim, model.transition_dim  # noqa: E741
    B, X, H = planner.beam_width, planner.n_expand, planner.horizon

    def token(length: int) -> int:  # one token attending over `length` keys
        return 2 * (L * (12 * d * d + 2 * d * length) + d * N)

    context = planner.context_transitions * T + O
    macs = envs * sum(token(i + 1) for i in range(context))
    base = planner.context_transitions * T
    for h in range(H):
        p = base + h * T + O  # first action token
        macs += envs * B * X * sum(token(p + j + 1) for j in range(A + 1))
        if h < H - 1:  # value token and the next observation, on the survivors
            macs += envs * B * sum(token(p + A + 2 + i) for i in range(O + 1))
    return macs


def attention_kv_bytes(
    model: GPTConfig, planner: PlannerConfig, envs: int, shared: bool = True
) -> int:
    """Bytes of cached keys and values (float32) read by the attention of one plan call's
    decode steps, with a full context; the context prefill is left out.

    Shared: each env's context (the shared prefix) is read once per env and step, and each row
    reads only its own planned keys. Unshared: every row reads the whole sequence.
    """
    d, L = model.embedding_dim, model.n_layer
    O, A, T = model.observation_dim, model.action_dim, model.transition_dim  # noqa: E741
    B, X, H = planner.beam_width, planner.n_expand, planner.horizon
    context = planner.context_transitions * T + O
    per_key = L * 2 * d * 4  # keys and values of every layer, float32

    def step(rows: int, position: int) -> int:  # one token at `position` on `rows` rows
        if shared:
            return per_key * (envs * context + rows * (position + 1 - context))
        return per_key * rows * (position + 1)

    total = 0
    base = planner.context_transitions * T
    for h in range(H):
        p = base + h * T + O  # first action token
        total += sum(step(envs * B * X, p + j) for j in range(A + 1))
        if h < H - 1:  # value token and the next observation, on the survivors
            total += sum(step(envs * B, p + A + 1 + i) for i in range(O + 1))
    return total


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` processes that spin on a core each until the block ends."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    gpt = model_config(args, args.obs, args.act)
    model = TrajectoryGPT(gpt).to(device).eval()
    T = gpt.transition_dim
    data = np.random.default_rng(args.seed).normal(size=(2000, T))
    discretizer = Discretizer.fit(data, n_bins=args.bins).to(device)
    # A full history of random real transitions for every env (what a running rollout has).
    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.envs, args.context, model.config.transition_dim)
    history = torch.randint(0, args.bins, shape, generator=generator)
    planner = planner_with_history(model, discretizer, search_settings(args), history)
    observations = torch.randn(args.envs, args.obs, generator=generator)
    if args.compare_decodes:
        compare_decodes(args, model, discretizer, history, observations.to(device))
        return
    if args.count_operators:
        count_operators(planner, observations)
        return
    if args.profile:
        profile_plan(planner, observations.to(device), args.warmup, args.profile)
        return

    if args.naive:
        contexts = planner.context_tokens(observations)

        def plan() -> None:
            naive_plan(model, discretizer, contexts, planner.config, planner.generators[0])

    else:

        def plan() -> None:
            planner.plan(observations)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(use_native: bool) -> float:
        with native.native_kernels(use_native):
            sync()
            start = time.perf_counter()
            plan()
            sync()
            return time.perf_counter() - start

    use_native = not args.no_native and device.type == "cpu"
    if use_native and native.kernels() is None:
        raise SystemExit("the native kernel is unavailable here; run with --no-native")
    variants = [use_native, False] if args.compare_torch and use_native else [use_native]
    load = os.getloadavg()
    times: dict[bool, list[float]] = {variant: [] for variant in variants}
    with busy_processes(args.contend):
        for _ in range(args.warmup):
            for variant in variants:
                timed(variant)
        for _ in range(args.reps):  # alternated, so both see the same machine load
            for variant in variants:
                times[variant].append(timed(variant))
    ms = 1e3 * float(np.median(times[use_native]))
    flops = plan_flops(gpt, planner.config, args.envs)
    kv_bytes = attention_kv_bytes(gpt, planner.config, args.envs)
    kv_bytes_unshared = attention_kv_bytes(gpt, planner.config, args.envs, shared=False)
    result = {
        "planner": "naive" if args.naive else "cached",
        "ms_per_plan": round(ms, 2),
        "ms_per_env_step": round(ms / args.envs, 2),
        "ms_per_plan_min": round(1e3 * min(times[use_native]), 2),
        "native_kernel": use_native and not args.naive,
        "flops_per_plan": flops,  # the cached planner's work, also for --naive
        "gflops_per_s": round(flops / (ms * 1e6), 2),
        "kv_bytes_per_plan": kv_bytes,  # attention reads of the cached planner's decode steps
        "kv_bytes_per_plan_unshared": kv_bytes_unshared,  # with the context copied per beam
        "kv_gb_per_s": round(kv_bytes / (ms * 1e6), 2),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "wait_policy": trajectory_transformer.threads.wait_policy,  # how OpenMP workers wait
        "load_average": [round(x, 2) for x in load],  # before the busy processes started
        "reps": args.reps,
        **{k: v for k, v in vars(args).items() if k not in ("naive", "reps", "device", "threads")},
    }
    if len(variants) == 2:
        ms_torch = 1e3 * float(np.median(times[False]))
        result["ms_per_plan_torch"] = round(ms_torch, 2)
        result["speedup_native"] = round(ms_torch / ms, 3)
    print(
        f"{result['planner']} planner, {args.envs} env(s), beam {args.beam} x expand "
        f"{args.expand}, horizon {args.horizon}, context {args.context} on {device} "
        f"({torch.get_num_threads()} threads, {args.contend} busy processes beside): "
        f"{ms:.1f} ms per plan (median of {args.reps}), "
        f"{ms / args.envs:.1f} ms per env step, {flops / 1e9:.2f} GFLOP per plan "
        f"(cached-path count) = {flops / (ms * 1e6):.1f} GFLOP/s; attention reads "
        f"{kv_bytes / 1e9:.2f} GB of cached keys/values ({kv_bytes_unshared / 1e9:.2f} GB "
        "without the shared context)"
    )
    if len(variants) == 2:
        print(
            f"without the native kernel: {result['ms_per_plan_torch']:.1f} ms per plan, so the "
            f"kernel is {result['speedup_native']:.2f}x faster (medians, calls alternated)"
        )
    print(json.dumps(result))


class OperatorCount(TorchDispatchMode):
    """Counts the ATen operators that run while it is active (views included)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_operators(planner: BeamPlanner, observations: torch.Tensor) -> None:
    """The ATen operators of one plan call (after a warm-up call), inside its decode steps and
    around them: on a GPU each is a launch unless it is captured. Counted on the PyTorch path
    (no native kernels), uncaptured."""
    inside = collections.Counter()
    step_of = planner._step

    def counted_step(cache):
        step = step_of(cache)

        def step_counted(tokens, position):
            with OperatorCount() as count:
                logits = step(tokens, position)
            inside.update(count.counts)
            return logits

        return step_counted

    planner.cuda_graph = "none"
    with native.native_kernels(False):
        planner.plan(observations)
        planner._step = counted_step
        with OperatorCount() as total:
            planner.plan(observations)
    n_total, n_inside = sum(total.counts.values()), sum(inside.values())
    around = total.counts - inside
    print(
        f"{planner.num_envs} env(s): {n_total} operators per plan call, {n_inside} in the decode "
        f"steps, {n_total - n_inside} around them; most common around: "
        + ", ".join(f"{name} {count}" for name, count in around.most_common(8))
    )
    print(json.dumps({"envs": planner.num_envs, "operators": n_total, "in_decode": n_inside}))


def profile_plan(planner: BeamPlanner, observations: torch.Tensor, warmup: int, top: int) -> None:
    """One plan call under the PyTorch profiler, after `warmup` calls (captures and compiles
    happen there): how many kernels it launched, their summed device time against the call's
    wall time (a call launch-bound on a GPU spends far longer than its kernels), and the `top`
    costliest operators by device time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = observations.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for _ in range(max(warmup, 1)):
        planner.plan(observations)
    if cuda:
        torch.cuda.synchronize(observations.device)
    with profile(activities=activities) as profiler:
        start = time.perf_counter()
        planner.plan(observations)
        if cuda:
            torch.cuda.synchronize(observations.device)
        wall = time.perf_counter() - start
    events = profiler.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_ms = sum(e.device_time for e in kernels) / 1e3
    sort_by = "device_time_total" if cuda else "cpu_time_total"
    print(profiler.key_averages().table(sort_by=sort_by, row_limit=top, max_name_column_width=60))
    c = planner.config
    print(
        f"{planner.num_envs} env(s), {c.decode}/{planner.cuda_graph}: {1e3 * wall:.1f} ms per "
        f"plan call under the profiler, {len(kernels)} kernels taking {kernel_ms:.1f} ms of "
        "device time"
    )
    print(
        json.dumps(
            {
                "envs": planner.num_envs,
                "decode": f"{c.decode}/{planner.cuda_graph}",
                "ms_per_plan_profiled": round(1e3 * wall, 2),
                "kernels": len(kernels),
                "kernel_ms": round(kernel_ms, 2),
            }
        )
    )


def compare_decodes(
    args: argparse.Namespace,
    model: TrajectoryGPT,
    discretizer: Discretizer,
    history: torch.Tensor,
    observations: torch.Tensor,
) -> None:
    """Time the decode paths of `--compare-decodes` alternately, one planner each over the
    same model and contexts; with --greedy, compare each one's best plans with the first's."""
    device = observations.device
    variants = [name.strip() for name in args.compare_decodes.split(",") if name.strip()]
    planners, precisions, mlp_tiles = {}, {}, {}
    for name in variants:
        path, *options = name.split("+")
        precision = next((o for o in options if o in ("bf16", "tf32")), "")
        if unknown := set(options) - {"bf16", "tf32", "mlp32"}:
            raise SystemExit(f"{name}: after + come bf16, tf32 or mlp32, not {sorted(unknown)}")
        decode, _, cuda_graph = path.partition("/")
        settings = search_settings(args) | {"decode": decode, "cuda_graph": cuda_graph or "none"}
        planners[name] = planner_with_history(model, discretizer, settings, history)
        precisions[name] = planning_precision(precision, device)
        # Read by the fused step at each call (and kept by a CUDA graph captured in it).
        mlp_tiles[name] = (32, 8) if "mlp32" in options else (fused.MLP_ROWS, fused.MLP_WARPS)

    def timed(name: str):
        planner = planners[name]
        for generator in planner.generators:  # the same draws in every call and variant
            generator.manual_seed(args.seed)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fused.MLP_ROWS, fused.MLP_WARPS = mlp_tiles[name]
        with precisions[name]:
            plan = planner.plan(observations)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, plan

    first_call = {}  # captures, compiles, warms up; said as it ends, since it can take minutes
    for name in variants:
        first_call[name] = timed(name)[0]
        print(f"{name}: first call {first_call[name]:.1f} s", file=sys.stderr, flush=True)
    for _ in range(args.warmup):
        for name in variants:
            timed(name)
    times: dict[str, list[float]] = {name: [] for name in variants}
    plans = {}
    for _ in range(args.reps):
        for name in variants:
            seconds, plans[name] = timed(name)
            times[name].append(seconds)
    reference = plans[variants[0]]
    flops = plan_flops(model.config, planners[variants[0]].config, args.envs)
    results = []
    for name in variants:
        ms = 1e3 * float(np.median(times[name]))
        plan = plans[name]
        same = (plan.tokens[:, 0] == reference.tokens[:, 0]).flatten(1).all(dim=1)
        results.append(
            {
                "decode": name,
                "ms_per_plan": round(ms, 3),
                "ms_per_env_step": round(ms / args.envs, 4),
                "ms_first_call": round(1e3 * first_call[name], 1),
                "gflops_per_s": round(flops / (ms * 1e6), 1),
                "best_plan_as_first": round(float(same.float().mean()), 4),
                "max_score_difference": float((plan.scores - reference.scores).abs().max()),
            }
        )
        print(
            f"{name:>18}: {ms:8.2f} ms per plan of {args.envs} env(s) (median of {args.reps}; "
            f"first call {1e3 * first_call[name]:.0f} ms), {flops / (ms * 1e6):.0f} GFLOP/s; "
            f"best plan as {variants[0]}'s in {100 * results[-1]['best_plan_as_first']:.1f}% of "
            f"envs",
            flush=True,
        )
    summary = {"device": str(device), "envs": args.envs, "greedy": args.greedy}
    summary |= {"flops_per_plan": flops, "variants": results}
    summary |= {k: v for k, v in vars(args).items() if k not in summary}
    if device.type == "cuda":
        summary["gpu"] = torch.cuda.get_device_name(device)
        summary["peak_cuda_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
