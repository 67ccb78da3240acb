"""Every setting is checked before any work: a bad one is one line on stderr and exit 2."""

from __future__ import annotations

import pytest
from conftest import TINY_TRAINING, run_module

from trajectory_transformer.cli.common import check_command_line


def rejected(capsys, config: str, *overrides: str) -> str:
    """The one line that `overrides` of `config` get, after checking the exit code."""
    with pytest.raises(SystemExit) as exit_info:
        check_command_line(config, list(overrides))
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    return err.strip().removeprefix("error: ")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.learning_rate=-1", "learning_rate must be a number >= 0 within float32's range"),
        ("trainer.learning_rate=nan", "learning_rate must be a number >= 0 within float32's r"),
        ("trainer.learning_rate=1e39", "learning_rate must be a number >= 0 within float32's r"),
        ("model.n_layer=0", "model.n_layer must be positive, got 0"),
        ("dataset.n_bins=1", "dataset.n_bins must be in [2, 65536], got 1"),
        ("model.embedding_dim=30", "must be divisible by"),
        ("trainer.batch_size=-3", "trainer.batch_size must be at least 1, got -3"),
        ("trainer.max_steps=0", "trainer.max_steps must be at least 1, or null, got 0"),
        ("model.n_layers=4", "unknown config key model.n_layers; did you mean model.n_layer?"),
        ("trainer.batch_size=abc", "trainer.batch_size: Value 'abc' of type 'str' could not be"),
        ("dataset=pendulum-mediun", "no dataset config named pendulum-mediun; did you mean"),
        ("+foo=1", "unknown config key foo; the top level takes dataset, device"),
        ("trainer.schedule=linear", "trainer.schedule must be one of cosine, wsd, schedule_free"),
        ("trainer.time_budget=soon", "trainer.time_budget must be a duration such as 90s"),
        ("dataset.discount=1.5", "dataset.discount must be in [0, 1], got 1.5"),
        ("seed=-1", "seed must be at least 0, got -1"),
    ],
)
def test_tt_train_settings(capsys, override, message):
    assert message in rejected(capsys, "train", override)


def test_the_evaluations_planner_must_fit_the_models_window(capsys):
    line = rejected(capsys, "train", "trainer.eval_every=10", "planner.horizon=50")
    assert line.startswith("planner.context_transitions + planner.horizon = 55 transitions")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["checkpoint=x.pt", "eval.episodes=0"], "eval.episodes must be at least 1, got 0"),
        (["checkpoint=x.pt", "eval.num_envs=-2"], "eval.num_envs must be in [1, 4096], got -2"),
        (["checkpoint=x.pt", "planner.beam_width=0"], "planner.beam_width must be at least 1"),
        (["checkpoint=x.pt", "planner.reward_token=mean"], "planner.reward_token must be one of"),
        (["checkpoint=x.pt", "eval.video_format=avi"], "eval.video_format must be gif or mp4"),
        (["checkpoint=x.pt", "planner.beam=3"], "unknown config key planner.beam; did you mean"),
        (["eval.episodes=3"], "checkpoint"),  # a required key left out
    ],
)
def test_tt_eval_settings(capsys, overrides, message):
    assert message in rejected(capsys, "eval", *overrides)


def test_tt_collect_and_tt_compare_settings(capsys):
    assert "episodes must be at least 1" in rejected(capsys, "collect", "episodes=0")
    assert "unknown config key compare.alpah; did you mean compare.alpha?" in rejected(
        capsys, "compare", "compare.alpah=0.1"
    )
    agents = ("compare", "compare=critic-pointmaze-medium")
    # The suggestion comes from the comparison the command line chose (its agents), and from
    # the same agent.
    assert (
        "unknown config key compare.agents.iql.needz; did you mean compare.agents.iql.needs?"
        in rejected(capsys, *agents, "compare.agents.iql.needz=[critic]")
    )
    assert "compare.agents.iql takes critic, eval, needs, train" in rejected(
        capsys, *agents, "compare.agents.iql.agnt=x"
    )


def test_a_list_of_bare_overrides_gets_the_quoted_form(capsys):
    line = rejected(capsys, "compare", "compare.train=[trainer.max_steps=null, trainer.seed=2]")
    assert line.endswith(
        """quote each list item that holds '=', as in """
        """'compare.train=["trainer.max_steps=null","trainer.seed=2"]'"""
    )
    # The quoted form composes.
    check_command_line("compare", ['compare.train=["trainer.max_steps=null","seed=2"]'])


def test_a_good_command_line_passes_and_hydras_own_flags_are_left_to_it(capsys):
    check_command_line("train", ["trainer.max_steps=5", "hydra.run.dir=/tmp/x"])
    check_command_line("train", ["--cfg", "job"])
    check_command_line("compare", ["--multirun", "job.index=0,1"])
    assert capsys.readouterr() == ("", "")


def test_the_command_prints_one_line_and_writes_nothing(tmp_path):
    result = run_module(
        "trajectory_transformer.cli.train",
        *TINY_TRAINING,
        "trainer.batch_size=-3",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "error: trainer.batch_size must be at least 1, got -3\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "shape",
    [dict(n_layer=1, n_head=1, embedding_dim=8), dict(n_layer=3, n_head=4, embedding_dim=64)],
)
def test_the_parameter_estimate_is_the_models_count(shape):
    from trajectory_transformer.cli.resources import parameter_count
    from trajectory_transformer.model import GPTConfig, TrajectoryGPT

    config = GPTConfig(observation_dim=3, action_dim=2, n_bins=11, sequence_transitions=4, **shape)
    assert parameter_count(config) == TrajectoryGPT(config).num_parameters()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.n_layer=100000000", "training a model of"),
        ("model.sequence_transitions=100000", "training a model of"),
        ("trainer.batch_size=100000000", "on batches of 100000000 needs about"),
    ],
)
def test_settings_far_beyond_the_machine_are_refused_before_any_work(
    tiny_dataset, tmp_path, override, message
):
    result = run_module(
        "trajectory_transformer.cli.train",
        *TINY_TRAINING,
        override,
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.splitlines()
    assert message in line and "GB of memory, more than the" in line
