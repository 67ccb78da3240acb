"""Training throughput: tokens per second and peak memory of the real training step.

Runs `Trainer.train_step` (forward, weighted loss, backward, clip, AdamW) on random tokens
for two shapes: the paper's HalfCheetah model and the demo's Pendulum model. The last line
of output is one JSON object with every measurement.

    python scripts/bench_train.py                 # both presets, on the default device
    python scripts/bench_train.py --preset paper --steps 30 --device cuda
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from dataclasses import asdict

import numpy as np
import torch

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.model import GPTConfig, TrajectoryGPT
from trajectory_transformer.training.trainer import Trainer, TrainerConfig

PRESETS = {
    # 17 obs + 6 act dims, 4 layers x 4 heads x 128, window 10, batch 256, N = 100.
    "paper": (GPTConfig(17, 6, 100, 10, 4, 4, 128, 0.1), 256),
    # configs/model/demo.yaml + configs/trainer/demo.yaml on Pendulum (3 obs + 1 act dims).
    "demo": (GPTConfig(3, 1, 100, 10, 3, 4, 64, 0.0), 128),
}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(name: str, steps: int, warmup: int, device: torch.device) -> dict:
    config, batch_size = PRESETS[name]
    rng = np.random.default_rng(0)
    transitions = rng.uniform(size=(20_000, config.transition_dim)).astype(np.float32)
    discretizer = Discretizer.fit(transitions, config.n_bins, "uniform")
    windows = TokenWindows(
        transitions, np.array([len(transitions)]), discretizer, config.sequence_transitions
    )
    torch.manual_seed(0)
    model = TrajectoryGPT(config).to(device)
    trainer = Trainer(
        model,
        windows,
        TrainerConfig(batch_size=batch_size, max_steps=warmup + steps),
        save=lambda state: None,
        progress=False,
    )
    model.train()
    generator = torch.Generator().manual_seed(0)

    def run(n: int) -> None:
        for _ in range(n):
            trainer.train_step(torch.randint(len(windows), (batch_size,), generator=generator))
        if device.type == "cuda":
            torch.cuda.synchronize()

    run(warmup)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run(steps)
    seconds = time.perf_counter() - start
    tokens = steps * batch_size * (config.block_size - 1)
    result = {
        "preset": name,
        "model": asdict(config),
        "parameters": model.num_parameters(),
        "batch_size": batch_size,
        "steps": steps,
        "ms_per_step": 1000 * seconds / steps,
        "tokens_per_s": tokens / seconds,
        "peak_rss_mib": peak_rss_mib(),
    }
    if device.type == "cuda":
        result["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=[*PRESETS, "all"], default="all")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per preset")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    names = list(PRESETS) if args.preset == "all" else [args.preset]
    results = []
    for name in names:
        result = bench(name, args.steps, args.warmup, device)
        results.append(result)
        print(
            f"{name:6s} {result['parameters']:>9,} params  batch {result['batch_size']}  "
            f"{result['ms_per_step']:8.1f} ms/step  {result['tokens_per_s']:>10,.0f} tokens/s  "
            f"peak RSS {result['peak_rss_mib']:.0f} MiB"
        )
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
