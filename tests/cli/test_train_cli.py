import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_TRAINING as TINY
from conftest import create_dataset, run_module


def tt_train(*overrides, run_dir, check=True):
    return run_module(
        "trajectory_transformer.cli.train",
        *TINY,
        *overrides,
        f"hydra.run.dir={run_dir}",
        timeout=120,
        check=check,
    )


def test_train_then_resume_a_finished_run_trains_no_more(tmp_path):
    create_dataset("test/tiny-v0")
    done = tt_train("trainer.max_steps=6", run_dir=tmp_path / "run")
    assert "trained 6 steps" in done.stdout, done.stdout + done.stderr
    assert "round-trip error" in done.stdout
    payload = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert payload["training"]["finished"] and payload["training"]["step"] == 6
    assert payload["config"]["dataset"]["id"] == "test/tiny-v0"
    assert payload["dataset"]["eval_env_id"] == "Pendulum-v1"
    fingerprint = payload["dataset"]["fingerprint"]  # the exact numbers it was trained on
    assert fingerprint.startswith("sha256:") and f"content {fingerprint}" in done.stdout

    resumed = tt_train(
        "trainer.max_steps=6",
        f"resume={tmp_path / 'run' / 'checkpoint.pt'}",
        run_dir=tmp_path / "again",
    )
    assert "resumed from" in resumed.stdout and "at step 6/6" in resumed.stdout

    longer = tt_train(
        "trainer.max_steps=8",
        f"resume={tmp_path / 'run' / 'checkpoint.pt'}",
        run_dir=tmp_path / "longer",
        check=False,
    )
    assert longer.returncode == 2
    assert "a cosine run cannot be extended" in longer.stderr
    assert "Traceback" not in longer.stderr


def test_a_run_hands_over_a_model_to_plan_with_and_a_wsd_run_extends(tmp_path):
    create_dataset("test/tiny-v0")
    run = tmp_path / "run"
    settings = ["trainer.schedule=wsd", "trainer.log_every=1"]
    done = tt_train("trainer.max_steps=10", *settings, run_dir=run)
    assert f"model to plan with: {run / 'model.pt'} (tt-eval checkpoint={run})" in done.stdout
    model = torch.load(run / "model.pt", weights_only=True)
    assert "optimizer" not in model["training"] and model["training"]["step"] == 10
    refused = tt_train(f"resume={run / 'model.pt'}", *settings, run_dir=run, check=False)
    assert refused.returncode == 2 and "holds a model to plan with" in refused.stderr

    longer = tt_train("trainer.max_steps=20", *settings, f"resume={run}", run_dir=run)
    assert "from step 9 (before its cooldown) to the longer plan" in longer.stdout, longer.stdout
    assert "trained 20 steps" in longer.stdout
    assert "cooled down from step 17 to 20" in longer.stdout
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 21))  # the first cooldown's lines gave way to the new run's
    assert torch.load(run / "model.pt", weights_only=True)["training"]["step"] == 20


def test_resume_with_another_model_shape_says_what_differs(tmp_path):
    create_dataset("test/tiny-v0")
    tt_train("trainer.max_steps=2", run_dir=tmp_path / "run")
    result = tt_train(
        "trainer.max_steps=2",
        "model.embedding_dim=32",
        f"resume={tmp_path / 'run' / 'checkpoint.pt'}",
        run_dir=tmp_path / "b",
        check=False,
    )
    assert result.returncode == 2
    assert "model.embedding_dim: checkpoint 16, now 32" in result.stderr
    assert "Traceback" not in result.stderr


def test_resume_with_other_training_targets_says_what_differs(tmp_path):
    create_dataset("test/tiny-v0")
    tt_train("trainer.max_steps=2", "dataset.discretizer=quantile", run_dir=tmp_path / "run")
    result = tt_train(
        "trainer.max_steps=2",
        "dataset.discount=0.9",
        "dataset.terminal_penalty=-10",
        "dataset.discretizer=uniform",
        "dataset.n_bins=20",
        "dataset.bin_values=midpoint",
        f"resume={tmp_path / 'run' / 'checkpoint.pt'}",
        run_dir=tmp_path / "b",
        check=False,
    )
    assert result.returncode == 2, result.stderr
    for line in (
        "dataset.discount: checkpoint 0.99, now 0.9",
        "dataset.terminal_penalty: checkpoint -100.0, now -10.0",
        "dataset.discretizer: checkpoint 'quantile', now 'uniform'",
        "dataset.n_bins: checkpoint 12, now 20",
        "dataset.bin_values: checkpoint 'mean', now 'midpoint'",
    ):
        assert line in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "b" / "checkpoint.pt").exists()


def test_unknown_dataset_is_one_clear_message(tmp_path):
    result = tt_train("dataset.id=nobody/nothing-v0", run_dir=tmp_path, check=False)
    assert result.returncode == 2
    assert "nobody/nothing-v0" in result.stderr and "tt-collect" in result.stderr
    assert "Traceback" not in result.stderr


def test_relabelling_goals_of_a_dataset_without_goals_is_one_clear_message(tmp_path):
    create_dataset("test/tiny-v0")
    result = tt_train("dataset.relabel_goals=0.5", run_dir=tmp_path, check=False)
    assert result.returncode == 2
    assert "achieved_goal" in result.stderr and "dataset.relabel_goals=0" in result.stderr
    assert "Traceback" not in result.stderr


def train_until_ctrl_c(
    *overrides: str, run_dir, stop: signal.Signals = signal.SIGINT
) -> tuple[str, str]:
    """Start tt-train, press Ctrl-C (or send `stop`) once it has trained for a moment;
    (stdout, stderr)."""
    command = [sys.executable, "-m", "trajectory_transformer.cli.train", *TINY, *overrides]
    command.append(f"hydra.run.dir={run_dir}")
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        lines = []
        for line in process.stdout:  # wait until training has started
            lines.append(line)
            if line.startswith("model:"):
                break
        time.sleep(1.5)
        process.send_signal(stop)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    return "".join(lines) + stdout, stderr


def test_ctrl_c_writes_a_checkpoint_and_resume_continues_the_run(tmp_path):
    create_dataset("test/tiny-v0")
    long_run = "trainer.max_steps=1000000"
    _, stderr = train_until_ctrl_c(long_run, run_dir=tmp_path / "run")
    assert "resume=" in stderr
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    first = torch.load(checkpoint, weights_only=True)["training"]
    assert 0 < first["step"] < 1000000 and not first["finished"]

    stdout, _ = train_until_ctrl_c(long_run, f"resume={checkpoint}", run_dir=tmp_path / "again")
    assert f"resumed from {checkpoint} at step {first['step']}/1000000" in stdout
    second = torch.load(tmp_path / "again" / "checkpoint.pt", weights_only=True)["training"]
    assert second["step"] > first["step"] and not second["finished"]  # it trained on
    assert second["tokens_seen"] > first["tokens_seen"]


def test_sigterm_writes_a_checkpoint_as_ctrl_c_does(tmp_path):
    """A cluster's scheduler ends or preempts a job with SIGTERM: the steps taken are kept."""
    create_dataset("test/tiny-v0")
    _, stderr = train_until_ctrl_c(
        "trainer.max_steps=1000000", run_dir=tmp_path / "run", stop=signal.SIGTERM
    )
    assert "SIGTERM" in stderr and "resume=" in stderr
    training = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["training"]
    assert 0 < training["step"] < 1000000 and not training["finished"]


def test_train_in_subprocess_trains_once_then_reuses(tmp_path, monkeypatch):
    from trajectory_transformer.cli import train as train_cli

    create_dataset("test/tiny-v0")
    overrides = [*TINY, "trainer.max_steps=2"]
    checkpoint = train_cli.train_in_subprocess(tmp_path / "run", overrides)
    assert checkpoint == tmp_path / "run" / "model.pt" and checkpoint.exists()

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(train_cli.subprocess, "run", no_training)
    assert train_cli.train_in_subprocess(tmp_path / "run", overrides) == checkpoint
    with pytest.raises(RuntimeError, match="tt-train failed"):
        monkeypatch.undo()
        train_cli.train_in_subprocess(tmp_path / "bad", ["dataset.id=test/missing-v0"])


def test_the_interrupted_message_names_the_step_the_checkpoint_holds():
    from trajectory_transformer.cli.train import interrupted_message

    trainer = SimpleNamespace(step=8, saved_step=8)
    text = interrupted_message(trainer, Path("run/checkpoint.pt"), None)
    assert "checkpoint of step 8 in run/checkpoint.pt;" in text
    assert "resume=run/checkpoint.pt" in text
    trainer.saved_step = 5  # the save of step 8 was cut short: the file holds step 5
    text = interrupted_message(trainer, Path("run/checkpoint.pt"), None)
    assert "checkpoint of step 5" in text and "the save of step 8 was interrupted" in text
    trainer.saved_step = None
    assert "continue from old/checkpoint.pt" in interrupted_message(
        trainer, Path("run/checkpoint.pt"), "old/checkpoint.pt"
    )


def test_the_discretizer_summary_names_poor_and_discrete_dimensions(capsys):
    import numpy as np

    from trajectory_transformer.cli.train import describe_discretizer
    from trajectory_transformer.data.discretizer import Discretizer
    from trajectory_transformer.diagnostics import dimension_names

    rng = np.random.default_rng(0)
    data = rng.normal(size=(2000, 5))  # obs0 obs1 act0 rew val
    data[:, 3] = rng.choice([0.0, 0.5, 1.0, 2.0, 9.0], size=2000)  # a reward of five values
    names = dimension_names(2, 1)
    describe_discretizer(Discretizer.fit(data, 50), data, names)
    out, err = capsys.readouterr()
    assert "in standard deviations: obs 0=" in out and "reward=0.0%" in out
    assert "bins in use where fewer than 50 (a point mass takes one of its own): reward=5" in out
    assert "fewer distinct values than the 50 bins in reward (5)" in err
    assert "round-trip error above" not in err

    describe_discretizer(Discretizer.fit(data, 50, bin_values="midpoint"), data, names)
    out, err = capsys.readouterr()
    assert "round-trip error above 0.1 standard deviations in reward (" in err


def test_the_discretizer_summary_reports_rare_falls_with_their_decoded_mean(capsys):
    import numpy as np

    from trajectory_transformer.cli.train import describe_discretizer
    from trajectory_transformer.data.discretizer import Discretizer
    from trajectory_transformer.diagnostics import dimension_names

    rng = np.random.default_rng(0)
    data = rng.normal(size=(20_000, 5))  # obs0 obs1 act0 rew val
    data[:20, 3] = -97.0 + rng.normal(size=20)  # 20 falls
    names = dimension_names(2, 1)
    describe_discretizer(Discretizer.fit(data, 50), data, names)
    out, _ = capsys.readouterr()
    (line,) = [line for line in out.splitlines() if line.startswith("rare mode")]
    mean = data[:20, 3].mean()
    assert line.startswith("rare mode of reward kept in bins of its own: 20 values in [")
    assert line.endswith(f"mean {mean:.4g}, decoded mean {mean:.4g}")


def test_a_time_budget_ends_a_run_annealed_and_says_so(tmp_path):
    create_dataset("test/tiny-v0")
    result = tt_train(
        "trainer.max_steps=1000000",
        "trainer.schedule=wsd",
        "trainer.time_budget=4s",
        run_dir=tmp_path,
        check=True,
    )
    assert "schedule wsd, within 4s of training, 1000000 steps planned" in result.stdout
    assert "stopped: the time budget of 4s drew near, so the learning rate cooled down" in (
        result.stdout
    )
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["training"]
    assert state["finished"] and state["cooldown"]["end"] == state["step"] < 1000000
    assert 3.0 < state["elapsed_seconds"] < 6.0
