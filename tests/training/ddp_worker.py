"""One rank of a tiny data-parallel run, started by torchrun from test_distributed.py.

    torchrun --nproc-per-node=2 ddp_worker.py OUT_DIR --steps 25 [--dropout 0.1]
        [--stop-at 10] [--resume CHECKPOINT] [--validate]

Rank 0 writes OUT_DIR/checkpoint.pt and OUT_DIR/metrics.json (what it logged).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for conftest
from conftest import tiny_training, tiny_training_info

from trajectory_transformer.checkpoint import build_payload, save_atomic
from trajectory_transformer.model import TrajectoryGPT
from trajectory_transformer.training.distributed import Distributed
from trajectory_transformer.training.trainer import Trainer


def build(steps: int, dropout: float, validate: bool):
    """The tiny model and data; with `validate`, the last 60 windows' episodes held out."""
    _, windows, discretizer, cfg = tiny_training(max_steps=steps)
    torch.manual_seed(0)
    model = TrajectoryGPT(replace(_.config, dropout=dropout))
    validation = None
    if validate:
        cfg = replace(cfg, validate_every=5, eval_every=10)
        validation = windows  # scored, never trained on here: what matters is the sum
    return model, windows, discretizer, cfg, validation


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--stop-at", type=int)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--single", action="store_true", help="one process, no torchrun")
    args = parser.parse_args()
    if args.single:
        dist = Distributed.single()
    else:
        dist = Distributed.from_environment(torch.device("cpu"), timeout_s=60)
    model, windows, discretizer, cfg, validation = build(args.steps, args.dropout, args.validate)
    if dist.rank > 0:
        torch.manual_seed(1000 + dist.rank)

    def save(state: dict, name: str = "checkpoint.pt") -> Path:
        payload = build_payload(model, discretizer, tiny_training_info(), {}, state)
        return save_atomic(payload, args.out / name)

    def evaluate(model: TrajectoryGPT) -> tuple[float, dict]:
        time.sleep(0.5)  # the other ranks wait for this without a timeout
        score = float(sum(p.sum() for p in model.parameters()))
        return score, {"eval/score": score}

    metrics: list[dict] = []
    trainer = Trainer(
        model,
        windows,
        cfg,
        save,
        seed=0,
        progress=False,
        validation=validation,
        evaluate=evaluate if dist.is_main else None,
        dist=dist,
        log=lambda m, step: metrics.append(m | {"step": step}),
    )
    if args.stop_at is not None and dist.is_main:
        log = trainer.log
        trainer.log = lambda m, step: (
            log(m, step),
            step == args.stop_at and trainer.request_stop(),
        )
    if args.resume is not None:
        payload = torch.load(args.resume, weights_only=True)
        model.load_state_dict(payload["model"])
        trainer.load_state(payload["training"])
    try:
        trainer.train()
    except KeyboardInterrupt:
        pass
    finally:
        if dist.is_main:
            (args.out / "metrics.json").write_text(json.dumps(metrics))
        dist.close()


if __name__ == "__main__":
    main()
