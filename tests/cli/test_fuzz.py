"""Property-based test of the command lines: whatever overrides a user types, tt-train, tt-eval
and tt-compare either start normally and compute finite numbers, or stop with one line on
stderr and exit code 2, never a traceback.

The commands run in this process on a tiny dataset and model; "starting" is reaching the
work itself (training, playing, the first interim). There the test runs the first of it
(two training steps; one action of the agent) and checks that every number it made is finite
(the weights; the actions and the plan's scores), then stops them. A fixed number of examples
keeps `make test` fast; `--hypothesis-profile=long` draws many more (the profiles are in
conftest.py).
"""

from __future__ import annotations

import sys
import traceback
import uuid

import numpy as np
import pytest
import torch
from conftest import TINY_TRAINING, untrained_checkpoint
from hypothesis import example, given
from hypothesis import strategies as st

from trajectory_transformer.cli import compare as compare_cli
from trajectory_transformer.cli import evaluate as evaluate_cli
from trajectory_transformer.cli import train as train_cli
from trajectory_transformer.training.trainer import Trainer

STARTED = 99
"""The exit code of a command that reached its work, every setting accepted (Hydra turns an
exception inside the command into its own report, not an exit)."""


def start(*args, **kwargs):
    raise SystemExit(STARTED)


def train_two_steps(trainer: Trainer) -> None:
    """The start of a training: two steps (a non-finite one stops the command with its
    one-line error), after which every weight is finite."""
    for _ in range(2):
        trainer.train_step(torch.arange(min(trainer.cfg.batch_size, len(trainer.windows))))
    for name, parameter in trainer.model.named_parameters():
        assert torch.isfinite(parameter).all(), f"{name} is not finite after two steps"
    start()


def act_once(agent, env, *args, **kwargs) -> None:
    """The start of an evaluation: one action on the first observation, finite, from a
    plan whose scores are finite."""
    observations, _ = env.reset(seed=0)
    agent.reset(env.num_envs, 0)
    actions = agent.act(observations)
    assert np.isfinite(actions).all(), f"actions {actions}"
    plan = getattr(agent, "last_plan", None)
    if plan is not None:
        for name in ("scores", "rewards", "values"):
            assert torch.isfinite(getattr(plan, name)).all(), f"the plan's {name} are not finite"
    start()


VALUES = st.one_of(
    st.sampled_from(
        ["0", "1", "-1", "2", "0.5", "-0.5", "1.0", "nan", "inf", "-inf", "1e400", "-1e-300"]
    ),
    st.sampled_from(["abc", "null", "true", "[]", "[1,2]", "{}", "''", "30m", "wsd", "greedy"]),
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
TRAIN_KEYS = [
    "dataset.n_bins",
    "dataset.discount",
    "dataset.terminal_penalty",
    "dataset.discretizer",
    "dataset.validation_fraction",
    "model.n_layer",
    "model.n_head",
    "model.embedding_dim",
    "model.dropout",
    "model.sequence_transitions",
    "model.activation_checkpointing",
    "trainer.batch_size",
    "trainer.learning_rate",
    "trainer.max_steps",
    "trainer.epochs",
    "trainer.weight_decay",
    "trainer.grad_clip",
    "trainer.warmup_fraction",
    "trainer.schedule",
    "trainer.time_budget",
    "trainer.cooldown_fraction",
    "trainer.patience",
    "trainer.eval_every",
    "trainer.action_weight",
    "planner.horizon",
    "planner.beam_width",
    "seed",
    "model.n_layers",  # typos and keys that do not exist
    "trainer.lr",
    "foo",
]
PLANNER_KEYS = [
    "planner.horizon",
    "planner.beam_width",
    "planner.n_expand",
    "planner.context_transitions",
    "planner.k_obs",
    "planner.cdf_act",
    "planner.temperature",
    "planner.discount",
    "planner.plan_every",
    "planner.value_percentile",
    "planner.reward_token",
    "planner.seed",
]
EVAL_KEYS = [
    *PLANNER_KEYS,
    "eval.episodes",
    "eval.num_envs",
    "eval.seed",
    "eval.max_episode_steps",
    "eval.ref_min_score",
    "eval.reference",
    "eval.video_format",
    "planner.beam",
    "eval.episode",
]
FITTING_PLANNER = [
    "planner.horizon=2",
    "planner.context_transitions=1",
    "planner.beam_width=4",
    "eval.num_envs=1",
]
"""A search that fits the tiny checkpoint's block (4 transitions), before the drawn overrides:
otherwise the default horizon refuses nearly every draw, and few would start."""
COMPARE_KEYS = [
    "compare.n",
    "compare.K",
    "compare.alpha",
    "compare.B",
    "compare.episodes",
    "compare.pairing",
    "compare.compare_to",
    "compare.alpah",
    "stop_after",
]


def overrides(keys: list[str]) -> st.SearchStrategy[list[str]]:
    pair = st.tuples(st.sampled_from(keys), VALUES).map(lambda kv: f"{kv[0]}={kv[1]}")
    return st.lists(pair, min_size=1, max_size=4)


def run(main, argv: list[str], capsys) -> None:
    """Run a command in this process; assert that it started, or said no in one line."""
    capsys.readouterr()
    old_argv = sys.argv
    sys.argv = ["tt", *argv]
    try:
        main()
    except SystemExit as exit_info:
        if exit_info.code == STARTED:
            return
        err = capsys.readouterr().err
        assert exit_info.code == 2, f"exit {exit_info.code} for {argv}: {err}"
        # Checks that need the data (a window longer than the episodes, the memory of the
        # model) come after the dataset summary, whose warnings may stand before the error.
        *warnings, error = err.splitlines()
        assert err.endswith("\n") and error.startswith("error: "), f"{argv}: {err!r}"
        assert all(line.startswith("warning: ") for line in warnings), f"{argv}: {err!r}"
        return
    except BaseException:
        pytest.fail(f"{argv} ended in a traceback:\n{traceback.format_exc()}")
    finally:
        sys.argv = old_argv
    pytest.fail(f"{argv} neither started nor stopped")


@pytest.fixture
def checkpoint(tiny_dataset, tmp_path):
    return untrained_checkpoint(tmp_path / "checkpoint.pt", "test/tiny-v0")


@given(drawn=overrides(TRAIN_KEYS))
@example(drawn=["trainer.learning_rate=1.2646662000497285e+195"])  # once overflowed in Adam
def test_tt_train_starts_or_says_no_in_one_line(drawn, tiny_dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(Trainer, "train", train_two_steps)
    run(train_cli.main, [*TINY_TRAINING, *drawn, f"hydra.run.dir={tmp_path}/train"], capsys)


@given(drawn=overrides(EVAL_KEYS))
@example(drawn=["planner.temperature=nan"])  # once accepted: every beam score was NaN
@example(drawn=["planner.temperature=inf"])
@example(drawn=["planner.temperature=1.879420324556047e-170"])  # zero in float32: NaN scores
def test_tt_eval_starts_or_says_no_in_one_line(drawn, checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(evaluate_cli, "evaluate", act_once)
    argv = [f"checkpoint={checkpoint}", "device=cpu", *FITTING_PLANNER, *drawn]
    # A run directory of its own: one that holds an earlier example's episodes refuses others.
    argv.append(f"hydra.run.dir={tmp_path}/eval-{uuid.uuid4().hex}")
    run(evaluate_cli.main, argv, capsys)


@given(drawn=overrides(COMPARE_KEYS + [f"compare.{key}" for key in ("n", "K")]))
def test_tt_compare_starts_or_says_no_in_one_line(
    drawn, tiny_dataset, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(compare_cli, "run_interim", start)
    train = "compare.train=[" + ",".join(f'"{o}"' for o in TINY_TRAINING) + "]"
    argv = [train, *drawn, f"hydra.run.dir={tmp_path}/compare"]
    run(compare_cli.main, argv, capsys)
