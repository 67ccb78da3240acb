"""End-to-end rollout speed: the beam planner driving N envs of a MuJoCo task through `evaluate`.

    python scripts/bench_rollout.py                         # HalfCheetah-v5, 1 env, 20 steps
    python scripts/bench_rollout.py --envs 1,5,25,100 --steps 50
    python scripts/bench_rollout.py --device cuda --envs 1,10,100 --steps 200
    python scripts/bench_rollout.py --checkpoint outputs/demo/checkpoint.pt --envs 10

Each setting plays one episode per env, cut at `--steps` env-steps by the env's time limit,
through the library's evaluation loop (`evaluation.evaluate` with a `BeamPlanner`, as tt-eval
runs it), after one untimed plan call, and on CUDA after `--warmup-steps` (context + 1)
untimed steps in envs of their own: a captured search is captured once per number of envs and
history length, and this plays every history length once first (the time it took is
`warmup_s`). Without `--checkpoint` the model has the paper's
HalfCheetah shape (4 layers, 4 heads, 128 wide, a window of 10 transitions, 100 bins) with
random weights, and its discretizer is fitted to a short rollout of uniformly random actions
in the env (rewards, and reward-to-go values with discount 0.99), so that the planned tokens
decode to values in the env's range. The search defaults to the paper's HalfCheetah settings
(beam 32, expand 2, horizon 5, context 5).

Reported per setting: env-steps per second of the whole loop (planning and env), planning ms
per env-step, and peak memory: the process's RSS high-water mark on the CPU, and
`torch.cuda.max_memory_allocated` on CUDA (the RSS too). With several env counts every
setting runs in a fresh process (this script, for that one count), so the RSS of one does not
carry over to the next; `--same-process` keeps them in one. The last line is a JSON list with
one object per setting; the load average of the machine at the start of each setting is in it,
since other jobs on a shared machine move the times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import trajectory_transformer  # noqa: F401  first: sets the OpenMP wait policy before torch loads

# isort: split
import gymnasium as gym
import numpy as np
import torch
from bench_common import (
    add_model_flags,
    add_precision_flags,
    add_search_flags,
    model_config,
    peak_rss_mib,
    planning_precision,
    precision_flag,
    search_settings,
)

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.episodes import reward_to_go
from trajectory_transformer.data.minari_source import DatasetInfo
from trajectory_transformer.evaluation import evaluate, make_vector_env
from trajectory_transformer.model import TrajectoryGPT
from trajectory_transformer.model.decode import native
from trajectory_transformer.planning import BeamPlanner

DEFAULT_ENV = "HalfCheetah-v5"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--env",
        default=None,
        help=f"gymnasium id (default {DEFAULT_ENV}, or the checkpoint's own env)",
    )
    parser.add_argument("--envs", default="1", help="env counts, comma separated: 1,5,25,100")
    parser.add_argument("--steps", type=int, default=20, help="env-steps per env (M)")
    parser.add_argument("--checkpoint", default=None, help="plan with this checkpoint's model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--seed", type=int, default=0)
    add_search_flags(parser)
    add_precision_flags(parser)
    add_model_flags(parser)
    parser.add_argument(
        "--fit-steps", type=int, default=2000, help="random-action steps the discretizer is fit to"
    )
    parser.add_argument("--no-native", action="store_true", help="plan without the CPU kernels")
    parser.add_argument(
        "--same-process", action="store_true", help="run every env count in this process"
    )
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        help="untimed env-steps per env played first (default: on CUDA context + 1, so that "
        "the search is captured at every history length before the timing; else none)",
    )
    return parser.parse_args(argv)


def env_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise SystemExit(f"--envs takes positive counts separated by commas, got {text!r}")
    return counts


def random_rollout_rows(env_id: str, steps: int, seed: int) -> tuple[np.ndarray, DatasetInfo]:
    """`obs | act | reward | value` rows of `steps` uniformly random actions in one env (its
    episodes cut by their time limit), and a DatasetInfo describing the env."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    observations, actions, rewards, lengths = [], [], [], []
    observation, _ = env.reset(seed=seed)
    length = 0
    for _ in range(steps):
        action = env.action_space.sample()
        next_observation, reward, terminated, truncated, _ = env.step(action)
        observations.append(observation)
        actions.append(action)
        rewards.append(reward)
        length += 1
        observation = next_observation
        if terminated or truncated:
            lengths.append(length)
            length = 0
            observation, _ = env.reset()
    if length:
        lengths.append(length)
    space = env.action_space
    env.close()
    rewards = np.asarray(rewards, dtype=np.float32)
    values = reward_to_go(rewards, np.asarray(lengths), discount=0.99)
    rows = np.concatenate(
        [np.asarray(observations), np.asarray(actions), rewards[:, None], values[:, None]], axis=1
    ).astype(np.float32)
    info = DatasetInfo(
        dataset_id=f"random-weights/{env_id}",
        eval_env_spec=None,
        eval_env_id=env_id,
        observation_dim=len(observations[0]),
        action_dim=len(actions[0]),
        action_low=space.low.tolist(),
        action_high=space.high.tolist(),
        ref_min_score=None,
        ref_max_score=None,
        num_episodes=len(lengths),
        num_transitions=steps,
    )
    return rows, info


def build_planner(args: argparse.Namespace, device: torch.device) -> BeamPlanner:
    search = search_settings(args)
    if args.checkpoint:
        return BeamPlanner.from_checkpoint(args.checkpoint, device=device, **search)
    rows, info = random_rollout_rows(args.env or DEFAULT_ENV, args.fit_steps, args.seed)
    torch.manual_seed(args.seed)
    config = model_config(args, info.observation_dim, info.action_dim)
    return BeamPlanner(
        TrajectoryGPT(config),
        Discretizer.fit(rows, n_bins=args.bins),
        device=device,
        action_low=info.action_low,
        action_high=info.action_high,
        dataset=info,
        **search,
    )


def run_setting(args: argparse.Namespace, envs: int) -> dict:
    """Play `envs` envs for `args.steps` steps each through `evaluate`, after the warm-up."""
    device = torch.device(args.device)
    load = os.getloadavg()
    precision = precision_flag(args)
    started = time.perf_counter()

    def phase(text: str) -> None:  # where a long setting spends its untimed part, on stderr
        print(f"  {envs} envs, {time.perf_counter() - started:7.1f} s: {text}", file=sys.stderr)

    planner = build_planner(args, device)
    phase("planner built")
    info = planner.dataset
    env_id = args.env if args.checkpoint else (args.env or DEFAULT_ENV)
    warmup_steps = args.warmup_steps
    if warmup_steps is None:
        warmup_steps = args.context + 1 if device.type == "cuda" else 0
    env = make_vector_env(info, envs, env_id, max_episode_steps=args.steps)
    phase("envs made")
    warmup_start = time.perf_counter()
    try:
        # Warm-up: builds or loads the native kernels, prepares the weights, sizes the cache,
        # compiles; and with warm-up steps, plays them in envs of their own.
        observations, _ = env.reset(seed=args.seed)
        planner.reset(envs)
        with planning_precision(precision, device):
            planner.plan(observations)
            phase("first plan call done")
            if warmup_steps:
                warmup_env = make_vector_env(info, envs, env_id, max_episode_steps=warmup_steps)
                try:
                    evaluate(planner, warmup_env, episodes=envs, seed=args.seed, progress=False)
                finally:
                    warmup_env.close()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            warmup_seconds = time.perf_counter() - warmup_start
            phase(f"warm-up done ({warmup_steps} steps); timing {args.steps} steps")
            result = evaluate(planner, env, episodes=envs, seed=args.seed, progress=False)
    finally:
        env.close()
    steps = result.env_steps
    record = {
        "envs": envs,
        "steps_per_env": args.steps,
        "env_steps": steps,
        "env_steps_per_s": round(steps / result.wall_seconds, 2),
        "planning_ms_per_env_step": round(1e3 * result.planning_seconds / steps, 2),
        "env_ms_per_env_step": round(
            1e3 * (result.wall_seconds - result.planning_seconds) / steps, 3
        ),
        "wall_s": round(result.wall_seconds, 2),
        "warmup_steps": warmup_steps,
        "warmup_s": round(warmup_seconds, 2),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "native_kernels": device.type == "cpu" and native.kernels() is not None,
        "env": env_id or info.eval_env_id,
        "model": "checkpoint" if args.checkpoint else "random weights",
        "beam": args.beam,
        "expand": args.expand,
        "horizon": args.horizon,
        "context": args.context,
        "decode": f"{planner.config.decode}/{planner.cuda_graph}",
        "precision": precision,
        "load_average": [round(x, 2) for x in load],
        "machine": platform.processor() or platform.machine(),
    }
    if device.type == "cuda":
        record["peak_cuda_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        record["gpu"] = torch.cuda.get_device_name(device)
    return record


def in_fresh_process(envs: int) -> dict:
    """This script for one env count, in a new process; its last line is the result."""
    argv = [sys.executable, __file__, *sys.argv[1:], "--envs", str(envs), "--same-process"]
    done = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])[0]


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    counts = env_counts(args.envs)
    results = []
    for envs in counts:
        if not (args.same_process or len(counts) == 1):
            results.append(in_fresh_process(envs))  # which printed its own line
            continue
        with native.native_kernels(not args.no_native):
            record = run_setting(args, envs)
        results.append(record)
        peak = f"peak RSS {record['peak_rss_mib']:.0f} MiB"
        if "peak_cuda_mib" in record:
            peak += f", peak CUDA {record['peak_cuda_mib']:.0f} MiB"
        print(
            f"{record['envs']:>4} envs x {record['steps_per_env']} steps on {record['device']} "
            f"({record['threads']} threads): {record['env_steps_per_s']:.1f} env-steps/s, "
            f"{record['planning_ms_per_env_step']:.2f} ms planning per env-step "
            f"({record['decode']} {record['precision']}), {peak} "
            f"(load {record['load_average'][0]:.2f})",
            file=sys.stderr,
            flush=True,
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
