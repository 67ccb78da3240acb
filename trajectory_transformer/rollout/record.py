"""One episode kept in full: what happened, what the planner imagined, and rendered frames.

`evaluate(..., record=EpisodeRecord(...))` fills a record for the first episode (env 0 of the
first wave); `record_episode` plays a single episode for one. The figures in
`trajectory_transformer.viz` are drawn from records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from trajectory_transformer.data.episodes import reward_to_go
from trajectory_transformer.planning.plan import Plan


@dataclass
class PlanSnapshot:
    """The planner's search at one step of the episode, for env 0."""

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
    """An episode of env 0; pass one to `evaluate` to have it filled.

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

    def __len__(self) -> int:
        return len(self.actions)

    # --- filled by `evaluate` -------------------------------------------------------------

    def begin(self, observation: np.ndarray, seed: int, frame: np.ndarray | None) -> None:
        self.observations, self.actions, self.rewards = [np.asarray(observation)], [], []
        self.plans, self.predicted_rewards, self.predicted_values = {}, [], []
        self.frames = [] if frame is None else [frame]
        self.seed, self.terminated = seed, False

    def after_act(self, agent: object, observations: np.ndarray, plan_before: object) -> None:
        """Keep env 0's plan if `agent.act` just made a new one (a `BeamPlanner` keeps its
        last plan in `last_plan`; other agents record no plans)."""
        plan = getattr(agent, "last_plan", None)
        step = len(self.actions)
        if plan is None or plan is plan_before or not bool(plan.active[0]):
            self.predicted_rewards.append(math.nan)
            self.predicted_values.append(math.nan)
            return
        best = int(plan.best[0])
        self.predicted_rewards.append(float(plan.rewards[0, best, 0]))
        self.predicted_values.append(float(plan.values[0, best, 0]))
        if step in self.plan_steps:
            context = agent.context_tokens(observations)[0].cpu()
            self.plans[step] = PlanSnapshot(step, context, _first_env(plan))

    def after_step(
        self,
        action: np.ndarray,
        reward: float,
        observation: np.ndarray,
        terminated: bool,
        frame: np.ndarray | None,
    ) -> None:
        self.actions.append(np.asarray(action))
        self.rewards.append(float(reward))
        self.observations.append(np.asarray(observation))
        self.terminated = bool(terminated)
        if frame is not None:
            self.frames.append(frame)

    # --- what the model was trained to predict --------------------------------------------

    def reward_targets(self, terminal_penalty: float = -100.0) -> np.ndarray:
        """Rewards as the reward tokens saw them in training: the terminal penalty added on a
        true termination, (length,)."""
        rewards = np.asarray(self.rewards, dtype=np.float32)
        if self.terminated and len(rewards):
            rewards[-1] += terminal_penalty
        return rewards

    def value_targets(self, discount: float, terminal_penalty: float = -100.0) -> np.ndarray:
        """The discounted reward-to-go after each step, as the value tokens were trained on,
        (length,). A truncated episode's tail is unknown and counts as zero."""
        rewards = self.reward_targets(terminal_penalty)
        return reward_to_go(rewards, np.array([len(rewards)]), discount)


def _first_env(plan: Plan) -> Plan:
    """The plan of env 0 alone, on the CPU."""
    return Plan(**{name: value[:1].cpu() for name, value in vars(plan).items()})


def record_episode(
    agent: object,
    make_env: Callable[[], gym.Env],
    seed: int = 0,
    plan_steps: Sequence[int] = (0,),
    render: bool = False,
) -> EpisodeRecord:
    """Play one seeded episode in a fresh env from `make_env` (a thunk, e.g.
    `rollout.make_env(info, render_mode="rgb_array")`) and return its record."""
    from trajectory_transformer.rollout.evaluate import evaluate

    env = gym.vector.SyncVectorEnv([make_env], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    record = EpisodeRecord(plan_steps=tuple(plan_steps), render=render)
    try:
        evaluate(agent, env, episodes=1, seed=seed, progress=False, record=record)
    finally:
        env.close()
    return record
