"""AdaStop comparisons: decisions on synthetic scores, shared checkpoints, the state that
survives interruptions, and bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from trajectory_transformer.checkpoint import save_atomic
from trajectory_transformer.cli import compare as compare_cli
from trajectory_transformer.cli.common import ConfigError
from trajectory_transformer.comparison.protocol import (
    AGENT_SEED_STRIDE,
    AgentSpec,
    ComparisonError,
    ComparisonSpec,
    ComparisonState,
    Decider,
    plan_interim,
)
from trajectory_transformer.critic.model import CRITIC_FORMAT


def spec(**changes) -> ComparisonSpec:
    agents = (
        AgentSpec("good"),
        AgentSpec("twin_a", eval=("planner=bc",)),
        AgentSpec("twin_b", train=("model.embedding_dim=32",)),
    )
    settings = dict(dataset="pendulum-medium", agents=agents, n=5, K=3, alpha=0.05, B=5000)
    return ComparisonSpec(**(settings | changes))


def test_a_clearly_better_agent_is_larger_and_identical_ones_are_equal():
    s = spec()
    rng = np.random.default_rng(0)
    means = {"good": 10.0, "twin_a": 0.0, "twin_b": 0.0}
    state = ComparisonState(spec=s.to_dict())
    decider = Decider(s, state)
    interims = 0
    while not decider.finished:
        seeds = s.seeds(interims)
        scores = {
            name: {str(seed): float(rng.normal(means[name], 1.0)) for seed in seeds}
            for name in decider.playing()
        }
        decider.add_interim(scores)
        interims += 1
    assert state.decisions == {
        "good vs twin_a": "larger",
        "good vs twin_b": "larger",
        "twin_a vs twin_b": "equal",
    }
    assert state.decided_at["good vs twin_a"] == 1  # told apart at the first interim
    assert state.decided_at["twin_a vs twin_b"] == interims == s.K  # never told apart
    # Only agents in an undecided comparison got the later interims' seeds.
    assert len(state.values(s.names)["good"]) == s.n
    assert len(state.values(s.names)["twin_a"]) == s.K * s.n

    replayed = Decider(s, ComparisonState(**json.loads(json.dumps(state.__dict__))))
    assert replayed.state.decisions == state.decisions and replayed.finished


def test_compare_to_tests_the_baseline_against_each_other_agent():
    assert spec(compare_to="twin_a").pairs() == [(1, 0), (1, 2)]
    assert spec().pairs() == [(0, 1), (0, 2), (1, 2)]


def test_agents_that_differ_only_in_evaluation_share_their_trainings(tmp_path):
    interim = plan_interim(spec(), 1, ["good", "twin_a", "twin_b"], tmp_path)
    assert len(interim.trainings) == 2 * 5  # good and twin_a share; twin_b trains its own
    assert interim.shared == 5
    good, twin = interim.evaluations["good"][5], interim.evaluations["twin_a"][5]
    assert good.args[0] == twin.args[0]  # the same checkpoint
    assert "planner=bc" in twin.args and "planner=bc" not in good.args
    assert [job.args[-1] for job in interim.trainings[:5]] == [f"seed={s}" for s in range(5, 10)]


def test_independent_agents_train_and_play_seeds_of_their_own(tmp_path):
    independent = spec(pairing="independent")
    interim = plan_interim(independent, 1, ["good", "twin_a", "twin_b"], tmp_path)
    assert len(interim.trainings) == 3 * 5 and interim.shared == 0
    good, twin = interim.evaluations["good"][5], interim.evaluations["twin_a"][5]
    assert good.args[0] != twin.args[0]  # checkpoints of their own
    stride = AGENT_SEED_STRIDE
    seeds = sorted(int(job.args[-1].removeprefix("seed=")) for job in interim.trainings)
    assert seeds == [k * stride + seed for k in range(3) for seed in range(5, 10)]
    assert "eval.seed=0" in good.args and f"eval.seed={stride}" in twin.args


FOUR_AGENTS = (
    AgentSpec("bc", eval=("planner=bc",)),
    AgentSpec("planner"),
    AgentSpec("planner_critic", needs=("model", "critic"), eval=("planner.value=critic",)),
    AgentSpec("iql", needs=("critic",), eval=("planner=iql",)),
)
ON_TINY = ["dataset.id=test/tiny-v0"]


def test_a_critic_per_seed_is_shared_by_the_agents_that_use_it(tmp_path):
    critics = spec(agents=FOUR_AGENTS, critic=("critic=maze",))
    interim = plan_interim(critics, 1, critics.names, tmp_path, ON_TINY)
    kinds = [job.kind for job in interim.trainings]
    assert kinds.count("train") == 5 and kinds.count("critic") == 5  # one of each per seed
    assert interim.shared == (1 + 1 + 2 + 1) * 5 - 10
    critic = interim.trainings[kinds.index("critic")]
    assert critic.args == ["dataset.id=test/tiny-v0", "critic=maze", "seed=5"]
    assert critic.checkpoint == Path(critic.run_dir) / "critic.pt"
    bc, planner, scored, iql = (interim.evaluations[name][5] for name in critics.names)
    model = bc.args[0]
    # The run directory: tt-eval plans with the model that the run handed over.
    assert model == f"checkpoint={interim.uses['bc'][5]['model'].run_dir}"
    assert planner.args[0] == model
    assert scored.args[:2] == [model, f"planner.critic={critic.checkpoint}"]
    assert iql.args[0] == f"checkpoint={critic.checkpoint}"  # no model
    assert not any(arg.startswith("planner.critic=") for arg in bc.args + planner.args + iql.args)


def test_independent_agents_train_critics_of_their_own_and_no_model_they_do_not_need(tmp_path):
    critics = spec(agents=FOUR_AGENTS, pairing="independent")
    interim = plan_interim(critics, 0, critics.names, tmp_path, ON_TINY)
    models = [job for job in interim.trainings if job.kind == "train"]
    critic_jobs = [job for job in interim.trainings if job.kind == "critic"]
    assert len(models) == 3 * 5 and len(critic_jobs) == 2 * 5 and interim.shared == 0
    first_of_iql = f"seed={critics.names.index('iql') * AGENT_SEED_STRIDE}"
    assert first_of_iql in [job.args[-1] for job in critic_jobs]
    assert first_of_iql not in [job.args[-1] for job in models]  # iql trains no model
    scored, played = interim.evaluations["planner_critic"][0], interim.evaluations["iql"][0]
    assert scored.args[1].removeprefix("planner.critic=") != played.args[0].removeprefix(
        "checkpoint="
    )


def test_an_agent_with_nothing_trained_plays_each_seed_with_its_own_noise(tmp_path):
    behaviour = AgentSpec("behaviour", needs=(), eval=("checkpoint=behaviour:test/tiny-v0",))
    for pairing in ("shared", "independent"):
        compared = spec(agents=(AgentSpec("planner"), behaviour), pairing=pairing)
        interim = plan_interim(compared, 1, compared.names, tmp_path, ON_TINY)
        assert [job.kind for job in interim.trainings] == ["train"] * 5  # the planner's alone
        assert not any(interim.uses["behaviour"].values())  # nothing trained for it
        for seed, job in interim.evaluations["behaviour"].items():
            own = compared.seed_of(behaviour, seed)
            assert job.args[0] == f"planner.seed={own}"
            assert job.args[-1] == "checkpoint=behaviour:test/tiny-v0"
            assert not any(arg.startswith("planner.critic=") for arg in job.args)


def test_a_state_saved_before_critics_loads_with_models_only():
    saved = spec().to_dict()
    del saved["critic"]
    for agent in saved["agents"]:
        del agent["needs"], agent["critic"]
    assert ComparisonSpec.from_dict(saved) == spec()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(pairing="paired"), "compare.pairing must be one of shared, independent"),
        (dict(agents=(AgentSpec("alone"),)), "at least two agents"),
        (dict(n=0), "compare.n must be at least 1"),
        (dict(K=0), "compare.K must be at least 1"),
        (dict(n=10**12), "compare.n must be at most 1,000 .*got 1,000,000,000,000"),
        (dict(K=101), "compare.K must be at most 100"),
        (dict(B=0), r"compare.B must be in \[1, 10,000,000\]"),
        (dict(B=10**8), "compare.B must be in .*got 100,000,000"),
        (dict(alpha=1.0), r"compare.alpha must be in \(0, 1\)"),
        (dict(alpha=0.0), r"compare.alpha must be in \(0, 1\)"),
        (dict(compare_to="nobody"), "compare_to='nobody' names no agent"),
        (
            dict(agents=(AgentSpec("a", needs=()), AgentSpec("b"))),
            "agent a needs nothing trained, so its eval must name what it plays",
        ),
        (
            dict(agents=(AgentSpec("a", eval=("checkpoint=behaviour:x/y-v0",)), AgentSpec("b"))),
            "agent a: tt-compare gives each seed's evaluation the model trained for it",
        ),
        (
            dict(agents=(AgentSpec("a", needs=("model", "model")), AgentSpec("b"))),
            r"agent a: needs takes model and/or critic \(or nothing\), got \['model', 'model'\]",
        ),
        (dict(agents=(AgentSpec("a", needs=("modle",)), AgentSpec("b"))), "got \\['modle'\\]"),
        (
            dict(agents=(AgentSpec("a", needs=("critic",), train=("seed=1",)), AgentSpec("b"))),
            r"agent a: train overrides \['seed=1'\] for a model it does not need",
        ),
        (
            dict(agents=(AgentSpec("a", critic=("critic=maze",)), AgentSpec("b"))),
            r"agent a: critic overrides \['critic=maze'\] for a critic it does not need",
        ),
    ],
)
def test_bad_settings_are_refused(changes, message):
    with pytest.raises(ComparisonError, match=message):
        spec(**changes).validate()


def test_a_changed_agent_is_refused_naming_what_changed(tmp_path):
    ComparisonState(spec=spec().to_dict()).save(tmp_path)
    changed = spec(agents=(*spec().agents[:2], AgentSpec("twin_b", eval=("planner=bc",))))
    expected = r"agent twin_b: train \['model.embedding_dim=32'\] -> \[\]\n  agent twin_b: eval"
    with pytest.raises(ComparisonError, match=expected) as error:
        ComparisonState.load_or_start(tmp_path, changed)
    assert "twin_a" not in str(error.value)
    assert ComparisonSpec.from_dict(ComparisonState.load_or_start(tmp_path, spec()).spec) == spec()


# --- the command, in this process, with jobs that only pretend to train and evaluate ------

TRUE_SCORES = {"planner": 90.0, "bc": 40.0, "narrow": 88.0, "planner_critic": 95.0, "iql": 60.0}
TRUE_SCORES |= {"goals": 100.0, "behaviour": 77.0}


def trained_config(command: str, job) -> dict:
    """The resolved config a training of `job` would write into its checkpoint."""
    return OmegaConf.to_container(compare_cli.compose_checked(command, job.args), resolve=True)


class PretendLauncher:
    """Stands in for `launch`: writes what a finished job leaves behind, records every job it
    ran, and can raise KeyboardInterrupt (a Ctrl-C) when asked to launch a given label."""

    def __init__(self, interrupt_at: str | None = None, reference=None):
        self.interrupt_at = interrupt_at
        self.reference = reference  # what tt-eval names next to its scores; per agent if a dict
        self.ran: list[str] = []
        self.jobs: list = []  # the jobs that ran

    def __call__(self, jobs, root, label, launcher):
        if label == self.interrupt_at:
            raise KeyboardInterrupt
        pending = [job for job in jobs if not job.done()]
        for job in pending:
            folder = Path(job.run_dir)
            if job.kind == "train":
                payload = {
                    "format_version": 2,
                    "training": {"finished": True},
                    "config": trained_config("train", job),
                }
                save_atomic(payload, folder / "checkpoint.pt")
            elif job.kind == "critic":
                payload = {
                    "kind": CRITIC_FORMAT,
                    "format_version": 1,
                    "training": {"finished": True},
                    "config": trained_config("train_critic", job),
                }
                save_atomic(payload, folder / "critic.pt")
            else:
                agent, seed = folder.parent.name, int(folder.name.removeprefix("seed"))
                score = TRUE_SCORES[agent] + np.sin(seed)  # a little spread across seeds
                results = {"normalized_score_mean": score, "return_mean": score}
                reference = self.reference
                if reference is not None and "reference_source" not in reference:
                    reference = reference[agent]
                results |= reference or {}
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "results.json").write_text(json.dumps(results))
            self.ran.append(job.run_dir)
            self.jobs.append(job)
        return len(pending)


def run_compare(root: Path, launcher: PretendLauncher, *overrides: str):
    with initialize_config_module("trajectory_transformer.configs", version_base="1.3"):
        cfg = compose("compare", overrides=list(overrides))
        return compare_cli.compare(cfg, root, [])


def test_resume_after_an_interruption_runs_no_job_twice(tmp_path, monkeypatch):
    settings = ["compare.n=3", "compare.K=3", "compare.B=500", "compare.compare_to=planner"]
    first = PretendLauncher(interrupt_at="interim1-eval")
    monkeypatch.setattr(compare_cli, "launch", first)
    with pytest.raises(KeyboardInterrupt):
        run_compare(tmp_path, first, *settings)
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert len(saved["scores"]) == 1  # interim 1 was finished and stored, interim 2 was not
    assert not saved["finished"]

    again = PretendLauncher()
    monkeypatch.setattr(compare_cli, "launch", again)
    state = run_compare(tmp_path, again, *settings)
    ran = first.ran + again.ran
    assert len(ran) == len(set(ran))  # no job ran twice
    assert not any("seed0" in run_dir or "seed2" in run_dir for run_dir in again.ran)
    assert state.finished and state.decisions["planner vs bc"] == "larger"
    # Planner-only variants share checkpoints: one training per seed for three agents.
    trainings = [r for r in ran if "/trainings/" in r]
    assert len(trainings) == len({Path(r).name for r in trainings})
    assert state.trainings_shared > 0
    for name in ("decisions.csv", "agents.csv", "comparison_scores.png", "comparison_iqm.png"):
        assert (tmp_path / name).is_file()


def test_an_override_that_tt_train_or_tt_eval_would_reject_stops_before_any_job(
    tmp_path, monkeypatch
):
    launcher = PretendLauncher()
    monkeypatch.setattr(compare_cli, "launch", launcher)
    with pytest.raises(ConfigError, match=r"agent bc: tt-eval would reject .*planner\.horizn"):
        run_compare(tmp_path, launcher, 'compare.agents.bc.eval=["planner.horizn=2"]')
    with pytest.raises(ConfigError, match=r"tt-train would reject .*model\.width"):
        run_compare(tmp_path, launcher, 'compare.train=["model.width=3"]')
    with pytest.raises(ConfigError, match=r"planner\.horizon must be at least 1"):
        run_compare(tmp_path, launcher, 'compare.agents.bc.eval=["planner.horizon=0"]')
    assert launcher.ran == [] and not (tmp_path / "compare.json").exists()


# --- agents with critics: the shipped four-agent comparison, its jobs pretended -------------

CRITICS = ["compare=critic-pointmaze-medium", "compare.n=2", "compare.K=2", "compare.B=500"]


def test_critics_are_trained_once_per_seed_and_resumed_without_repeats(tmp_path, monkeypatch):
    first = PretendLauncher(interrupt_at="interim1-train")
    monkeypatch.setattr(compare_cli, "launch", first)
    with pytest.raises(KeyboardInterrupt):
        run_compare(tmp_path, first, *CRITICS)
    again = PretendLauncher()
    monkeypatch.setattr(compare_cli, "launch", again)
    state = run_compare(tmp_path, again, *CRITICS)
    ran = first.ran + again.ran
    assert len(ran) == len(set(ran))  # no job ran twice
    critics = [Path(r) for r in ran if "/critics/" in r]
    assert len({c.parent for c in critics}) == 1  # one critic config, shared by two agents
    assert sorted(c.name for c in critics) == [f"seed{s}" for s in range(len(critics))]
    assert len(critics) == 2 * len(state.scores)
    assert state.finished and state.decisions["planner_critic vs bc"] == "larger"
    jobs = first.jobs + again.jobs
    critic_job = next(job for job in jobs if job.kind == "critic")
    assert critic_job.args == ["dataset.id=pointmaze/medium-v0", "critic=maze", "seed=0"]
    by_agent = {  # the evaluations of seed 0
        Path(job.run_dir).parent.name: job.args
        for job in jobs
        if job.kind == "eval" and Path(job.run_dir).name == "seed0"
    }
    assert f"planner.critic={critic_job.checkpoint}" in by_agent["planner_critic"]
    assert by_agent["iql"][0] == f"checkpoint={critic_job.checkpoint}"


def test_the_behaviour_policy_plays_each_seed_beside_the_trained_agents(tmp_path, monkeypatch):
    launcher = PretendLauncher()
    monkeypatch.setattr(compare_cli, "launch", launcher)
    goals = ["compare=goals-pointmaze-umaze", "compare.n=2", "compare.K=1", "compare.B=500"]
    state = run_compare(tmp_path, launcher, *goals)
    played = [job for job in launcher.jobs if Path(job.run_dir).parent.name == "behaviour"]
    assert [job.kind for job in played] == ["eval", "eval"]  # nothing trained for it
    assert [job.args[0] for job in played] == ["planner.seed=0", "planner.seed=1"]
    assert "checkpoint=behaviour:pointmaze/umaze-v0" in played[0].args
    assert "goals vs behaviour" in state.decisions
    with open(tmp_path / "agents.csv") as file:
        behaviour = next(row for row in csv.DictReader(file) if row["name"] == "behaviour")
    assert behaviour["model_minutes"] == behaviour["critic_minutes"] == ""  # none trained


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["compare.agents.planner_critic.needs=[model]"],
            r"agent planner_critic: its planner scores beams with the critic's values, so it "
            r"needs \[model, critic\], not \['model'\]",
        ),
        (
            ["compare.agents.iql.needs=[model,critic]"],
            r"agent iql: planner=iql plays a critic's policy, with no model, so it needs "
            r"\[critic\]",
        ),
        (
            ["compare.agents.planner.needs=[model,critic]"],
            r"agent planner: its planner scores beams with the model's values, so it needs "
            r"\[model\]",
        ),
        (
            ['compare.agents.planner_critic.eval=["planner.value=critic","planner.critic=c.pt"]'],
            r"agent planner_critic: planner.critic=c.pt would score every seed with one critic",
        ),
        (
            ['compare.agents.planner_critic.train=["dataset.id=pointmaze/large-v0"]'],
            "agent planner_critic trains its model on pointmaze/large-v0, its critic on the "
            "comparison's dataset pointmaze/medium-v0",
        ),
        (
            ['compare.critic=["critic.expectile=2"]'],
            r"agent planner_critic: tt-train-critic would reject .*critic.expectile must be in",
        ),
        (
            [
                "compare.agents.bc.needs=[]",
                'compare.agents.bc.eval=["checkpoint=behaviour:x/y-v0"]',
            ],
            "agent bc trains nothing: it can play the behaviour policy of the "
            "comparison's dataset, checkpoint=behaviour:pointmaze/medium-v0, not ",
        ),
    ],
)
def test_an_agent_whose_evaluation_does_not_use_what_it_trains_is_refused(
    tmp_path, monkeypatch, overrides, message
):
    launcher = PretendLauncher()
    monkeypatch.setattr(compare_cli, "launch", launcher)
    with pytest.raises(ConfigError, match=message):
        run_compare(tmp_path, launcher, *CRITICS, *overrides)
    assert launcher.ran == [] and not (tmp_path / "compare.json").exists()


# --- reference scores: the same settings as tt-eval's, on one scale for every agent ---------

D4RL_HOPPER = {
    "ref_min_score": -20.272305,
    "ref_max_score": 3234.3,
    "reference_source": "d4rl (v2 envs)",
}


def test_reference_scores_in_the_shared_eval_list_normalise_every_agent(
    tmp_path, monkeypatch, capsys
):
    launcher = PretendLauncher(reference=D4RL_HOPPER)
    monkeypatch.setattr(compare_cli, "launch", launcher)
    settings = ["compare.n=2", "compare.K=1", "compare.B=100", "compare.dataset=hopper-medium"]
    state = run_compare(tmp_path, launcher, *settings, 'compare.eval=["eval.reference=d4rl"]')
    evaluations = [" ".join(job.args) for job in launcher.jobs if job.kind == "eval"]
    assert len(evaluations) == 2 * len(state.spec["agents"])  # n=2 seeds per agent
    assert all("eval.reference=d4rl" in args for args in evaluations)
    assert state.normalized and state.reference == D4RL_HOPPER
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["reference"] == D4RL_HOPPER
    out, err = capsys.readouterr()
    assert "reference: d4rl (v2 envs), -20.272305 to 3234.3" in out
    assert err.count("v2 MuJoCo environments") == 1  # warned once, not once per agent


def test_the_d4rl_row_of_a_local_dataset_comes_from_its_env(tmp_path, monkeypatch, capsys):
    from conftest import create_dataset

    # An id that names no family: its metadata's env (Hopper-v5) picks the row.
    create_dataset("test/mine-v0", obs_dim=11, act_dim=3, env="Hopper-v5", ref_scores=None)
    launcher = PretendLauncher(reference=D4RL_HOPPER)
    monkeypatch.setattr(compare_cli, "launch", launcher)
    settings = [
        "compare.n=1",
        "compare.K=1",
        "compare.B=100",
        'compare.train=["dataset.id=test/mine-v0"]',
    ]
    run_compare(tmp_path, launcher, *settings, 'compare.eval=["eval.reference=d4rl"]')
    assert "D4RL's hopper reference returns" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (['compare.eval=["eval.ref_min_score=0"]'], "give both eval.ref_min_score and"),
        (
            ['compare.eval=["eval.reference=d4rl","eval.ref_min_score=0","eval.ref_max_score=1"]'],
            "ambiguous",
        ),
        # pendulum-medium: D4RL has no Pendulum row.
        (['compare.eval=["eval.reference=d4rl"]'], "no row for dataset 'pendulum/medium-v0'"),
        (
            ['compare.eval=["eval.reference=d4rl","eval.env_id=Pendulum-v1"]'],
            "no row for env 'Pendulum-v1'",
        ),
        (
            [
                "compare.dataset=hopper-medium",
                'compare.agents.bc.eval=["planner=bc","eval.reference=d4rl"]',
            ],
            r"different reference scores \(planner: the dataset's own, bc: d4rl",
        ),
    ],
)
def test_reference_settings_that_tt_eval_would_refuse_stop_before_any_job(
    tmp_path, monkeypatch, overrides, message
):
    launcher = PretendLauncher()
    monkeypatch.setattr(compare_cli, "launch", launcher)
    with pytest.raises(ConfigError, match=message):
        run_compare(tmp_path, launcher, *overrides)
    assert launcher.ran == [] and not (tmp_path / "compare.json").exists()


def test_evaluations_on_different_scales_are_refused(tmp_path, monkeypatch):
    explicit = {"ref_min_score": 0.0, "ref_max_score": 1.0, "reference_source": "explicit"}
    by_agent = {"planner": D4RL_HOPPER, "bc": explicit, "narrow": D4RL_HOPPER}
    launcher = PretendLauncher(reference=by_agent)
    monkeypatch.setattr(compare_cli, "launch", launcher)
    with pytest.raises(ComparisonError, match="not scored on one scale") as error:
        run_compare(tmp_path, launcher, "compare.n=1", "compare.K=1", "compare.B=100")
    assert "normalised by explicit reference scores (0.0 to 1.0)" in str(error.value)
