"""Run an agent in a vector env for N seeded episodes and score them on the D4RL scale."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np

from trajectory_transformer.evaluation.agent import Agent, EvaluationObserver
from trajectory_transformer.progress import progress_bar
from trajectory_transformer.scores import mean_and_stderr, normalized_score


@dataclass
class EvalResult:
    returns: list[float]
    lengths: list[int]
    seeds: list[int]
    normalized_scores: list[float] | None
    no_score_reason: str | None
    planning_seconds: float
    env_steps: int
    wall_seconds: float
    ref_min_score: float | None = None
    """The return that normalises to 0, where the scores are normalised."""
    ref_max_score: float | None = None
    """The return that normalises to 100."""
    reference_source: str | None = None
    """Where the reference scores came from (`dataset metadata`, `explicit`, `d4rl (v2 envs)`)."""
    settings: dict = field(default_factory=dict)
    first_success_steps: list[int | None] | None = None
    """Per episode, the first step after which the env reported `success` (a goal env's info,
    gymnasium-robotics': within the goal's radius), or None if never; None where the env
    reports no success."""
    success_steps: list[int] | None = None
    """Per episode, the steps after which the env reported `success`."""

    def goal_summary(self) -> dict | None:
        """Where the env reports success: the share of episodes that reached their goal and,
        over those, the share of the steps from the first success on that were successes
        (1: the agent stayed at its goal). None elsewhere."""
        if self.first_success_steps is None or self.success_steps is None:
            return None
        reached = [
            (first, at, length)
            for first, at, length in zip(
                self.first_success_steps, self.success_steps, self.lengths, strict=True
            )
            if first is not None
        ]
        stayed = [at / (length - first) for first, at, length in reached]
        return {
            "reached_fraction": len(reached) / max(len(self.lengths), 1),
            "stayed_fraction": float(np.mean(stayed)) if stayed else None,
            "first_success_step_mean": (
                float(np.mean([first for first, _, _ in reached])) if reached else None
            ),
        }

    def summary(self) -> dict:
        """The JSON written next to the checkpoint: means, standard errors, per-episode lists."""
        return_mean, return_stderr = mean_and_stderr(self.returns)
        result = {"return_mean": return_mean, "return_stderr": return_stderr}
        if self.normalized_scores is not None:
            score_mean, score_stderr = mean_and_stderr(self.normalized_scores)
            result |= {"normalized_score_mean": score_mean, "normalized_score_stderr": score_stderr}
            result |= {
                "ref_min_score": self.ref_min_score,
                "ref_max_score": self.ref_max_score,
                "reference_source": self.reference_source,
            }
        else:
            result |= {"normalized_score_mean": None, "normalized_score_stderr": None}
            result["no_score_reason"] = self.no_score_reason
        result["ms_per_env_step"] = 1000 * self.planning_seconds / max(self.env_steps, 1)
        if (goals := self.goal_summary()) is not None:
            result |= goals
        return result | asdict(self)

    def line(self) -> str:
        summary = self.summary()
        text = (
            f"{len(self.returns)} episodes | return {summary['return_mean']:.1f} ± "
            f"{summary['return_stderr']:.1f}"
        )
        if self.normalized_scores is not None:
            text += (
                f" | normalized score {summary['normalized_score_mean']:.1f} ± "
                f"{summary['normalized_score_stderr']:.1f}"
            )
            if self.reference_source:
                text += f" ({self.reference_source})"
        else:
            text += f" | no normalized score: {self.no_score_reason}"
        if (goals := self.goal_summary()) is not None:
            text += f" | goal reached in {goals['reached_fraction']:.0%} of the episodes"
            if goals["stayed_fraction"] is not None:
                text += f", then held {goals['stayed_fraction']:.0%} of the steps"
        return text + f" | {summary['ms_per_env_step']:.1f} ms planning per env-step"

    def write(self, *paths: Path) -> None:
        """The summary as JSON, each file replaced whole: a killed process leaves the file as
        it was, never half written (a comparison takes an existing one as a finished job)."""
        text = json.dumps(self.summary(), indent=2)
        for path in map(Path, paths):
            path.parent.mkdir(parents=True, exist_ok=True)
            staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            staged.write_text(text + "\n")
            os.replace(staged, path)


class JournalMismatchError(ValueError):
    """A run directory's journal records episodes of another evaluation."""


class EpisodeJournal:
    """An evaluation's finished episodes, one JSON line each, appended as they end, so that an
    evaluation interrupted (Ctrl-C, a crash, a job's time limit) and started again on the same
    journal plays only the episodes it had not finished.

    The first line is the evaluation's `identity`: whatever decides what an episode plays
    (checkpoint, planner settings, environment). A journal of another identity is refused, not
    mixed in. Each episode's line holds its seed, return and length, and the planning time,
    env-steps and wall time of all the slots since the line before, so that the steps of
    episodes an interruption then cut count with the time they took. A line cut short by a
    crash is ignored.
    """

    def __init__(self, path: str | os.PathLike, identity: dict) -> None:
        self.path = Path(path)
        self.identity = json.loads(json.dumps(identity))  # as it reads back from the file
        self.finished: dict[int, dict] = {}
        """Episode seed -> its line."""
        header, *lines = self._lines() or [{"identity": self.identity}]
        recorded = header.get("identity", {})
        if recorded != self.identity:
            differ = sorted(
                k
                for k in recorded.keys() | self.identity.keys()
                if recorded.get(k) != self.identity.get(k)
            )
            raise JournalMismatchError(
                f"{self.path} holds episodes of another evaluation (it differs in "
                f"{', '.join(differ)}); evaluate into another run directory "
                "(hydra.run.dir=...), or delete that file to start this one over"
            )
        for line in lines:
            self.finished[int(line["seed"])] = line
        # Written anew from what was read, replaced whole: a line cut short by a crash goes,
        # so that the lines appended from now on follow a whole one and read back.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staged = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        staged.write_text("".join(json.dumps(line) + "\n" for line in [header, *lines]))
        os.replace(staged, self.path)

    def _lines(self) -> list[dict]:
        """The file's whole lines up to the first one cut short (none if there is no file)."""
        lines = []
        if not self.path.exists():
            return lines
        for text in self.path.read_text().splitlines():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                break  # the last line, cut short by a crash: that episode is played again
        return lines

    def forget(self, seed: int) -> None:
        """Play the episode of `seed` again (an observer must see it)."""
        self.finished.pop(seed, None)

    def append(self, line: dict) -> None:
        self.finished[int(line["seed"])] = line
        with open(self.path, "a") as file:  # one short append per episode
            file.write(json.dumps(line) + "\n")


@dataclass
class _Tally:
    """The scored episodes of an evaluation and the work they took, a journal line each."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    planning_seconds: float = 0.0
    env_steps: int = 0
    wall_seconds: float = 0.0
    first_success_steps: list[int | None] = field(default_factory=list)
    success_steps: list[int] = field(default_factory=list)

    def add(self, line: dict) -> None:
        if "success_steps" in line:
            self.first_success_steps.append(line["first_success_step"])
            self.success_steps.append(int(line["success_steps"]))
        self.returns.append(float(line["return"]))
        self.lengths.append(int(line["length"]))
        self.seeds.append(int(line["seed"]))
        self.planning_seconds += line["planning_seconds"]
        self.env_steps += line["env_steps"]
        self.wall_seconds += line["wall_seconds"]


def evaluate(
    agent: Agent,
    env: gym.vector.VectorEnv,
    episodes: int,
    seed: int = 0,
    ref_scores: tuple[float | None, float | None] = (None, None),
    progress: bool = True,
    observers: Sequence[EvaluationObserver] = (),
    no_score_reason: str = "the dataset carries no ref_min_score/ref_max_score",
    reference_source: str | None = "dataset metadata",
    journal: EpisodeJournal | None = None,
) -> EvalResult:
    """Play `episodes` episodes with seeds `seed, seed+1, ...` on the `env.num_envs` slots of
    a vector env, keeping every slot busy (continuous batching).

    When a slot's episode ends, the next seed starts in that slot at once: the env is reset
    with that seed and the agent forgets the slot (`reset_env`), which also derives the
    agent's random stream from the episode seed, so an episode plays alike whichever slot
    plays it and however many slots there are. Only at the tail, when no episode is left to
    start, do finished slots idle: they keep stepping (shapes never change), their steps are
    ignored and the agent does not plan for them. `observers` (an `EpisodeRecord`, say) are
    told of every episode start, action and step. Returns are normalised by `ref_scores`
    (min, max) when both are given, and the result names them and their
    `reference_source`; else `no_score_reason` says why not. With a `journal`, every
    finished episode is appended to it, and the episodes it already holds are not played
    again: they count as they were recorded, their time and env-steps included.
    """
    done = {} if journal is None else journal.finished
    tally, pending = _Tally(), []  # pending: the episodes left to play
    for episode in range(episodes):
        if seed + episode in done:
            tally.add(done[seed + episode])
        else:
            pending.append(episode)
    if pending:
        _play(agent, env, pending, seed, tally, progress, observers, journal)
    scores = normalized_score(np.array(tally.returns), *ref_scores)
    reports_success = len(tally.success_steps) == len(tally.returns)  # every episode's line
    return EvalResult(
        returns=tally.returns,
        lengths=tally.lengths,
        seeds=tally.seeds,
        normalized_scores=None if scores is None else scores.tolist(),
        no_score_reason=None if scores is not None else no_score_reason,
        ref_min_score=None if scores is None else float(ref_scores[0]),
        ref_max_score=None if scores is None else float(ref_scores[1]),
        reference_source=None if scores is None else reference_source,
        planning_seconds=tally.planning_seconds,
        env_steps=tally.env_steps,
        wall_seconds=tally.wall_seconds,
        first_success_steps=tally.first_success_steps if reports_success else None,
        success_steps=tally.success_steps if reports_success else None,
    )


def _play(
    agent: Agent,
    env: gym.vector.VectorEnv,
    pending: list[int],
    seed: int,
    tally: _Tally,
    progress: bool,
    observers: Sequence[EvaluationObserver],
    journal: EpisodeJournal | None,
) -> None:
    """`evaluate`'s rollout of the episodes `pending` (indices after `seed`), each added to
    `tally` (and `journal`) as it ends, with the work done since the one before."""
    num_envs = env.num_envs
    planning_seconds, env_steps, start = 0.0, 0, time.perf_counter()
    since = (0.0, 0, 0.0)  # planning seconds, env-steps and wall seconds at the last line
    # A vector env without autoreset refuses to step a finished env until it is reset, and
    # idle slots keep stepping, so evaluate resets them itself (their episodes are ignored).
    # Slots that start a new episode are always reset here, with its seed: an autoreset
    # would not know the seed.
    manual_reset = env.metadata.get("autoreset_mode") == gym.vector.AutoresetMode.DISABLED
    spec = env.get_attr("spec")[0]
    max_steps = getattr(spec, "max_episode_steps", None)
    total = len(pending) * max_steps if max_steps else None
    bar = progress_bar(total, "eval env-steps", disable=not progress)
    reset_env = getattr(agent, "reset_env", None)  # a stateless agent may have none
    episode_of_slot = np.full(num_envs, -1, dtype=np.int64)
    running = np.zeros(num_envs, dtype=np.float64)
    length = np.zeros(num_envs, dtype=np.int64)
    active = np.zeros(num_envs, dtype=bool)
    first_success = np.full(num_envs, -1, dtype=np.int64)  # -1: not yet
    success_steps = np.zeros(num_envs, dtype=np.int64)
    reports_success = False

    def start_episodes(slots: np.ndarray, first: int) -> None:
        """Slots `slots` (already reset) start the pending episodes first, first + 1, ..."""
        for index, slot in enumerate(slots, start=first):
            episode = pending[index]
            episode_of_slot[slot], running[slot], length[slot] = episode, 0.0, 0
            first_success[slot], success_steps[slot] = -1, 0
            active[slot] = True
            if reset_env is not None:
                reset_env(int(slot), seed + episode)
            for observer in observers:
                observer.on_start(int(slot), episode, seed + episode, observations, env)

    first_slots = np.arange(min(num_envs, len(pending)))
    first_seeds = [seed + pending[i] if i < len(pending) else None for i in range(num_envs)]
    observations, _ = env.reset(seed=first_seeds)
    agent.reset(num_envs)
    start_episodes(first_slots, 0)
    next_episode = len(first_slots)
    while active.any():
        tic = time.perf_counter()
        actions = agent.act(observations, active)  # idle slots are not planned
        planning_seconds += time.perf_counter() - tic
        for observer in observers:
            observer.on_act(agent, observations, actions, active)
        observations, rewards, terminated, truncated, infos = env.step(actions)
        dones = terminated | truncated
        agent.observe(rewards, dones)
        for observer in observers:
            observer.on_step(observations, rewards, terminated, truncated, active, env)
        env_steps += int(active.sum())
        bar.update(int(active.sum()))
        running[active] += rewards[active]
        if "success" in infos:  # a goal env: whether this step ended at the goal
            reports_success = True
            success = active & np.asarray(infos["success"], dtype=bool)
            if "_success" in infos:
                success &= np.asarray(infos["_success"], dtype=bool)
            arrived = success & (first_success < 0)
            first_success[arrived] = length[arrived]
            success_steps[success] += 1
        length[active] += 1
        finished = np.flatnonzero(active & dones)
        for i in finished:
            now = (planning_seconds, env_steps, time.perf_counter() - start)
            line = {
                "seed": seed + int(episode_of_slot[i]),
                "return": float(running[i]),
                "length": int(length[i]),
                "planning_seconds": now[0] - since[0],
                "env_steps": now[1] - since[1],
                "wall_seconds": now[2] - since[2],
            }
            if reports_success:
                first = int(first_success[i])
                line |= {
                    "first_success_step": None if first < 0 else first,
                    "success_steps": int(success_steps[i]),
                }
            since = now
            tally.add(line)
            if journal is not None:
                journal.append(line)
            active[i] = False
            bar.set_postfix(
                episodes=len(tally.returns), mean_return=f"{np.mean(tally.returns):.1f}"
            )
        restart = finished[: max(len(pending) - next_episode, 0)]
        reset_mask = np.zeros(num_envs, dtype=bool)
        reset_mask[restart] = True
        if manual_reset and (active.any() or len(restart)):
            reset_mask |= dones
        if reset_mask.any():
            new_seeds: list[int | None] = [None] * num_envs
            for index, slot in enumerate(restart, start=next_episode):
                new_seeds[slot] = seed + pending[index]
            observations, _ = env.reset(seed=new_seeds, options={"reset_mask": reset_mask})
            start_episodes(restart, next_episode)
            next_episode += len(restart)
    bar.close()
