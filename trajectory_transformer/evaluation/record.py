"""One episode kept in full: what happened, what the planner imagined, and rendered frames.

`evaluate(..., observers=[EpisodeRecord(...)])` fills a record for the first episode (whichever
env plays it); `record_episode` plays a single episode for one. The figures in
`trajectory_transformer.viz` are drawn from records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from trajectory_transformer.data.episodes import TERMINAL_PENALTY, reward_to_go
from trajectory_transformer.evaluation.agent import Agent, PlanningAgent
from trajectory_transformer.evaluation.loop import evaluate
from trajectory_transformer.planning.plan import Plan


@dataclass
class PlanSnapshot:
    """The planner's search at one step of the episode, for its env alone."""

    step: int
    """Env step at which the plan was made; its first action was executed there."""
    context: torch.Tensor
    """(n * T + O,) tokens the search started from: kept real transitions, then the current
    observation."""
    plan: Plan
    """Every beam of the search, with a leading env axis of one."""

    @property
    def best(self) -> int:
        return int(self.plan.best[0])


@dataclass
class EpisodeRecord:
    """The first episode of an evaluation; pass one to `evaluate` to have it filled.

    `plan_steps` are the steps whose whole search (every beam) is kept; at every step that
    replans, the chosen plan's first predicted reward and value are kept in `predicted_*`
    (NaN where the agent followed an older plan). `render=True` keeps one frame per step;
    the vector env must then render `rgb_array`.
    """

    plan_steps: Sequence[int] = ()
    render: bool = False
    observations: list[np.ndarray] = field(default_factory=list)
    """Length + 1 observations: the reset one, then one per step."""
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    terminated: bool = False
    seed: int | None = None
    plans: dict[int, PlanSnapshot] = field(default_factory=dict)
    predicted_rewards: list[float] = field(default_factory=list)
    predicted_values: list[float] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)
    _recording: bool = field(default=False, repr=False)
    _slot: int = field(default=0, repr=False)
    _plan_seen: Plan | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.actions)

    # --- filled by `evaluate`, as one of its observers: its first episode ---------------

    def on_start(
        self,
        slot: int,
        episode: int,
        seed: int,
        observations: np.ndarray,
        env: gym.vector.VectorEnv,
    ) -> None:
        if episode != 0:
            return
        self._slot, self._recording = slot, True
        self.observations, self.actions, self.rewards = [np.asarray(observations[slot])], [], []
        self.plans, self.predicted_rewards, self.predicted_values = {}, [], []
        frame = self._frame(env)
        self.frames = [] if frame is None else [frame]
        self.seed, self.terminated = seed, False
        self._plan_seen = None  # a new search is a new Plan object

    def on_act(
        self, agent: Agent, observations: np.ndarray, actions: np.ndarray, active: np.ndarray
    ) -> None:
        """Keep the episode's action, and its plan if the agent just made a new one (agents
        that do not plan record no plans)."""
        slot = self._slot
        if not (self._recording and active[slot]):
            return
        self.actions.append(np.asarray(actions[slot]))
        plan = agent.last_plan if isinstance(agent, PlanningAgent) else None
        step = len(self.actions) - 1
        if plan is None or plan is self._plan_seen or not bool(plan.active[slot]):
            self.predicted_rewards.append(math.nan)
            self.predicted_values.append(math.nan)
            return
        self._plan_seen = plan
        best = int(plan.best[slot])
        self.predicted_rewards.append(float(plan.rewards[slot, best, 0]))
        self.predicted_values.append(float(plan.values[slot, best, 0]))
        if step in self.plan_steps:
            context = agent.context_tokens(observations)[slot].cpu()
            self.plans[step] = PlanSnapshot(step, context, _one_env(plan, slot))

    def on_step(
        self,
        observations: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        active: np.ndarray,
        env: gym.vector.VectorEnv,
    ) -> None:
        slot = self._slot
        if not (self._recording and active[slot]):
            return
        self.rewards.append(float(rewards[slot]))
        self.observations.append(np.asarray(observations[slot]))
        self.terminated = bool(terminated[slot])
        frame = self._frame(env)
        if frame is not None:
            self.frames.append(frame)
        # The slot goes on with the next episode, which is not this record's.
        self._recording = not (terminated[slot] or truncated[slot])

    def _frame(self, env: gym.vector.VectorEnv) -> np.ndarray | None:
        return env.call("render")[self._slot] if self.render else None

    # --- what the model was trained to predict --------------------------------------------

    def reward_targets(self, terminal_penalty: float = TERMINAL_PENALTY) -> np.ndarray:
        """Rewards as the reward tokens saw them in training: the terminal penalty added on a
        true termination, (length,)."""
        rewards = np.asarray(self.rewards, dtype=np.float32)
        if self.terminated and len(rewards):
            rewards[-1] += terminal_penalty
        return rewards

    def value_targets(
        self, discount: float, terminal_penalty: float = TERMINAL_PENALTY
    ) -> np.ndarray:
        """The discounted reward-to-go after each step, as the value tokens were trained on,
        (length,). A truncated episode's tail is unknown and counts as zero."""
        rewards = self.reward_targets(terminal_penalty)
        return reward_to_go(rewards, np.array([len(rewards)]), discount)


def _one_env(plan: Plan, env: int) -> Plan:
    """The plan of env `env` alone, on the CPU."""
    return Plan(**{name: value[env : env + 1].cpu() for name, value in vars(plan).items()})


def record_episode(
    agent: object,
    make_env: Callable[[], gym.Env],
    seed: int = 0,
    plan_steps: Sequence[int] = (0,),
    render: bool = False,
) -> EpisodeRecord:
    """Play one seeded episode in a fresh env from `make_env` (a thunk, e.g.
    `evaluation.make_env(info, render_mode="rgb_array")`) and return its record."""
    env = gym.vector.SyncVectorEnv([make_env], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    record = EpisodeRecord(plan_steps=tuple(plan_steps), render=render)
    try:
        evaluate(agent, env, episodes=1, seed=seed, progress=False, observers=[record])
    finally:
        env.close()
    return record
