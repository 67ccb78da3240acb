"""`tt-compare`: compare agents with AdaStop, training and evaluating through Hydra's launcher.

Each interim's jobs (tt-train runs, then tt-eval runs) are launched as one Hydra multirun of
this same command in job mode (`job.file`, `job.index`), so whatever launcher the user picks
runs them: in sequence by default, `hydra/launcher=joblib` in parallel on this machine,
`hydra/launcher=submitit_slurm` on a cluster. The comparison's state lives in `compare.json`
in its run directory; running the same command again continues it.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import IO

from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trajectory_transformer.checkpoint import BEHAVIOUR
from trajectory_transformer.cli import schemas
from trajectory_transformer.cli.common import (
    INTERRUPTED_EXIT_CODE,
    ConfigError,
    check_settings,
    command,
    compose,
    override_error,
)
from trajectory_transformer.comparison.protocol import (
    NEEDS,
    AgentSpec,
    ComparisonError,
    ComparisonSpec,
    ComparisonState,
    Decider,
    Interim,
    Job,
    agents_markdown,
    check_one_reference,
    decisions_markdown,
    describe_reference,
    plan_interim,
    read_reference,
    read_score,
    summarize,
)
from trajectory_transformer.data import reference_scores
from trajectory_transformer.data.goals import continuing_rewards_of
from trajectory_transformer.data.minari_source import local_eval_env_id
from trajectory_transformer.data.reference_scores import ReferenceScoreError


def spec_of(cfg: DictConfig) -> ComparisonSpec:
    """The comparison of a `compare` config, whose agents are a mapping from name."""
    c = OmegaConf.to_container(cfg, resolve=True)
    c["agents"] = [{"name": name, **agent} for name, agent in c["agents"].items()]
    return ComparisonSpec.from_dict(c)


def compose_checked(config_name: str, overrides: list[str]) -> DictConfig:
    """A command's config as its command line would compose and check it; a ConfigError
    otherwise."""
    try:
        cfg = compose(config_name, overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as error:
        raise ConfigError(override_error(error, config_name, overrides)) from None
    check_settings(cfg)
    return cfg


def comparison_dataset(spec: ComparisonSpec) -> DictConfig:
    """The `dataset` of tt-train's config with the comparison's `dataset` preset and shared
    `train` overrides: the one the critics train on."""
    try:
        cfg = compose_checked("train", [f"dataset={spec.dataset}", *spec.train, "seed=0"])
    except ConfigError as error:
        raise ConfigError(f"tt-train would reject the comparison's dataset: {error}") from None
    return cfg.dataset


def critic_dataset(dataset: DictConfig) -> list[str]:
    """tt-train-critic's overrides that name tt-train's `dataset`."""
    overrides = [f"dataset.id={dataset.id}"]
    if dataset.download:
        overrides.append("dataset.download=true")
    if dataset.env_id is not None:
        overrides.append(f"dataset.env_id={dataset.env_id}")
    return overrides


def check_agents(spec: ComparisonSpec, dataset: DictConfig) -> None:
    """Compose every agent's tt-train, tt-train-critic and tt-eval configs now, so that an
    override they would reject stops the comparison before any training; check that every
    agent's evaluations use what it has trained (`check_needs`) and that its model is trained
    on the critics' `dataset`; and that every agent's scores will be normalised by the same
    reference scores (see `reference_of`)."""
    references, warnings = {}, set()
    for agent in spec.agents:
        programs = [("tt-train", "train", [*spec.training_overrides(agent), "seed=0"])]
        if "critic" in agent.needs:
            critic = [*spec.critic_overrides(agent, critic_dataset(dataset)), "seed=0"]
            programs.append(("tt-train-critic", "train_critic", critic))
        programs.append(("tt-eval", "eval", ["checkpoint=unused", *spec.eval, *agent.eval]))
        for program, name, overrides in programs:
            try:
                cfg = compose_checked(name, overrides)
                if name == "train":
                    trained_on = cfg.dataset
                elif name == "eval":
                    evaluation = cfg
                    references[agent.name], warning = reference_of(cfg.eval, trained_on)
                    warnings.add(warning)
            except (ConfigError, ReferenceScoreError) as error:
                raise ConfigError(
                    f"agent {agent.name}: {program} would reject {' '.join(overrides)}: {error}"
                ) from None
        check_needs(agent, evaluation, trained_on)
        if "model" in agent.needs and "critic" in agent.needs and trained_on.id != dataset.id:
            raise ConfigError(
                f"agent {agent.name} trains its model on {trained_on.id}, its critic on the "
                f"comparison's dataset {dataset.id}; change the dataset in the comparison's "
                "`dataset` or shared `train`, not per agent"
            )
    if len(set(references.values())) > 1:
        shown = ", ".join(f"{name}: {reference}" for name, reference in references.items())
        raise ConfigError(
            f"the agents would be normalised by different reference scores ({shown}); set "
            "eval.ref_min_score/eval.ref_max_score or eval.reference in the comparison's "
            "shared `eval` list, not per agent"
        )
    for warning in sorted(filter(None, warnings)):
        print(warning, file=sys.stderr)


TRAINED_SETTINGS = {
    "train": ("train", schemas.TrainConfig, ("dataset", "model", "trainer", "seed")),
    "critic": ("train_critic", schemas.TrainCriticConfig, ("dataset", "critic", "seed")),
}
"""Per kind of training: its command's config, schema, and the settings that make the model."""


def flat(config: dict, prefix: str = "") -> dict[str, object]:
    """`{"a": {"b": 1}}` as `{"a.b": 1}`."""
    items: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            items.update(flat(value, f"{prefix}{key}."))
        else:
            items[f"{prefix}{key}"] = value
    return items


def check_trained_settings(trainings: list[Job]) -> None:
    """Refuse a training on disk (finished, or to be resumed) whose settings differ from what
    its overrides compose to now. Trainings are shared by their overrides: once the defaults
    change (a new version), the same overrides name another training, and the folder holds
    the old one. A setting that an older checkpoint lacks had its default then (the rewards
    past a relabelled goal: raw)."""
    for job in trainings:
        saved = job.saved_config()
        if saved is None:
            continue
        name, schema, sections = TRAINED_SETTINGS[job.kind]
        now = OmegaConf.to_container(compose_checked(name, job.args), resolve=True)
        then = flat(OmegaConf.to_container(OmegaConf.structured(schema))) | flat(saved)
        if (scale := continuing_rewards_of(saved.get("dataset", {}))) is not None:
            then["dataset.relabel_continuing_rewards"] = scale  # raw where it names none
        differences = [
            f"{key}: trained {then.get(key)!r}, now {value!r}"
            for key, value in flat({key: now[key] for key in sections}).items()
            if then.get(key) != value
        ]
        if differences:
            raise ConfigError(
                f"{job.run_dir} was trained with other settings than its overrides give now "
                f"({'; '.join(differences)}): the defaults have changed since. Move that "
                "folder away to train it again, or give the comparison another trainings_dir"
            )


def check_needs(agent: AgentSpec, evaluation: DictConfig, dataset: DictConfig) -> None:
    """An agent's evaluations use exactly what it has trained: nothing where it plays the
    behaviour policy of the comparison's `dataset` (`checkpoint=behaviour:<id>`), a model
    unless it plays the IQL policy (`planner=iql`), and a critic where that policy plays or the
    critic scores the beams (`planner.value=critic`). The critic's path is each seed's, set by
    tt-compare."""
    planner = evaluation.planner
    if not agent.needs:  # AgentSpec.check: its eval names a checkpoint
        if evaluation.checkpoint != f"{BEHAVIOUR}{dataset.id}":
            raise ConfigError(
                f"agent {agent.name} trains nothing: it can play the behaviour policy of the "
                f"comparison's dataset, checkpoint={BEHAVIOUR}{dataset.id}, not "
                f"checkpoint={evaluation.checkpoint}"
            )
        return
    if planner.critic is not None:
        raise ConfigError(
            f"agent {agent.name}: planner.critic={planner.critic} would score every seed with "
            "one critic; drop it and add critic to the agent's needs, which trains one per seed"
        )
    if planner.agent == "iql":
        used, why = {"critic"}, "planner=iql plays a critic's policy, with no model"
    else:
        used = {"model", "critic"} if planner.value == "critic" else {"model"}
        why = f"its planner scores beams with the {planner.value}'s values"
    if set(agent.needs) != used:
        raise ConfigError(
            f"agent {agent.name}: {why}, so it needs [{', '.join(n for n in NEEDS if n in used)}]"
            f", not {list(agent.needs)}"
        )


def reference_of(eval_cfg: DictConfig, dataset: DictConfig) -> tuple[str, str | None]:
    """(the reference scores an agent's evaluations will ask for, in words; the warning tt-eval
    will print), checked as tt-eval checks them (`data/reference_scores.py`) before any
    training. The dataset's own scores are known only once it is loaded, the same for all."""
    low, high = eval_cfg.ref_min_score, eval_cfg.ref_max_score
    reference_scores.check_request(low, high, eval_cfg.reference)
    if low is not None:
        return f"{reference_scores.EXPLICIT} ({float(low)} to {float(high)})", None
    if eval_cfg.reference != "d4rl":
        return "the dataset's own", None
    # tt-eval's env: eval.env_id, else the checkpoint's (dataset.env_id, else the dataset's).
    env_id = eval_cfg.env_id or dataset.env_id or local_eval_env_id(dataset.id)
    family, low, high = reference_scores.d4rl_row(env_id, dataset.id)
    warning = reference_scores.d4rl_warning(family, env_id)
    return f"{reference_scores.D4RL_V2} {family} ({low} to {high})", warning


def launcher_overrides() -> list[str]:
    """The user's choice of launcher and its settings, passed on to the jobs' multirun."""
    return [
        override
        for override in HydraConfig.get().overrides.hydra
        if override.startswith(("hydra/launcher", "hydra.launcher"))
    ]


INTERRUPTED = "interrupted"
"""Left in a sweep's folder by a job that Ctrl-C stopped: the sweep's jobs not yet started then
start nothing (a launcher's workers may go on taking jobs), and the comparison ends."""

SWEEP_POLL_SECONDS = 0.1
"""How often tt-compare looks whether its sweep has ended, and so the longest a stop can wait."""

SWEEP_OUTPUT_SECONDS = 5.0
"""How long tt-compare waits, after its sweep has ended, for the rest of the sweep's output."""

INTERRUPTED_MESSAGE = (
    "interrupted: the trainings that were running wrote their checkpoints, and finished "
    "trainings and evaluations are kept. Run the same command again to continue."
)


def ignore_interrupts() -> None:
    """In a local sweep's process, before it starts: a launcher that saw Ctrl-C would kill its
    jobs, trainings included, before their checkpoints are written; the jobs answer it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def answer_interrupts() -> None:
    """In a job's process, before it starts: Ctrl-C is its to answer, whatever its launcher
    ignores."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def runs_jobs_here(launcher: list[str]) -> bool:
    """Whether the launcher runs the jobs on this machine, in reach of this terminal's Ctrl-C
    (Hydra's default launcher, or joblib's), rather than on a cluster."""
    chosen = [o.split("=", 1)[1] for o in launcher if o.startswith("hydra/launcher=")]
    return not chosen or chosen[-1] in ("basic", "joblib")


def wait_through_interrupt(process: subprocess.Popen) -> int:
    """Wait for `process` to end and return its exit code. Ctrl-C reaches it too (one process
    group), and a training answers by writing its checkpoint: wait for that before passing
    the interrupt on, where `subprocess.run` would kill it after a quarter of a second. A
    second Ctrl-C stops the training at once, and this wait with it."""
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.wait()
        raise


def wait_passing_stops_on(sweep: subprocess.Popen) -> bool:
    """Wait for `sweep`, a process group of its own, to end; returns whether this process was
    asked to stop meanwhile. Ctrl-C and SIGTERM to this process alone (a terminal's Ctrl-C, a
    scheduler's or `kill`'s SIGTERM) are passed on to the sweep's whole group as Ctrl-C, which
    its trainings answer by writing their checkpoints: the sweep is waited for, never left
    running as orphans. So is a closed terminal's SIGHUP, which reaches only the terminal's
    foreground group, unless this process ignores it (`nohup`: the sweep ignores it too). A
    second stop is passed on too, and stops them at once. A terminal's Ctrl-Z pauses the
    sweep with this process, and `fg` or `bg` resumes both."""
    stops = []

    def to_sweep(signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # the sweep has just ended
            os.killpg(sweep.pid, signum)

    def pass_on(signum, frame) -> None:
        stops.append(signum)
        to_sweep(signal.SIGINT)

    def pause(signum, frame) -> None:
        to_sweep(signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)

    handlers = {
        signal.SIGINT: pass_on,
        signal.SIGTERM: pass_on,
        signal.SIGTSTP: pause,
        signal.SIGCONT: lambda signum, frame: to_sweep(signal.SIGCONT),
    }
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        handlers[signal.SIGHUP] = pass_on
    previous = {number: signal.signal(number, handler) for number, handler in handlers.items()}
    try:
        # Polled, not one blocking wait: Python runs a handler between bytecodes, so a stop
        # that arrives just after another handler's last one (`fg`'s SIGCONT) and before the
        # wait resumes would sit in a blocking waitpid until the sweep ended by itself.
        while sweep.poll() is None:
            time.sleep(SWEEP_POLL_SECONDS)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    return bool(stops)


def copy_lines(pipe: IO[str], stream: IO[str]) -> None:
    """Write each line read from `pipe` to `stream` as it comes, until the pipe closes, or
    until `stream` is closed (a launcher's worker that said something after the run ended)."""
    for line in pipe:
        try:
            stream.write(line)
            stream.flush()
        except ValueError:  # I/O on a closed file
            return


def launch(jobs: list[Job], root: Path, label: str, launcher: list[str]) -> int:
    """Run the jobs not done yet as one multirun of this command, with the `launcher`
    overrides; returns how many ran."""
    pending = [job for job in jobs if not job.done()]
    if not pending:
        return 0
    folder = root / "jobs" / label
    folder.mkdir(parents=True, exist_ok=True)
    jobs_file = folder / "jobs.json"
    jobs_file.write_text(json.dumps([asdict(job) for job in pending], indent=2) + "\n")
    command = [
        sys.executable,
        "-m",
        "trajectory_transformer.cli.compare",
        "--multirun",
        f"job.file={jobs_file}",
        f"job.index={','.join(str(i) for i in range(len(pending)))}",
        f"hydra.sweep.dir={folder}",
        *launcher,
    ]
    kinds = Counter(job.kind for job in pending)
    print(f"{label}: {', '.join(f'{n} {kind}' for kind, n in kinds.items())} jobs", flush=True)
    interrupted = folder / INTERRUPTED
    interrupted.unlink(missing_ok=True)  # a previous run's: this one continues it
    here = runs_jobs_here(launcher)
    # The sweep's own output (the launcher's, each job's one-line outcome) is passed on through
    # this process's streams, so that compare.log keeps it too.
    sweep = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=ignore_interrupts if here else None,
        process_group=0,
    )
    copies = [
        threading.Thread(target=copy_lines, args=(pipe, stream), daemon=True)
        for pipe, stream in ((sweep.stdout, sys.stdout), (sweep.stderr, sys.stderr))
    ]
    for copy in copies:
        copy.start()
    stopped = wait_passing_stops_on(sweep)
    for copy in copies:  # a launcher's worker that outlives the sweep may hold a pipe open
        copy.join(timeout=SWEEP_OUTPUT_SECONDS)
    if stopped or interrupted.exists():
        raise KeyboardInterrupt
    failed = [job for job in pending if not job.done()]
    if failed:
        raise ComparisonError(
            f"{len(failed)} of {len(pending)} jobs of {label} did not finish; see job.log in "
            f"{', '.join(job.run_dir for job in failed[:3])}. Run the same command again to "
            "continue: finished jobs are not run again."
        )
    return len(pending)


def run_job(jobs_file: str, index: int) -> None:
    """Job mode: run job `index` of `jobs_file`, its output in `<run dir>/job.log`. A training
    (of a model or a critic) that was interrupted continues from its checkpoint. The job holds
    a lock on its run directory: another comparison that shares its trainings waits for it,
    then finds the training finished. After Ctrl-C the job waits for its training's checkpoint,
    and the sweep's jobs not yet started start nothing."""
    job = Job(**json.loads(Path(jobs_file).read_text())[index])
    folder = Path(job.run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    interrupted = Path(jobs_file).parent / INTERRUPTED
    with open(folder / ".lock", "w") as lock:
        with contextlib.suppress(OSError):  # a file system without locks: run unguarded
            fcntl.flock(lock, fcntl.LOCK_EX)
        if interrupted.exists():
            print(f"job {index} ({job.kind}) not started: the comparison was interrupted")
            return
        if job.done():
            print(f"job {index} ({job.kind}) was finished by another run: {folder}")
            return
        args = job.command()
        if job.checkpoint is not None and job.checkpoint.is_file():
            args.append(f"resume={job.checkpoint}")
        with open(folder / "job.log", "w") as log:
            try:
                process = subprocess.Popen(
                    [sys.executable, *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=answer_interrupts,
                )
                returncode = wait_through_interrupt(process)
            except KeyboardInterrupt:
                interrupted.touch()
                raise
    if returncode in (INTERRUPTED_EXIT_CODE, -signal.SIGINT):  # a training's answer, or the signal
        interrupted.touch()
        print(f"job {index} ({job.kind}) interrupted: {folder}")
    elif returncode != 0:
        print(f"job {index} ({job.kind}) failed with exit code {returncode}: {folder}")


def run_interim(
    interim: Interim, root: Path, launcher: list[str]
) -> tuple[dict[str, dict[str, float]], bool, dict | None]:
    """Every agent's score per seed, whether all of them are normalised scores, and the one
    reference that normalised them all (an error when the evaluations disagree)."""
    launch(interim.trainings, root, f"interim{interim.index}-train", launcher)
    evaluations = [job for jobs in interim.evaluations.values() for job in jobs.values()]
    launch(evaluations, root, f"interim{interim.index}-eval", launcher)
    reference = check_one_reference({job.run_dir: read_reference(job) for job in evaluations})
    read = {
        agent: {str(seed): read_score(job) for seed, job in jobs.items()}
        for agent, jobs in interim.evaluations.items()
    }
    scores = {
        agent: {seed: s for seed, (s, _) in by_seed.items()} for agent, by_seed in read.items()
    }
    normalized = all(n for by_seed in read.values() for _, n in by_seed.values())
    return scores, normalized, reference


def train_ahead(
    spec: ComparisonSpec,
    interims: range,
    root: Path,
    critic_data: list[str],
    trainings_root: Path,
    launcher: list[str],
) -> None:
    """The models and critics of every agent's seeds in `interims`, as one multirun, so that
    a machine made for training runs them all side by side; nothing evaluated."""
    trainings: list[Job] = []
    for index in interims:
        trainings += plan_interim(
            spec, index, spec.names, root, critic_data, trainings_root
        ).trainings
    critics = sum(job.kind == "critic" for job in trainings)
    seeds = f"{spec.seeds(interims[0]).start}-{spec.seeds(interims[-1]).stop - 1}"
    print(
        f"training ahead for {spec.dataset}: {len(trainings) - critics} models and {critics} "
        f"critics, seeds {seeds} ({len(interims)} interims), in {trainings_root}; nothing "
        "is evaluated",
        flush=True,
    )
    check_trained_settings(trainings)
    ran = launch(trainings, root, "ahead-train", launcher)
    print(
        f"trained ahead: {ran} trainings run, {len(trainings) - ran} found finished. The same "
        "command without train_ahead, given these folders, evaluates and decides.",
        flush=True,
    )


def compare(cfg: DictConfig, root: Path, launcher: list[str]) -> ComparisonState | None:
    """Run (or continue) the comparison `cfg.compare` in `root`, its jobs launched with the
    `launcher` overrides; None when it only trains ahead (`train_ahead`)."""
    spec = spec_of(cfg.compare)
    try:
        spec.validate()
    except ComparisonError as error:
        raise ConfigError(str(error)) from None
    if cfg.stop_after is not None and cfg.stop_after < 1:
        raise ConfigError(f"stop_after must be at least 1 interim, got {cfg.stop_after}")
    dataset = comparison_dataset(spec)
    check_agents(spec, dataset)
    trainings_root = root if cfg.trainings_dir is None else Path(cfg.trainings_dir).resolve()
    critic_data = critic_dataset(dataset)  # tt-train-critic overrides naming the dataset
    if cfg.train_ahead:
        interims = range(min(spec.K, cfg.stop_after or spec.K))
        train_ahead(spec, interims, root, critic_data, trainings_root, launcher)
        return None
    state = ComparisonState.load_or_start(root, spec)
    decider = Decider(spec, state)
    print(
        f"comparing {', '.join(spec.names)} on {spec.dataset}: n={spec.n} seeds per interim, "
        f"at most K={spec.K} interims, alpha={spec.alpha}; state in {root / 'compare.json'}"
        + ("" if trainings_root == root else f"; models and critics in {trainings_root}")
    )
    while not decider.finished and (cfg.stop_after is None or len(state.scores) < cfg.stop_after):
        index = len(state.scores)
        interim = plan_interim(spec, index, decider.playing(), root, critic_data, trainings_root)
        critics = sum(job.kind == "critic" for job in interim.trainings)
        print(
            f"interim {index + 1}/{spec.K}: {', '.join(interim.evaluations)} on seeds "
            f"{spec.seeds(index).start}-{spec.seeds(index).stop - 1}: "
            f"{len(interim.trainings) - critics} trainings of models and {critics} of critics "
            f"({interim.shared} saved by sharing checkpoints), "
            f"{sum(map(len, interim.evaluations.values()))} evaluations",
            flush=True,
        )
        check_trained_settings(interim.trainings)
        scores, normalized, reference = run_interim(interim, root, launcher)
        if state.scores and state.reference not in (None, reference):
            raise ComparisonError(
                f"interim {index + 1} was scored as {describe_reference(reference)}, the "
                f"interims before it as {describe_reference(state.reference)}; run the "
                "comparison as it was, or in another run directory (hydra.run.dir=...)"
            )
        state.normalized = state.normalized and normalized
        state.reference = reference if state.normalized else None
        state.trainings_run += len(interim.trainings)
        state.trainings_shared += interim.shared
        state.evaluations_run += sum(map(len, interim.evaluations.values()))
        decider.add_interim(scores)
        state.save(root)
        undecided = [pair for pair, d in state.decisions.items() if d == "continue"]
        print(f"after interim {index + 1}: {len(undecided)} comparisons undecided", flush=True)
    if not decider.finished:
        print(
            f"stopped after interim {len(state.scores)} of at most {spec.K} (stop_after="
            f"{cfg.stop_after}): the decisions so far; the same command without stop_after "
            "continues",
            flush=True,
        )
    costs: dict[str, dict[str, dict]] = {}
    for index, played in enumerate(state.scores):  # each interim's jobs, planned again
        interim = plan_interim(spec, index, list(played), root, critic_data, trainings_root)
        for agent, by_seed in interim.costs().items():
            costs.setdefault(agent, {}).update(by_seed)
    report(spec, state, root, costs)
    state.save(root)
    return state


def report(spec: ComparisonSpec, state: ComparisonState, root: Path, costs: dict) -> None:
    """The decisions and per-agent statistics and costs (`Interim.costs` of every interim):
    markdown here, CSV and figures in `root`."""
    from trajectory_transformer import viz  # matplotlib only here

    agents, rows = summarize(spec, state, costs=costs)
    print(decisions_markdown(rows, state.normalized, state.reference))
    print(agents_markdown(agents))
    print(
        f"{state.trainings_run} trainings ({state.trainings_shared} more saved by sharing "
        f"checkpoints between agents) and {state.evaluations_run} evaluations"
    )
    with open(root / "decisions.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(root / "agents.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(asdict(agents[0])))
        writer.writeheader()
        writer.writerows(asdict(agent) for agent in agents)
    values = state.values(spec.names)
    unit = "normalised score" if state.normalized else "return"
    figures = {
        "comparison_scores.png": viz.plot_comparison_scores(values, rows, unit),
        "comparison_iqm.png": viz.plot_iqm_intervals(
            [a.name for a in agents],
            [a.iqm for a in agents],
            [(a.iqm_low, a.iqm_high) for a in agents],
            unit,
        ),
        "comparison_profile.png": viz.plot_performance_profile(values, unit),
    }
    for name, figure in figures.items():
        figure.savefig(root / name, dpi=110)
    print(f"tables and figures: {root}/decisions.csv, agents.csv, comparison_*.png")


class Tee:
    """A text stream that writes to `stream` and to `copy`."""

    def __init__(self, stream, copy) -> None:
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.copy.flush()
        self.stream.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding: the terminal's
        return getattr(self.stream, name)


@contextlib.contextmanager
def output_kept_in(path: Path) -> Iterator[None]:
    """This run's messages (stdout and stderr: interims, decisions, errors) also appended to
    `path`, under a line naming the run, so that they outlive the terminal that started a
    comparison of hours; `launch` passes the sweeps' output on through them. The jobs' own
    output is in their `job.log`s."""
    # Line-buffered: each line is on disk as soon as it is said, in order with Hydra's own
    # log handler on the same file, and kept if the run is killed.
    with open(path, "a", buffering=1) as log:
        started = datetime.now().isoformat(sep=" ", timespec="seconds")
        log.write(f"== {started} tt-compare {' '.join(sys.argv[1:])}\n")
        with (
            contextlib.redirect_stdout(Tee(sys.stdout, log)),
            contextlib.redirect_stderr(Tee(sys.stderr, log)),
        ):
            try:
                yield
            except Exception as error:  # printed by the command after this ends
                log.write("".join(traceback.format_exception_only(error)))
                raise


@command("compare")
def main(cfg: DictConfig) -> None:
    if cfg.job.file is not None:
        run_job(cfg.job.file, cfg.job.index)
        return
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stop, as Ctrl-C is
    root = Path(HydraConfig.get().runtime.output_dir)
    with output_kept_in(root / "compare.log"):
        try:
            compare(cfg, root, launcher_overrides())
        except KeyboardInterrupt:
            print(INTERRUPTED_MESSAGE, file=sys.stderr)
            sys.exit(INTERRUPTED_EXIT_CODE)


if __name__ == "__main__":
    main()
