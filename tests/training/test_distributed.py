"""Data-parallel training: two gloo ranks on the CPU, started by torchrun, against one process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ddp_worker.py")


def run(out: Path, *args: str, ranks: int = 2) -> dict:
    """Run the worker (under torchrun with `ranks` processes, or alone with ranks=1); return
    rank 0's checkpoint payload and its logged metrics."""
    out.mkdir(parents=True, exist_ok=True)
    if ranks == 1:
        command = [sys.executable, str(WORKER), str(out), "--single", *args]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(WORKER),
            str(out),
            *args,
        ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    payload = torch.load(out / "checkpoint.pt", weights_only=True)
    payload["metrics"] = json.loads((out / "metrics.json").read_text())
    return payload


def assert_close_weights(a: dict, b: dict, **tolerance) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name, **tolerance)


def without_key_biases(weights: dict) -> dict:
    """The weights without the key projection's bias. Adding one vector to every key shifts
    all of a query's logits alike, which softmax ignores: that bias's gradient is zero up to
    rounding, so Adam steps it by rounding noise, which differs with the reduction order."""
    kept = dict(weights)
    for name, value in weights.items():
        if name.endswith("attn.c_attn.bias"):
            width = len(value) // 3  # query | key | value
            kept[name] = torch.cat([value[:width], value[2 * width :]])
    return kept


def test_two_ranks_take_the_steps_of_one_process_on_the_whole_batch(tmp_path):
    # 25 steps of 16 windows cross an epoch's end (300 windows), whose last batch of 12 is
    # split 6 and 6 with different numbers of padding tokens: the loss is normalised by the
    # global batch's count, so the ranks' gradients still add up to the whole batch's.
    one = run(tmp_path / "one", "--validate", ranks=1)
    two = run(tmp_path / "two", "--validate")
    assert two["training"]["step"] == one["training"]["step"] == 25
    assert_close_weights(
        without_key_biases(one["model"]), without_key_biases(two["model"]), rtol=1e-4, atol=1e-5
    )
    # The validation loss is summed over the ranks' parts of the validation sample, and the
    # planner evaluation ran on rank 0 while rank 1 waited.
    for a, b in zip(one["metrics"], two["metrics"], strict=True):
        assert a.keys() == b.keys()
        for key in ("train/loss", "val/loss", "val/action_ce", "eval/score"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), (key, a["step"])
    assert {m["step"] for m in two["metrics"] if "eval/score" in m} == {10, 20, 25}


def test_a_resumed_two_rank_run_continues_exactly(tmp_path):
    # Dropout on: each rank's dropout generator is saved in the checkpoint and restored.
    whole = run(tmp_path / "whole", "--dropout", "0.1")
    stopped = run(tmp_path / "stopped", "--dropout", "0.1", "--stop-at", "10")
    assert stopped["training"]["step"] == 10 and len(stopped["training"]["rank_rng_states"]) == 2
    resumed = run(
        tmp_path / "resumed",
        "--dropout",
        "0.1",
        "--resume",
        str(tmp_path / "stopped" / "checkpoint.pt"),
    )
    assert resumed["training"]["step"] == 25
    assert_close_weights(whole["model"], resumed["model"], rtol=1e-6, atol=1e-7)
