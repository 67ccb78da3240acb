"""Statistically sound comparisons of agents with AdaStop: the plan of jobs, the state that
survives interruptions, and the decisions.

AdaStop (Mathieu et al., "AdaStop: adaptive statistical testing for sound comparisons of Deep
RL agents") is a sequential permutation test over several agents at once. At each of at most
`K` interims, every agent still in an undecided comparison gets `n` more training seeds; the
test then decides the comparisons it can (`larger`, `smaller`, or, at the last interim,
`equal`: not told apart within this budget) with the family-wise error bounded by `alpha`.

An agent is what its evaluations need trained per seed (a model of tt-train, a critic of
tt-train-critic, or both), the overrides of those trainings, and a set of tt-eval overrides.
Its score for one training seed is the mean normalised score of `episodes` evaluation episodes
(the mean return where the dataset has no reference scores). Agents whose training overrides
are the same share their trained checkpoints: a model (or a critic) is trained once per
(training config, seed), and each planner variant only evaluates.

This module runs nothing: `cli/compare.py` launches the jobs (through Hydra's launcher) and
calls back here. The state is plain JSON (`compare.json`); the comparator is rebuilt by
replaying the stored scores, with no pickles.
"""

from __future__ import annotations

import hashlib
import json
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trajectory_transformer.checkpoint import read_payload
from trajectory_transformer.comparison.statistics import (
    iqm,
    mean,
    probability_of_improvement,
    stratified_bootstrap_ci,
)
from trajectory_transformer.critic.model import read_critic_payload

STATE_FILE = "compare.json"
EQUAL_MEANS = "not told apart within this budget"
AGENT_SEED_STRIDE = 1_000_000
"""Under `independent` pairing, agent i trains on seeds from `i * AGENT_SEED_STRIDE` on."""
MOST_SEEDS, MOST_INTERIMS = 1_000, 100
"""Bounds of `n` and `K`: at most 100,000 seeds an agent, below `AGENT_SEED_STRIDE`."""
MOST_PERMUTATIONS = 10_000_000
"""Bound of `B`."""
NEEDS = ("model", "critic")
"""What an agent's evaluations can need trained per seed."""


class ComparisonError(ValueError):
    """A comparison that cannot run as given; the message says what to change."""


@dataclass(frozen=True)
class AgentSpec:
    name: str
    """The agent's name in tables and figures."""
    needs: tuple[str, ...] = ("model",)
    """What is trained for it per seed: `model` (tt-train's checkpoint.pt, tt-eval's
    `checkpoint`) and/or `critic` (tt-train-critic's critic.pt, given to tt-eval as
    `planner.critic`, or as `checkpoint` to an agent with no model: `planner=iql`); or
    nothing, for an agent whose `eval` names what it plays (the dataset's behaviour policy,
    `checkpoint=behaviour:<dataset id>`), its seed k drawing its noise (`planner.seed=k`)."""
    train: tuple[str, ...] = ()
    """tt-train overrides of this agent, after the comparison's `train`, e.g.
    `[model.embedding_dim=128]`. Agents with the same training overrides share checkpoints."""
    critic: tuple[str, ...] = ()
    """tt-train-critic overrides of this agent, after the comparison's `critic`. Agents with
    the same critic overrides share critics."""
    eval: tuple[str, ...] = ()
    """tt-eval overrides of this agent, after the comparison's `eval`, e.g. `[planner=bc]`."""

    def check(self) -> None:
        """Raise `ComparisonError` for needs that name nothing trainable, or overrides of a
        training the agent does not need."""
        needs = list(self.needs)
        if len(set(needs)) != len(needs) or not set(needs) <= set(NEEDS):
            raise ComparisonError(
                f"agent {self.name}: needs takes model and/or critic (or nothing), got {needs}"
            )
        names_checkpoint = any(override.startswith("checkpoint=") for override in self.eval)
        if not needs and not names_checkpoint:
            raise ComparisonError(
                f"agent {self.name} needs nothing trained, so its eval must name what it plays, "
                "e.g. checkpoint=behaviour:<dataset id> (the policy that made the dataset)"
            )
        if needs and names_checkpoint:
            raise ComparisonError(
                f"agent {self.name}: tt-compare gives each seed's evaluation the {needs[0]} "
                "trained for it; drop checkpoint= from its eval, or its needs for one it plays"
            )
        for kind, overrides in (("model", self.train), ("critic", self.critic)):
            if overrides and kind not in needs:
                key = "train" if kind == "model" else "critic"
                raise ComparisonError(
                    f"agent {self.name}: {key} overrides {list(overrides)} for a {kind} it "
                    f"does not need; add {kind} to its needs or drop them"
                )


@dataclass(frozen=True)
class ComparisonSpec:
    """What is compared, and how (the `compare` config group of tt-compare)."""

    dataset: str
    """The shared dataset: a tt-train `dataset` preset (configs/dataset/)."""
    agents: tuple[AgentSpec, ...]
    """The agents; in a config, a mapping from name to its overrides."""
    n: int = 5
    """Training seeds per agent per interim."""
    K: int = 3
    """Most interims; an agent gets at most n * K seeds."""
    alpha: float = 0.05
    """Family-wise error of all the comparisons together."""
    B: int = 10_000
    """Random permutations approximating AdaStop's permutation distribution."""
    seed: int = 0
    """Seed of the permutations and of the bootstrap intervals."""
    episodes: int = 10
    """Evaluation episodes per trained seed; their mean is the seed's score."""
    compare_to: str | None = None
    """One baseline agent compared with each other; None compares every pair."""
    train: tuple[str, ...] = ()
    """tt-train overrides shared by every agent (the training budget, say)."""
    eval: tuple[str, ...] = ()
    """tt-eval overrides shared by every agent."""
    critic: tuple[str, ...] = ()
    """tt-train-critic overrides shared by every agent that needs a critic (e.g.
    `[critic=maze]`); the critic's dataset is the models' (see `plan_interim`)."""
    pairing: str = "shared"
    """`shared`: agents whose training overrides are the same share their trained checkpoints
    (seed k is one model, and one critic, for all of them), and every agent plays the same
    episode seeds. Their scores on a seed are then paired samples, while AdaStop assumes
    independent ones: its decisions keep their error bound (the test is conservative), but it
    may need more seeds to decide. `independent`: every agent trains its own models and critics
    on seeds of its own (agent i's seed k is `k + i * AGENT_SEED_STRIDE`) and plays episodes of
    its own (seeded from `i * AGENT_SEED_STRIDE`), so that its samples are independent of the
    others', at the cost of a training per agent and seed."""

    PAIRINGS: typing.ClassVar[tuple[str, ...]] = ("shared", "independent")

    def validate(self) -> None:
        """Raise `ComparisonError` for a comparison that cannot run, before any job."""
        for agent in self.agents:
            agent.check()
        names = self.names
        if len(names) < 2:
            raise ComparisonError(
                f"a comparison needs at least two agents, got {len(names)} ({', '.join(names)})"
            )
        if len(set(names)) != len(names):
            raise ComparisonError(f"agent names repeat: {', '.join(names)}")
        for name, value in (("n", self.n), ("K", self.K), ("episodes", self.episodes)):
            if value < 1:
                raise ComparisonError(f"compare.{name} must be at least 1, got {value}")
        # Every job of an interim is planned, and each agent's seeds listed, before any runs:
        # far past what a machine can train, that alone would take the memory.
        for name, value, most in (("n", self.n, MOST_SEEDS), ("K", self.K, MOST_INTERIMS)):
            if value > most:
                raise ComparisonError(
                    f"compare.{name} must be at most {most:,} (each agent trains compare.n "
                    f"seeds in each of at most compare.K interims), got {value:,}"
                )
        if not 0.0 < self.alpha < 1.0:
            raise ComparisonError(f"compare.alpha must be in (0, 1), got {self.alpha}")
        if not 1 <= self.B <= MOST_PERMUTATIONS:
            raise ComparisonError(
                f"compare.B must be in [1, {MOST_PERMUTATIONS:,}] (AdaStop's permutations), "
                f"got {self.B:,}"
            )
        if self.pairing not in self.PAIRINGS:
            raise ComparisonError(
                f"compare.pairing must be one of {', '.join(self.PAIRINGS)}, got {self.pairing!r}"
            )
        if self.compare_to is not None and self.compare_to not in names:
            raise ComparisonError(
                f"compare.compare_to={self.compare_to!r} names no agent; agents: {', '.join(names)}"
            )

    @property
    def names(self) -> list[str]:
        return [agent.name for agent in self.agents]

    def pairs(self) -> list[tuple[int, int]]:
        """The comparisons, as agent indices: every pair, or the baseline against each."""
        count = len(self.agents)
        if self.compare_to is None:
            return [(i, j) for i in range(count) for j in range(i + 1, count)]
        base = self.names.index(self.compare_to)
        return [(base, j) for j in range(count) if j != base]

    def training_overrides(self, agent: AgentSpec) -> list[str]:
        return [f"dataset={self.dataset}", *self.train, *agent.train]

    def training_key(self, agent: AgentSpec) -> str:
        """Agents whose training overrides are the same share this key, and the checkpoints,
        unless each trains its own (`independent` pairing)."""
        return self._key(agent, self.training_overrides(agent))

    def critic_overrides(self, agent: AgentSpec, dataset: Sequence[str]) -> list[str]:
        """tt-train-critic's overrides for `agent`, `dataset` naming the models' dataset."""
        return [*dataset, *self.critic, *agent.critic]

    def critic_key(self, agent: AgentSpec, dataset: Sequence[str]) -> str:
        """As `training_key`, for critics."""
        return self._key(agent, ["critic", *self.critic_overrides(agent, dataset)])

    def _key(self, agent: AgentSpec, overrides: list[str]) -> str:
        if self.pairing == "independent":
            overrides = [f"agent={agent.name}", *overrides]
        return hashlib.sha256(json.dumps(overrides).encode()).hexdigest()[:12]

    def seed_of(self, agent: AgentSpec, seed: int) -> int:
        """The training (and episode) seed that agent plays as its `seed`-th."""
        if self.pairing == "shared":
            return seed
        return seed + self.names.index(agent.name) * AGENT_SEED_STRIDE

    def seeds(self, interim: int) -> range:
        """The training seeds of interim `interim` (from 0)."""
        return range(interim * self.n, (interim + 1) * self.n)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ComparisonSpec:
        agents = tuple(
            AgentSpec(
                name=a["name"],
                needs=tuple(a.get("needs", ("model",))),  # a state saved before critics
                train=tuple(a["train"]),
                critic=tuple(a.get("critic", ())),
                eval=tuple(a["eval"]),
            )
            for a in data["agents"]
        )
        lists = {key: tuple(data.get(key, ())) for key in ("train", "eval", "critic")}
        return cls(**{**data, "agents": agents, **lists})

    def differences(self, other: ComparisonSpec) -> list[str]:
        """What changed from `other`, field by field and agent by agent."""
        mine, theirs = self.to_dict(), other.to_dict()
        changes = [
            f"{key}: {theirs[key]!r} -> {mine[key]!r}"
            for key in mine
            if key != "agents" and mine[key] != theirs[key]
        ]
        before = {a["name"]: a for a in theirs["agents"]}
        after = {a["name"]: a for a in mine["agents"]}
        for name in sorted(before.keys() | after.keys()):
            if name not in after:
                changes.append(f"agent {name}: removed")
            elif name not in before:
                changes.append(f"agent {name}: added")
            else:
                changes += [
                    f"agent {name}: {key} {list(before[name][key])} -> {list(after[name][key])}"
                    for key in ("needs", "train", "critic", "eval")
                    if before[name][key] != after[name][key]
                ]
        if not changes and [a["name"] for a in mine["agents"]] != list(before):
            changes.append(f"agent order: {list(before)} -> {[a['name'] for a in after.values()]}")
        return changes


JOB_MODULES = {
    "train": "trajectory_transformer.cli.train",
    "critic": "trajectory_transformer.cli.train_critic",
    "eval": "trajectory_transformer.cli.evaluate",
}
CHECKPOINTS = {"train": "checkpoint.pt", "critic": "critic.pt"}
"""The file each kind of training writes, and resumes from."""


@dataclass
class Job:
    """One run of tt-train, tt-train-critic or tt-eval:
    `python -m <module> <args> hydra.run.dir=<run_dir>`."""

    kind: str  # "train", "critic" or "eval"
    args: list[str]
    run_dir: str

    @property
    def module(self) -> str:
        return JOB_MODULES[self.kind]

    @property
    def checkpoint(self) -> Path | None:
        """The checkpoint a training writes; None for an evaluation."""
        name = CHECKPOINTS.get(self.kind)
        return None if name is None else Path(self.run_dir) / name

    def command(self) -> list[str]:
        return ["-m", self.module, *self.args, f"hydra.run.dir={self.run_dir}"]

    def done(self) -> bool:
        """Whether a finished result is already on disk (so the job is never run twice)."""
        checkpoint = self.checkpoint
        if checkpoint is None:
            return (Path(self.run_dir) / "results.json").is_file()
        if not checkpoint.is_file():
            return False
        training = self._training_state(checkpoint)
        return bool(training and training.get("finished"))

    def training_seconds(self) -> float | None:
        """The wall time a training has taken so far, over all its resumes; None for an
        evaluation, or a training with no checkpoint yet."""
        checkpoint = self.checkpoint
        if checkpoint is None or not checkpoint.is_file():
            return None
        training = self._training_state(checkpoint) or {}
        return training.get("elapsed_seconds")

    def saved_config(self) -> dict | None:
        """The resolved config a training's checkpoint was written with; None for an
        evaluation, or a training with no checkpoint yet."""
        checkpoint = self.checkpoint
        if checkpoint is None or not checkpoint.is_file():
            return None
        return self._payload(checkpoint)["config"]

    def _training_state(self, checkpoint: Path) -> dict | None:
        return self._payload(checkpoint)["training"]

    def _payload(self, checkpoint: Path) -> dict:
        return (read_payload if self.kind == "train" else read_critic_payload)(checkpoint)


@dataclass
class Interim:
    """The jobs of one interim: trainings (models and critics) first, then evaluations."""

    index: int
    trainings: list[Job]
    evaluations: dict[str, dict[int, Job]]  # agent -> seed -> job
    shared: int  # trainings saved by sharing checkpoints between agents
    uses: dict[str, dict[int, dict[str, Job]]] = field(default_factory=dict)
    """agent -> seed -> need (model, critic) -> the training its evaluation uses."""

    def costs(self) -> dict[str, dict[str, dict[str, float | None]]]:
        """agent -> seed -> what its score cost: the wall time of the model's and the
        critic's trainings (seconds, shared ones counted for each agent that uses them), of the
        evaluation, and its planning per env-step (ms); None for what is not on disk."""
        seconds = {job.run_dir: job.training_seconds() for job in self.trainings}  # read once
        costs: dict[str, dict[str, dict[str, float | None]]] = {}
        for agent, jobs in self.evaluations.items():
            costs[agent] = {}
            for seed, job in jobs.items():
                path = Path(job.run_dir) / "results.json"
                results = json.loads(path.read_text()) if path.is_file() else {}
                used = self.uses.get(agent, {}).get(seed, {})
                costs[agent][str(seed)] = {
                    **{f"{need}_s": None for need in NEEDS},
                    **{f"{need}_s": seconds[training.run_dir] for need, training in used.items()},
                    "evaluation_s": results.get("wall_seconds"),
                    "planning_ms": results.get("ms_per_env_step"),
                }
        return costs


def plan_interim(
    spec: ComparisonSpec,
    index: int,
    playing: list[str],
    root: Path,
    critic_dataset: Sequence[str] = (),
    trainings_root: Path | None = None,
) -> Interim:
    """The jobs that give every agent in `playing` its `n` scores of interim `index`.
    `critic_dataset`: the tt-train-critic overrides that name the models' dataset (tt-compare
    reads them from the tt-train config of the comparison's `dataset` and shared `train`).
    Evaluations run under `root`, trainings under `trainings_root` (by default `root`): a
    training's folder is named by its overrides and seed, so comparisons that share
    `trainings_root` share the trainings they have in common."""
    trainings_root = root if trainings_root is None else trainings_root
    trainings: dict[tuple[str, int], Job] = {}
    evaluations: dict[str, dict[int, Job]] = {}
    uses: dict[str, dict[int, dict[str, Job]]] = {}
    wanted = 0
    for agent in spec.agents:
        if agent.name not in playing:
            continue
        evaluations[agent.name] = {}
        uses[agent.name] = {}
        for seed in spec.seeds(index):
            own_seed = spec.seed_of(agent, seed)
            trained: dict[str, Path] = {}  # need -> the file its training writes
            uses[agent.name][seed] = {}
            for need in agent.needs:
                if need == "model":
                    key = spec.training_key(agent)
                    job = Job(
                        "train",
                        [*spec.training_overrides(agent), f"seed={own_seed}"],
                        str(training_dir(trainings_root, "train", key, own_seed)),
                    )
                else:
                    key = spec.critic_key(agent, critic_dataset)
                    job = Job(
                        "critic",
                        [*spec.critic_overrides(agent, critic_dataset), f"seed={own_seed}"],
                        str(training_dir(trainings_root, "critic", key, own_seed)),
                    )
                uses[agent.name][seed][need] = trainings.setdefault((key, seed), job)
                trained[need] = uses[agent.name][seed][need].checkpoint
            wanted += len(trained)
            if "model" in trained:
                # The run directory: tt-eval plans with the model the run handed over.
                checkpoints = [f"checkpoint={trained['model'].parent}"]
                if "critic" in trained:
                    checkpoints.append(f"planner.critic={trained['critic']}")
            elif "critic" in trained:  # the critic's own policy (planner=iql)
                checkpoints = [f"checkpoint={trained['critic']}"]
            else:  # nothing trained: its eval names what it plays, and the seed draws its noise
                checkpoints = [f"planner.seed={own_seed}"]
            episodes = [] if spec.pairing == "shared" else [f"eval.seed={own_seed - seed}"]
            evaluations[agent.name][seed] = Job(
                "eval",
                [
                    *checkpoints,
                    f"eval.episodes={spec.episodes}",
                    "eval.progress=false",
                    *spec.eval,
                    *episodes,
                    *agent.eval,
                ],
                str(evaluation_dir(root, agent.name, seed)),
            )
    return Interim(index, list(trainings.values()), evaluations, wanted - len(trainings), uses)


TRAINING_FOLDERS = {"train": "trainings", "critic": "critics"}
"""The folder under a comparison's `trainings_root` that holds each kind of training."""


def training_dir(root: Path, kind: str, key: str, seed: int) -> Path:
    """Where the trainings under `root` keep the `kind` ("train" or "critic") of settings `key`
    (named by its overrides) trained with seed `seed`."""
    return root / TRAINING_FOLDERS[kind] / key / f"seed{seed}"


def evaluation_dir(root: Path, agent: str, seed: int) -> Path:
    """Where a comparison in `root` writes `agent`'s evaluation of training seed `seed`."""
    return root / "evaluations" / agent / f"seed{seed}"


def read_score(job: Job) -> tuple[float, bool]:
    """(score, normalised) of a finished evaluation: the mean normalised score of its episodes,
    or their mean return where the dataset has no reference scores."""
    results = json.loads((Path(job.run_dir) / "results.json").read_text())
    if results.get("normalized_score_mean") is not None:
        return float(results["normalized_score_mean"]), True
    return float(results["return_mean"]), False


REFERENCE_KEYS = ("ref_min_score", "ref_max_score", "reference_source")


def read_reference(job: Job) -> dict | None:
    """The reference scores that normalised a finished evaluation (tt-eval's `ref_min_score`,
    `ref_max_score`, `reference_source`), None where its scores are returns."""
    results = json.loads((Path(job.run_dir) / "results.json").read_text())
    if results.get("normalized_score_mean") is None:
        return None
    return {key: results.get(key) for key in REFERENCE_KEYS}


def check_one_reference(references: dict[str, dict | None]) -> dict | None:
    """The one reference of every evaluation (`references`: run dir -> reference), else an
    error: scores normalised by other references, or returns beside normalised scores, are on
    other scales, and a test over them would compare the scales."""
    seen = {json.dumps(reference, sort_keys=True) for reference in references.values()}
    if len(seen) > 1:
        shown = "\n  ".join(
            f"{run_dir}: {describe_reference(reference)}"
            for run_dir, reference in list(references.items())[:6]
        )
        raise ComparisonError(
            "the evaluations were not scored on one scale; every agent must be normalised by "
            "the same reference scores (set eval.ref_min_score/eval.ref_max_score or "
            "eval.reference in the comparison's shared `eval` list, not per agent):\n  " + shown
        )
    return next(iter(references.values()), None)


def describe_reference(reference: dict | None) -> str:
    if reference is None:
        return "returns (no reference scores)"
    return (
        f"normalised by {reference['reference_source']} reference scores "
        f"({reference['ref_min_score']} to {reference['ref_max_score']})"
    )


@dataclass
class ComparisonState:
    """Everything a comparison has done, as JSON: rerunning the same command continues it."""

    spec: dict
    scores: list[dict[str, dict[str, float]]] = field(default_factory=list)
    """Per finished interim: agent -> {seed: score}."""
    normalized: bool = True
    """False once a score is a mean return (a dataset without reference scores)."""
    reference: dict | None = None
    """The reference scores every evaluation was normalised by (`ref_min_score`,
    `ref_max_score`, `reference_source`), None where the scores are returns."""
    decisions: dict[str, str] = field(default_factory=dict)
    """'agent vs agent' -> larger | smaller | equal | continue."""
    decided_at: dict[str, int] = field(default_factory=dict)
    """'agent vs agent' -> interims used to decide it."""
    trainings_run: int = 0
    trainings_shared: int = 0
    evaluations_run: int = 0
    finished: bool = False

    def save(self, root: Path) -> Path:
        path = Path(root) / STATE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(asdict(self), indent=2) + "\n")
        temporary.replace(path)
        return path

    @classmethod
    def load_or_start(cls, root: Path, spec: ComparisonSpec) -> ComparisonState:
        """The state stored under `root`, refused if made for another comparison; else new."""
        path = Path(root) / STATE_FILE
        if not path.is_file():
            return cls(spec=spec.to_dict())
        state = cls(**json.loads(path.read_text()))
        changes = spec.differences(ComparisonSpec.from_dict(state.spec))
        if changes:
            raise ComparisonError(
                f"{path} holds another comparison; changed:\n  "
                + "\n  ".join(changes)
                + "\nRun it again as it was, or give this one another run directory "
                "(hydra.run.dir=...)."
            )
        return state

    def values(self, names: list[str]) -> dict[str, np.ndarray]:
        """Every agent's scores so far, interim after interim (AdaStop's input)."""
        return {
            name: np.array(
                [score for interim in self.scores for score in interim.get(name, {}).values()]
            )
            for name in names
        }


class Decider:
    """AdaStop's comparator, rebuilt from the stored scores by replaying every interim."""

    def __init__(self, spec: ComparisonSpec, state: ComparisonState) -> None:
        # Imported here: adastop brings pandas and matplotlib, which every other command (they
        # all read this module's specs and errors) would otherwise load at start.
        from adastop import MultipleAgentsComparator

        self.spec = spec
        self.comparator = MultipleAgentsComparator(
            n=spec.n,
            K=spec.K,
            B=spec.B,
            comparisons=np.array(spec.pairs()),
            alpha=spec.alpha,
            seed=spec.seed,
        )
        self.state = state
        for interim in range(len(state.scores)):
            self._compare(interim)

    def playing(self) -> list[str]:
        """Agents in a comparison still undecided: they get the next interim's seeds."""
        if self.comparator.k == 0:
            pairs = self.spec.pairs()
        else:
            pairs = [tuple(pair) for pair in self.comparator.current_comparisons]
        return [name for i, name in enumerate(self.spec.names) if any(i in p for p in pairs)]

    @property
    def finished(self) -> bool:
        return bool(self.comparator.is_finished) or self.comparator.k >= self.spec.K

    def add_interim(self, scores: dict[str, dict[str, float]]) -> None:
        self.state.scores.append(scores)
        self._compare(len(self.state.scores) - 1)

    def _compare(self, interim: int) -> None:
        names = self.spec.names
        seen = ComparisonState(spec=self.state.spec, scores=self.state.scores[: interim + 1])
        self.comparator.partial_compare(seen.values(names), verbose=False)
        for i, j in self.spec.pairs():
            decision = self.comparator.decisions[str(np.array([i, j]))]
            label = f"{names[i]} vs {names[j]}"
            if decision != "continue" and label not in self.state.decided_at:
                self.state.decided_at[label] = interim + 1
            self.state.decisions[label] = decision
        self.state.finished = self.finished


@dataclass
class AgentSummary:
    name: str
    seeds: int
    mean: float
    iqm: float
    iqm_low: float
    iqm_high: float
    model_minutes: float | None = None
    """Medians over its seeds: the wall time of a model's training, of a critic's, of an
    evaluation, and the planning per env-step; None where the agent has none."""
    critic_minutes: float | None = None
    evaluation_minutes: float | None = None
    planning_ms: float | None = None


def summarize(
    spec: ComparisonSpec,
    state: ComparisonState,
    reps: int = 2000,
    costs: dict[str, dict[str, dict[str, float | None]]] | None = None,
) -> tuple[list[AgentSummary], list[dict]]:
    """Per agent: mean, IQM and its 95% stratified-bootstrap interval over training seeds,
    and the medians of its `costs` (`Interim.costs`) where given; per comparison: the means,
    their difference, the decision, the interims it took and the probability that the first
    agent improves on the second."""
    values = state.values(spec.names)
    agents = []
    for name in spec.names:
        scores = values[name]
        low, high = stratified_bootstrap_ci(scores, iqm, reps=reps, seed=spec.seed)
        seeds = list((costs or {}).get(name, {}).values())
        agents.append(
            AgentSummary(
                name,
                len(scores),
                mean(scores),
                iqm(scores),
                low,
                high,
                model_minutes=median_of(seeds, "model_s", 1 / 60),
                critic_minutes=median_of(seeds, "critic_s", 1 / 60),
                evaluation_minutes=median_of(seeds, "evaluation_s", 1 / 60),
                planning_ms=median_of(seeds, "planning_ms"),
            )
        )
    rows = []
    for i, j in spec.pairs():
        a, b = spec.names[i], spec.names[j]
        label = f"{a} vs {b}"
        rows.append(
            {
                "comparison": label,
                "mean_1": agents[i].mean,
                "mean_2": agents[j].mean,
                "mean_difference": agents[i].mean - agents[j].mean,
                "decision": state.decisions.get(label, "continue"),
                "interims": state.decided_at.get(label, len(state.scores)),
                "probability_of_improvement": probability_of_improvement(values[a], values[b]),
            }
        )
    return agents, rows


def median_of(costs: list[dict], key: str, scale: float = 1.0) -> float | None:
    """The median of `key` over the seeds' costs that have it, times `scale`; None if none do."""
    values = [cost[key] for cost in costs if cost.get(key) is not None]
    return float(np.median(values)) * scale if values else None


DECISION_WORDS = {"equal": f"equal ({EQUAL_MEANS})", "continue": "continue (undecided so far)"}
"""How AdaStop's decisions that need a word of explanation read in a table."""


def decisions_markdown(rows: list[dict], normalized: bool, reference: dict | None = None) -> str:
    unit = "normalised score" if normalized else "return (no reference scores)"
    if normalized and reference is not None and reference.get("reference_source"):
        unit += (
            f" (reference: {reference['reference_source']}, {reference['ref_min_score']} to "
            f"{reference['ref_max_score']})"
        )
    lines = [
        "| comparison | mean 1 | mean 2 | mean 1 - mean 2 | decision | interims | P(1 > 2) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        decision = DECISION_WORDS.get(row["decision"], row["decision"])
        lines.append(
            f"| {row['comparison']} | {row['mean_1']:.1f} | {row['mean_2']:.1f} | "
            f"{row['mean_difference']:+.1f} | {decision} | {row['interims']} | "
            f"{row['probability_of_improvement']:.2f} |"
        )
    return f"Scores: {unit} per training seed.\n" + "\n".join(lines)


def agents_markdown(agents: list[AgentSummary]) -> str:
    """Scores per agent, and what a seed cost (medians; `-` where the agent has none)."""
    lines = [
        "| agent | seeds | mean | IQM | IQM 95% CI | model training (min) | critic training (min) "
        "| evaluation (min) | planning per env-step (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def shown(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    for a in agents:
        interval = f"[{a.iqm_low:.1f}, {a.iqm_high:.1f}]"
        lines.append(
            f"| {a.name} | {a.seeds} | {a.mean:.1f} | {a.iqm:.1f} | {interval} | "
            f"{shown(a.model_minutes, 1)} | {shown(a.critic_minutes, 1)} | "
            f"{shown(a.evaluation_minutes, 1)} | {shown(a.planning_ms, 1)} |"
        )
    return "\n".join(lines)
