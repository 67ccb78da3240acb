"""`tt-compare` end to end on a tiny dataset, with Hydra's local launchers."""

import csv
import datetime
import fcntl
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_TRAINING, create_dataset, run_module

from trajectory_transformer.cli import compare as compare_cli
from trajectory_transformer.cli.compare import INTERRUPTED, launch, run_job
from trajectory_transformer.comparison.protocol import ComparisonError, Job


def hydra_list(overrides: list[str]) -> str:
    return "[" + ",".join(f'"{o}"' for o in overrides) + "]"


TINY_COMPARISON = [
    "compare.n=1",
    "compare.K=1",
    "compare.B=100",
    "compare.episodes=1",
    "~compare.agents.narrow",  # planner and bc: two agents, one shared training
    "compare.train=" + hydra_list([*TINY_TRAINING, "trainer.max_steps=2"]),
    "compare.eval="
    + hydra_list(
        [
            "planner.horizon=2",
            "planner.beam_width=2",
            "planner.context_transitions=1",
            "eval.num_envs=1",
            "eval.max_episode_steps=5",
            "eval.ref_min_score=-2000",  # in place of the dataset's (-1200, -150)
            "eval.ref_max_score=0",
            "device=cpu",
        ]
    ),
]


LAUNCHERS = [
    [],
    ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    # The SLURM recipe's machinery (submitit: pickled jobs, their own processes and logs), run
    # as local processes.
    ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"],
]


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=["basic", "joblib", "submitit_local"])
def test_a_comparison_runs_its_jobs_through_the_launcher(tmp_path, launcher):
    create_dataset("test/tiny-v0")
    result = run_module(
        "trajectory_transformer.cli.compare",
        *TINY_COMPARISON,
        *launcher,
        f"hydra.run.dir={tmp_path}",
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| planner vs bc |" in result.stdout
    assert "not told apart within this budget" in result.stdout  # one seed decides nothing
    assert "1 trainings (1 more saved by sharing checkpoints" in result.stdout
    state = json.loads((tmp_path / "compare.json").read_text())
    assert state["finished"] and state["trainings_run"] == 1 and state["evaluations_run"] == 2
    assert set(state["scores"][0]) == {"planner", "bc"}
    # tt-eval's reference scores, taken from the comparison's shared eval list, are named.
    assert state["normalized"] and state["reference"] == {
        "ref_min_score": -2000.0,
        "ref_max_score": 0.0,
        "reference_source": "explicit",
    }
    assert "normalised score (reference: explicit, -2000.0 to 0.0)" in result.stdout
    for name in ("decisions.csv", "agents.csv", "comparison_scores.png", "comparison_profile.png"):
        assert (tmp_path / name).is_file()
    if launcher == []:  # its tables as results records, command and all
        check_records_of(tmp_path)
    if "hydra/launcher=joblib" in launcher:
        assert "Joblib" in (result.stdout + result.stderr)
    if "hydra/launcher=submitit_local" in launcher:  # a submitit job (and log) per job
        assert len(list((tmp_path / "jobs").glob("interim0-*/.submitit/*/*_log.out"))) == 3


def check_records_of(run_dir):
    """scripts/record_comparison.py on a finished run: its three tables, as tt-compare wrote
    them, with the command less the run directory."""
    import record_comparison
    import render_results

    records = run_dir / "records"
    written = record_comparison.write_records(run_dir, records / "tiny", "cpu, alone", "abc1234")
    assert [path.name for path in written] == [
        "tiny-agents.json",
        "tiny-seeds.json",
        "tiny-decisions.json",
    ]
    agents = render_results.load("tiny-agents", records)
    with open(run_dir / "agents.csv") as file:
        means = {row["name"]: f"{float(row['mean']):.1f}" for row in csv.DictReader(file)}
    assert {row[0]: row[2] for row in agents["rows"]} == means
    seeds = render_results.load("tiny-seeds", records)
    assert seeds["columns"] == ["agent", "seed 0"]  # one seed an agent, its score its mean
    assert {row[0]: row[1] for row in seeds["rows"]} == means
    assert [row[1] for row in agents["rows"]] == ["1", "1"]
    command = agents["provenance"]["commands"][0]
    assert command.startswith("tt-compare compare.n=1 ") and "hydra.run.dir" not in command
    assert agents["provenance"]["commits"] == ["abc1234"]
    today = datetime.date.today()
    just_evaluated = [[day.isoformat()] for day in (today, today - datetime.timedelta(days=1))]
    assert agents["provenance"]["dates"] in just_evaluated
    (decision,) = render_results.load("tiny-decisions", records)["rows"]
    assert decision[0] == "planner vs bc"
    assert decision[4] == "equal (not told apart within this budget) after 1 interim"
    page = "<!-- results: tiny-decisions -->\n<!-- /results -->\n"
    rendered, _ = render_results.render_page(page, records)
    assert "| planner vs bc |" in rendered


def test_the_seeds_record_marks_the_seeds_an_agent_did_not_play():
    """An agent whose comparisons were decided after interim 1 plays no seed of interim 2."""
    import record_comparison

    scores = [
        {"planner": {"0": 90.04, "1": 91.0}, "bc": {"0": 40.0, "1": 41.26}},
        {"planner": {"2": 92.0, "3": 93.0}},
    ]
    by_agent = record_comparison.scores_by_agent(scores)
    columns, rows = record_comparison.seed_columns_and_rows(by_agent)
    assert columns == ["agent", "seed 0", "seed 1", "seed 2", "seed 3"]
    assert rows == [["planner", "90.0", "91.0", "92.0", "93.0"], ["bc", "40.0", "41.3", "-", "-"]]


def test_the_goals_record_reads_each_evaluations_reach_and_hold(tmp_path):
    """Per agent (in the agents' order) and seed, from the results.json tt-eval writes: goals
    reached, the mean share of the steps after arrival spent at the goal, the mean arrival."""
    import record_comparison

    from trajectory_transformer.evaluation.loop import EvalResult

    def write(agent: str, seed: int, first: list, at: list, lengths: list) -> None:
        result = EvalResult(
            returns=[0.0] * len(lengths),
            lengths=lengths,
            seeds=list(range(len(lengths))),
            normalized_scores=None,
            no_score_reason="test",
            planning_seconds=0.0,
            env_steps=sum(lengths),
            wall_seconds=0.0,
            first_success_steps=first,
            success_steps=at,
        )
        result.write(tmp_path / "evaluations" / agent / f"seed{seed}" / "results.json")

    write("goals", 10, [100, 300, None], [400, 100, 0], [500, 500, 500])  # held 100% and 50%
    write("goals", 2, [None, None], [0, 0], [500, 500])  # never reached: no hold, no arrival
    write("behaviour", 0, [250, 350], [125, 75], [500, 500])  # 50% and 50%
    played = {"goals": [2, 10], "behaviour": [0]}
    assert record_comparison.goal_rows(tmp_path, played) == [
        ["goals", "2", "0 of 2", "-", "-"],
        ["goals", "10", "2 of 3", "75%", "200"],
        ["behaviour", "0", "2 of 2", "50%", "300"],
    ]
    assert record_comparison.goal_rows(tmp_path, {"bc": [0]}) == []  # an agent with no evaluation


def test_a_comparison_stopped_after_an_interim_reports_it_then_continues(tmp_path):
    """`stop_after=1` of at most two interims: the first is played and reported, undecided;
    run again with it, only the report is written; without it, the second interim follows."""
    create_dataset("test/tiny-v0")
    command = [
        "trajectory_transformer.cli.compare",
        *TINY_COMPARISON,
        "compare.K=2",
        f"hydra.run.dir={tmp_path}",
    ]
    first = run_module(*command, "stop_after=1", timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "interim0-eval" in first.stdout
    assert "stopped after interim 1 of at most 2 (stop_after=1)" in first.stdout
    assert "| continue (undecided so far) | 1 |" in first.stdout
    state = json.loads((tmp_path / "compare.json").read_text())
    assert not state["finished"] and len(state["scores"]) == 1
    with open(tmp_path / "decisions.csv") as file:
        assert [row["decision"] for row in csv.DictReader(file)] == ["continue"]
    assert (tmp_path / "comparison_scores.png").is_file()

    report = run_module(*command, "stop_after=1", timeout=300)
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert "interim0-eval" not in report.stdout and "interim 2/2" not in report.stdout
    assert "| continue (undecided so far) | 1 |" in report.stdout

    rest = run_module(*command, timeout=300)
    assert rest.returncode == 0, rest.stdout[-3000:] + rest.stderr[-3000:]
    assert "interim 2/2" in rest.stdout and "stopped after" not in rest.stdout
    state = json.loads((tmp_path / "compare.json").read_text())
    assert state["finished"] and len(state["scores"]) == 2
    assert "not told apart within this budget" in rest.stdout

    # The three runs' messages outlive their terminal, each under a line naming it.
    log = (tmp_path / "compare.log").read_text()
    runs = [run.splitlines() for run in log.split("== ")[1:]]
    assert [lines[0].split(" tt-compare ")[1].endswith("stop_after=1") for lines in runs] == [
        True,
        True,
        False,
    ]
    for run, lines in zip([first, report, rest], runs, strict=True):
        terminal = run.stdout.splitlines() + run.stderr.splitlines()
        assert lines[1:] and all(line in terminal for line in lines[1:])
    assert any(line.startswith("stopped after interim 1 of at most 2") for line in runs[0])
    # The sweep's own output too: the launcher's, from the jobs' process.
    assert any("Launching" in line for line in runs[0]), runs[0]
    assert any("not told apart within this budget" in line for line in runs[2])


def test_the_log_keeps_what_a_run_said_and_the_error_that_stopped_it(tmp_path, capsys):
    log = tmp_path / "compare.log"
    log.write_text("an earlier run\n")
    with pytest.raises(ComparisonError), compare_cli.output_kept_in(log):
        print("interim 1/2")
        print("a warning", file=sys.stderr)
        raise ComparisonError("2 of 6 jobs did not finish")
    lines = log.read_text().splitlines()
    assert lines[0] == "an earlier run" and lines[1].startswith("== ")
    assert lines[2:4] == ["interim 1/2", "a warning"]
    assert lines[4].endswith("ComparisonError: 2 of 6 jobs did not finish")
    captured = capsys.readouterr()  # the terminal is told as before
    assert (captured.out, captured.err) == ("interim 1/2\n", "a warning\n")


@pytest.mark.parametrize(
    "override, message",
    [
        ("compare.K=0", "compare.K must be at least 1, got 0"),
        ("stop_after=0", "stop_after must be at least 1 interim, got 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, override, message):
    result = run_module("trajectory_transformer.cli.compare", override, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {message}"


TINY_CRITIC = [
    "critic=maze",
    "critic.steps=4",
    "critic.hidden_dim=8",
    "critic.batch_size=8",
    "critic.log_every=2",
    "device=cpu",
]
"""tt-train-critic overrides for a seconds-long critic."""


def test_four_agents_with_critics_train_each_seed_once_and_resume(tmp_path):
    """bc, the planner scored by the model's values, the planner scored by the critic, and
    the critic's IQL policy: one model and one critic per seed, shared by the agents that
    use them; a re-run runs only what is not finished."""
    create_dataset("test/tiny-v0")
    command = [
        "trajectory_transformer.cli.compare",
        "compare=critic-pointmaze-medium",
        "compare.dataset=pendulum-medium",  # the tiny dataset, its id in the train list
        *[s for s in TINY_COMPARISON if s.startswith(("compare.train", "compare.eval"))],
        "compare.n=1",
        "compare.K=1",
        "compare.B=100",
        "compare.episodes=1",
        "compare.critic=" + hydra_list(TINY_CRITIC),
        f"hydra.run.dir={tmp_path}",
    ]
    result = run_module(*command, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 trainings of models and 1 of critics (3 saved by sharing checkpoints)" in (
        result.stdout
    )
    assert "interim0-train: 1 train, 1 critic jobs" in result.stdout
    assert "| planner_critic vs iql |" in result.stdout
    state = json.loads((tmp_path / "compare.json").read_text())
    assert state["finished"] and state["trainings_run"] == 2 and state["evaluations_run"] == 4
    assert set(state["scores"][0]) == {"bc", "planner", "planner_critic", "iql"}
    (critic,) = tmp_path.glob("critics/*/seed0/critic.pt")
    (model,) = tmp_path.glob("trainings/*/seed0/model.pt")  # what the run handed over
    evaluations = tmp_path / "evaluations"
    settings = {
        agent: json.loads((evaluations / agent / "seed0" / "results.json").read_text())["settings"]
        for agent in state["scores"][0]
    }
    assert settings["iql"]["checkpoint"] == str(critic) and settings["iql"]["planner"] == {
        "agent": "iql",
        "critic": str(critic),
    }
    assert settings["planner_critic"]["checkpoint"] == str(model)
    assert settings["planner_critic"]["planner"]["critic"] == str(critic)
    assert settings["planner_critic"]["planner"]["value"] == "critic"
    assert settings["planner"]["planner"]["value"] == "model"
    # What each agent cost per seed: the trainings it used, its evaluation, its planning.
    with open(tmp_path / "agents.csv") as file:
        costs = {row["name"]: row for row in csv.DictReader(file)}
    for agent, needs in {"bc": "model", "planner_critic": "model critic", "iql": "critic"}.items():
        for need in ("model", "critic"):
            assert (costs[agent][f"{need}_minutes"] != "") == (need in needs), (agent, need)
        assert float(costs[agent]["evaluation_minutes"]) > 0
    assert float(costs["planner_critic"]["planning_ms"]) > 0
    assert "| model training (min) | critic training (min) |" in result.stdout

    # Lost: the state and one evaluation. The trainings and the other evaluations stay.
    (tmp_path / "compare.json").unlink()
    (evaluations / "iql" / "seed0" / "results.json").unlink()
    kept = {path: path.stat().st_mtime_ns for path in (critic, model)}
    again = run_module(*command, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "interim0-train:" not in again.stdout  # nothing to train
    assert "interim0-eval: 1 eval jobs" in again.stdout
    assert {path: path.stat().st_mtime_ns for path in kept} == kept
    assert json.loads((tmp_path / "compare.json").read_text())["finished"]


def test_comparisons_given_one_trainings_dir_train_what_they_share_once(tmp_path):
    """A second comparison on the same dataset and training overrides, with other agents,
    finds the first one's model in the shared folder and only evaluates."""
    create_dataset("test/tiny-v0")
    shared = tmp_path / "trainings"
    first = run_module(
        "trajectory_transformer.cli.compare",
        *TINY_COMPARISON,
        f"trainings_dir={shared}",
        f"hydra.run.dir={tmp_path / 'first'}",
        timeout=300,
    )
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"models and critics in {shared}" in first.stdout
    (model,) = shared.glob("trainings/*/seed0/model.pt")
    assert not (tmp_path / "first" / "trainings").exists()
    trained = model.stat().st_mtime_ns
    second = run_module(
        "trajectory_transformer.cli.compare",
        *TINY_COMPARISON,
        'compare.agents.planner.eval=["planner.beam_width=1"]',
        f"trainings_dir={shared}",
        f"hydra.run.dir={tmp_path / 'second'}",
        timeout=300,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "interim0-train:" not in second.stdout  # the model is the first comparison's
    assert "interim0-eval: 2 eval jobs" in second.stdout
    assert model.stat().st_mtime_ns == trained
    results = tmp_path / "second" / "evaluations" / "planner" / "seed0" / "results.json"
    settings = json.loads(results.read_text())["settings"]
    assert settings["checkpoint"] == str(model) and settings["planner"]["beam_width"] == 1


def test_trained_ahead_the_comparison_only_evaluates(tmp_path):
    """train_ahead trains every seed of every interim, models and critics, and evaluates
    nothing; the comparison run after it on those folders trains nothing."""
    create_dataset("test/tiny-v0")
    command = [
        "trajectory_transformer.cli.compare",
        "compare=critic-pointmaze-medium",  # bc, planner, planner_critic and iql
        "compare.dataset=pendulum-medium",  # the tiny dataset, its id in the train list
        *[s for s in TINY_COMPARISON if s.startswith(("compare.train", "compare.eval"))],
        "compare.n=1",
        "compare.K=2",
        "compare.B=100",
        "compare.episodes=1",
        "compare.critic=" + hydra_list(TINY_CRITIC),
        f"hydra.run.dir={tmp_path}",
    ]
    ahead = run_module(*command, "train_ahead=true", timeout=300)
    assert ahead.returncode == 0, ahead.stdout[-3000:] + ahead.stderr[-3000:]
    assert "2 models and 2 critics, seeds 0-1 (2 interims)" in ahead.stdout
    assert "ahead-train: 2 train, 2 critic jobs" in ahead.stdout
    trained = sorted(tmp_path.glob("trainings/*/seed*/model.pt"))
    critics = sorted(tmp_path.glob("critics/*/seed*/critic.pt"))
    assert (
        [p.parent.name for p in trained] == [p.parent.name for p in critics] == ["seed0", "seed1"]
    )
    assert not (tmp_path / "evaluations").exists() and not (tmp_path / "compare.json").exists()
    stamps = {path: path.stat().st_mtime_ns for path in trained + critics}
    again = run_module(*command, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "-train:" not in again.stdout  # every training was done ahead
    assert "interim0-eval: 4 eval jobs" in again.stdout
    assert {path: path.stat().st_mtime_ns for path in stamps} == stamps


def test_a_job_waits_for_the_lock_on_its_run_dir_then_skips_what_was_finished(tmp_path):
    """Two comparisons that share a training: the second job waits while the first holds the
    run directory, then finds the result and runs nothing."""
    run_dir = tmp_path / "evaluation"
    run_dir.mkdir()
    jobs_file = tmp_path / "jobs.json"
    job = {"kind": "eval", "args": ["checkpoint=missing.pt"], "run_dir": str(run_dir)}
    jobs_file.write_text(json.dumps([job]))
    with open(run_dir / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        waiting = threading.Thread(target=run_job, args=(str(jobs_file), 0))
        waiting.start()
        waiting.join(timeout=0.5)
        assert waiting.is_alive()  # blocked by the lock
        (run_dir / "results.json").write_text("{}")  # the other run finishes meanwhile
    waiting.join(timeout=10)
    assert not waiting.is_alive()
    assert not (run_dir / "job.log").exists()  # nothing was run


def eval_jobs(tmp_path, count: int) -> tuple[str, list[dict]]:
    """A sweep's jobs file of `count` evaluations, none of them done."""
    jobs = [
        {"kind": "eval", "args": [], "run_dir": str(tmp_path / f"evaluation{i}")}
        for i in range(count)
    ]
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    return str(jobs_file), jobs


def test_a_job_stopped_by_ctrl_c_stops_the_jobs_after_it(tmp_path, monkeypatch, capsys):
    """tt-train exits with 130 after Ctrl-C. A launcher whose workers go on taking jobs then
    starts nothing more: the sweep's folder holds the mark."""
    jobs_file, _ = eval_jobs(tmp_path, 2)
    monkeypatch.setattr(Job, "command", lambda self: ["-c", "import sys; sys.exit(130)"])
    run_job(jobs_file, 0)
    assert (tmp_path / INTERRUPTED).exists()
    run_job(jobs_file, 1)
    out = capsys.readouterr().out
    assert "job 0 (eval) interrupted" in out
    assert "job 1 (eval) not started: the comparison was interrupted" in out
    assert not (tmp_path / "evaluation1" / "job.log").exists()


def test_a_failed_job_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    jobs_file, _ = eval_jobs(tmp_path, 2)
    monkeypatch.setattr(Job, "command", lambda self: ["-c", "import sys; sys.exit(1)"])
    run_job(jobs_file, 0)
    run_job(jobs_file, 1)
    assert not (tmp_path / INTERRUPTED).exists()
    assert capsys.readouterr().out.count("failed with exit code 1") == 2


# The job's command: Ctrl-C is Python's KeyboardInterrupt, unless the signal is ignored; it
# takes a moment to write its checkpoint (as tt-train does), then exits with 130. It waits in
# short steps, as a training's steps are: a Ctrl-C that reaches one long sleep just after the
# SIGCONT that resumed it runs its C handler while the kernel resumes the sleep, and Python
# would raise KeyboardInterrupt only once that sleep ended.
CHECKPOINTING_CHILD = """
import os, pathlib, sys, time
pathlib.Path({ready!r}).write_text(str(os.getpid()))
try:
    for _ in range(600):
        time.sleep(0.1)
except KeyboardInterrupt:
    time.sleep(1.0)
    pathlib.Path({saved!r}).write_text("step 7")
    sys.exit(130)
"""


def stop_when_ready(process: subprocess.Popen, ready: Path, stop) -> tuple[bytes, bytes]:
    """Once `process`'s job is in its sleep (`ready` exists), `stop()` it; its output. Killed
    with its process group if it has not ended within a minute."""
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.2)  # into its sleep
        stop()
        return process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.parametrize("sweep_ignores_ctrl_c", [False, True])
def test_ctrl_c_waits_for_the_job_to_write_its_checkpoint(tmp_path, sweep_ignores_ctrl_c):
    """Ctrl-C reaches the whole process group. `subprocess.run` would kill the training a
    quarter of a second after it; the job waits for its checkpoint, then stops the sweep. A
    local launcher's processes ignore Ctrl-C (so they never kill their jobs on it): the job
    still answers it."""
    jobs_file, _ = eval_jobs(tmp_path, 1)
    saved, ready = tmp_path / "saved", tmp_path / "ready"
    child = CHECKPOINTING_CHILD.format(saved=str(saved), ready=str(ready))
    script = (
        "from trajectory_transformer.comparison.protocol import Job\n"
        "from trajectory_transformer.cli.compare import run_job\n"
        f"Job.command = lambda self: ['-c', {child!r}]\n"
        f"run_job({jobs_file!r}, 0)\n"
    )
    # Otherwise the sweep answers Ctrl-C as a terminal's process does, even where the tests
    # themselves run with it ignored (a background job of a shell without job control).
    sweep = subprocess.Popen(
        [sys.executable, "-c", script],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=(
            compare_cli.ignore_interrupts if sweep_ignores_ctrl_c else compare_cli.answer_interrupts
        ),
    )
    # What a terminal's Ctrl-C does: the signal to the whole process group.
    stdout, stderr = stop_when_ready(sweep, ready, lambda: os.killpg(sweep.pid, signal.SIGINT))
    assert saved.read_text() == "step 7"
    assert (tmp_path / INTERRUPTED).exists()
    if sweep_ignores_ctrl_c:
        assert sweep.returncode == 0 and b"job 0 (eval) interrupted" in stdout
    else:
        assert sweep.returncode != 0 and b"KeyboardInterrupt" in stderr


def test_only_a_launcher_on_this_machine_is_kept_from_ctrl_c():
    assert compare_cli.runs_jobs_here([])
    assert compare_cli.runs_jobs_here(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
    assert not compare_cli.runs_jobs_here(["hydra/launcher=submitit_slurm"])


class FakeSweep:
    """In place of the multirun process: each of its jobs runs `act`."""

    def __init__(self, act):
        self.act = act

    pid = -1  # no process group: nothing to pass a stop on to

    def __call__(self, command, preexec_fn=None, process_group=None, **pipes):
        self.command, self.preexec_fn, self.process_group = command, preexec_fn, process_group
        self.stdout, self.stderr = io.StringIO("job 0 (eval) interrupted\n"), io.StringIO()
        return self

    def poll(self):
        self.act()
        return 0


def test_the_sweeps_lines_are_passed_on_in_order_until_the_stream_closes(tmp_path):
    stream = io.StringIO()
    compare_cli.copy_lines(io.StringIO("Launching 2 jobs\njob 1 (eval) failed\n"), stream)
    assert stream.getvalue() == "Launching 2 jobs\njob 1 (eval) failed\n"
    # A line after the run's log was closed (a launcher's lingering worker) is dropped quietly.
    with open(tmp_path / "compare.log", "w") as log:
        pass
    compare_cli.copy_lines(io.StringIO("late\nlater\n"), log)  # no ValueError
    assert (tmp_path / "compare.log").read_text() == ""


def test_launch_ends_the_comparison_when_a_job_was_interrupted(tmp_path, monkeypatch, capsys):
    _, jobs = eval_jobs(tmp_path, 1)
    folder = tmp_path / "jobs" / "interim0-eval"
    folder.mkdir(parents=True)
    (folder / INTERRUPTED).touch()  # left by an earlier, interrupted run

    def the_job_is_interrupted():
        assert not (folder / INTERRUPTED).exists()  # this run starts the jobs afresh
        (folder / INTERRUPTED).touch()

    sweep = FakeSweep(the_job_is_interrupted)
    monkeypatch.setattr(compare_cli.subprocess, "Popen", sweep)
    with pytest.raises(KeyboardInterrupt):
        launch([Job(**job) for job in jobs], tmp_path, "interim0-eval", [])
    assert sweep.preexec_fn is compare_cli.ignore_interrupts  # the default launcher is local
    assert "job 0 (eval) interrupted" in capsys.readouterr().out  # the sweep's word passed on


# A comparison whose sweep is one job, the checkpointing child above, started as `launch`
# starts a sweep (its own process group, Ctrl-C ignored, the job answering it).
LAUNCHING_COMPARISON = """
import subprocess, sys
from pathlib import Path
from trajectory_transformer.cli import compare
from trajectory_transformer.comparison.protocol import Job

child = {child!r}
sweep = (
    "import subprocess, sys\\n"
    "from trajectory_transformer.cli.compare import answer_interrupts\\n"
    f"subprocess.run([sys.executable, '-c', {{child!r}}], preexec_fn=answer_interrupts)\\n"
)
start = subprocess.Popen
compare.subprocess.Popen = lambda command, **kw: start([sys.executable, "-c", sweep], **kw)
job = Job("eval", [], {run_dir!r})
try:
    compare.launch([job], Path({root!r}), "interim0-eval", [])
except KeyboardInterrupt:
    print("stopped", flush=True)
    sys.exit(130)
"""


def as_a_terminal_starts_it() -> None:
    """A shell in a terminal starts its commands answering Ctrl-C and SIGHUP, whatever this
    test run ignores (a run under `nohup` ignores SIGHUP)."""
    compare_cli.answer_interrupts()
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_comparison(tmp_path: Path, before=as_a_terminal_starts_it) -> subprocess.Popen:
    """The comparison above, its job's pid written to `ready` once it sleeps, its checkpoint to
    `saved`; `before` runs in its process before it starts."""
    child = CHECKPOINTING_CHILD.format(saved=str(tmp_path / "saved"), ready=str(tmp_path / "ready"))
    script = LAUNCHING_COMPARISON.format(
        child=child, run_dir=str(tmp_path / "evaluation0"), root=str(tmp_path)
    )
    return subprocess.Popen(
        [sys.executable, "-c", script],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=before,
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_sent_to_the_comparison_alone_reaches_its_trainings(tmp_path, stop):
    """A scheduler's SIGTERM, `kill -INT`, or a closed terminal's SIGHUP reaches tt-compare's
    process alone, not its sweep's: it passes the stop on as Ctrl-C, waits for the training's
    checkpoint, and ends the comparison; the sweep is not left running."""
    comparison = start_comparison(tmp_path)
    # The signal to the comparison's process alone.
    stdout, stderr = stop_when_ready(
        comparison, tmp_path / "ready", lambda: os.kill(comparison.pid, stop)
    )
    assert (tmp_path / "saved").read_text() == "step 7", stderr.decode()[-2000:]
    assert comparison.returncode == 130 and b"stopped" in stdout, stderr.decode()[-2000:]


def test_under_nohup_a_sighup_stops_nothing(tmp_path):
    """`nohup tt-compare ...` ignores SIGHUP, and so do its sweep and jobs: a closed terminal
    leaves the comparison running."""

    def as_nohup_starts_it() -> None:
        as_a_terminal_starts_it()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    comparison = start_comparison(tmp_path, as_nohup_starts_it)

    def hang_up_then_stop() -> None:
        os.kill(comparison.pid, signal.SIGHUP)
        time.sleep(2.0)  # an interrupted job would have written its checkpoint by now
        assert comparison.poll() is None and not (tmp_path / "saved").exists()
        os.kill(comparison.pid, signal.SIGTERM)

    stdout, stderr = stop_when_ready(comparison, tmp_path / "ready", hang_up_then_stop)
    assert (tmp_path / "saved").read_text() == "step 7", stderr.decode()[-2000:]
    assert comparison.returncode == 130 and b"stopped" in stdout


def process_state(pid: int) -> str:
    """A process's state letter (`T`: stopped), from Linux's /proc."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states in /proc")
def test_ctrl_z_pauses_the_jobs_with_the_comparison_and_fg_resumes_them(tmp_path):
    """A terminal's Ctrl-Z (SIGTSTP) reaches tt-compare's process group, not its sweep's: the
    jobs pause with it, and go on when it does (fg and bg send SIGCONT)."""
    comparison = start_comparison(tmp_path)
    ready = tmp_path / "ready"

    def becomes(pid: int, stopped: bool) -> None:
        deadline = time.monotonic() + 30
        while (process_state(pid) == "T") != stopped:
            assert time.monotonic() < deadline, f"{pid} is {process_state(pid)}"
            time.sleep(0.05)

    def pause_then_resume() -> None:
        job = int(ready.read_text())
        os.kill(comparison.pid, signal.SIGTSTP)
        becomes(comparison.pid, stopped=True)
        becomes(job, stopped=True)
        os.kill(comparison.pid, signal.SIGCONT)
        becomes(comparison.pid, stopped=False)
        becomes(job, stopped=False)
        os.kill(comparison.pid, signal.SIGTERM)

    stdout, stderr = stop_when_ready(comparison, ready, pause_then_resume)
    assert (tmp_path / "saved").read_text() == "step 7", stderr.decode()[-2000:]
    assert comparison.returncode == 130 and b"stopped" in stdout


def test_a_shared_training_made_under_other_defaults_is_refused(tmp_path):
    """A training found on disk is reused only if its overrides still compose to the settings
    it was trained with: once the defaults change, the same overrides name another model."""
    create_dataset("test/tiny-v0")
    args = [*TINY_TRAINING, "recipe=precise", "trainer.max_steps=2", "seed=0"]
    job = Job("train", args, str(tmp_path / "trainings" / "key" / "seed0"))
    trained = run_module("trajectory_transformer.cli.train", *job.args, *job.command()[-1:])
    assert trained.returncode == 0, trained.stderr[-3000:]
    compare_cli.check_trained_settings([job])  # as trained: reused

    payload = torch.load(job.checkpoint, weights_only=False)
    # A checkpoint older than a setting had that setting's default then (off).
    del payload["config"]["model"]["observation_vector"]
    torch.save(payload, job.checkpoint)
    with pytest.raises(compare_cli.ConfigError) as refused:
        compare_cli.check_trained_settings([job])
    message = str(refused.value)
    assert "model.observation_vector: trained False, now True" in message
    assert str(job.run_dir) in message and "\n" not in message

    payload["config"]["model"]["observation_vector"] = True
    payload["config"]["trainer"]["learning_rate"] = 6e-4
    torch.save(payload, job.checkpoint)
    with pytest.raises(compare_cli.ConfigError, match=r"trainer\.learning_rate: trained 0\.0006"):
        compare_cli.check_trained_settings([job])
    # Overrides that give the settings it was trained with find it again.
    again = Job("train", [*args, "trainer.learning_rate=6e-4"], job.run_dir)
    compare_cli.check_trained_settings([again])

    # A training with windows that go on past their goal, from before their rewards' scale was
    # a setting, had raw ones; today's default scales them.
    payload["config"]["dataset"]["relabel_reached"] = 0.25
    del payload["config"]["dataset"]["relabel_continuing_rewards"]
    torch.save(payload, job.checkpoint)
    reaching = [*again.args, "dataset.relabel_reached=0.25"]
    with pytest.raises(
        compare_cli.ConfigError,
        match=r"dataset\.relabel_continuing_rewards: trained 'raw', now 'scaled'",
    ):
        compare_cli.check_trained_settings([Job("train", reaching, job.run_dir)])
    raw = [*reaching, "dataset.relabel_continuing_rewards=raw"]
    compare_cli.check_trained_settings([Job("train", raw, job.run_dir)])
