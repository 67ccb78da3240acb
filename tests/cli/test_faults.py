"""Faults a real run meets: a process killed at any moment, during training, while a checkpoint
is written, or in the middle of a comparison. Each resumes as if nothing had happened."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import TINY_TRAINING, create_dataset

from trajectory_transformer.checkpoint import load_checkpoint, read_payload

STEPS = 60


def start_training(run_dir: Path, *overrides: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "trajectory_transformer.cli.train",
        *TINY_TRAINING,
        f"trainer.max_steps={STEPS}",
        "trainer.log_every=1",
        "trainer.checkpoint_every=7",
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "train/loss" in record:
            steps.append(record["step"])
    return steps


def kill_after(process: subprocess.Popen, run_dir: Path, step: int) -> None:
    """SIGKILL the run once it has logged `step` (or has ended)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if max(logged_steps(run_dir), default=0) >= step:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def test_killed_three_times_the_run_resumes_to_its_planned_end_without_repeated_steps(tmp_path):
    create_dataset("test/tiny-v0")
    run_dir = tmp_path / "run"
    checkpoint = run_dir / "checkpoint.pt"
    rng = random.Random(7)
    kills = sorted(rng.sample(range(8, STEPS - 5), 3))
    for kill_at in kills:
        resume = [f"resume={checkpoint}"] if checkpoint.exists() else []
        kill_after(start_training(run_dir, *resume), run_dir, kill_at)
        # A few steps may pass between the poll and the kill, and one may checkpoint.
        state = read_payload(checkpoint)["training"]
        assert not state["finished"] and state["step"] <= max(logged_steps(run_dir))
    process = start_training(run_dir, f"resume={checkpoint}")
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    final = read_payload(checkpoint)["training"]
    assert final["finished"] and final["step"] == STEPS
    load_checkpoint(checkpoint)
    assert logged_steps(run_dir) == list(range(1, STEPS + 1))


def test_a_kill_while_a_checkpoint_is_written_keeps_the_previous_one(tmp_path):
    path = tmp_path / "checkpoint.pt"
    writer = (
        "import os, sys, time, torch\n"
        "from trajectory_transformer.checkpoint import save_atomic\n"
        "path = sys.argv[1]\n"
        "save_atomic({'version': 1}, path)\n"
        "os.fsync = lambda fd: (print('writing', flush=True), time.sleep(60))\n"
        "save_atomic({'version': 2, 'weights': torch.zeros(1000)}, path)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", writer, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "writing\n"  # the second file is half done
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert torch.load(path, weights_only=True) == {"version": 1}


def test_a_comparison_killed_mid_interim_runs_no_finished_job_again(tmp_path):
    from test_compare_cli import TINY_COMPARISON

    create_dataset("test/tiny-v0")
    settings = [s for s in TINY_COMPARISON if s != "~compare.agents.narrow"] + ["compare.n=2"]
    command = [
        sys.executable,
        "-m",
        "trajectory_transformer.cli.compare",
        *settings,
        f"hydra.run.dir={tmp_path}",
    ]
    # Its own process group: the kill takes the launcher's job processes with it, as a crash
    # or a killed batch job would.
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    evaluations = tmp_path / "evaluations"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if len(list(evaluations.glob("*/*/results.json"))) >= 2:
            break
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    finished = {
        path: path.stat().st_mtime_ns
        for path in [
            *evaluations.glob("*/*/results.json"),
            *tmp_path.glob("trainings/*/*/checkpoint.pt"),
        ]
    }
    assert 2 <= len(finished) < 2 + 6  # two trainings, six evaluations: killed midway

    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    state = json.loads((tmp_path / "compare.json").read_text())
    assert state["finished"]
    for path, written in finished.items():  # nothing that had finished ran again
        assert path.stat().st_mtime_ns == written, path
    assert len(list(evaluations.glob("*/*/results.json"))) == 6
