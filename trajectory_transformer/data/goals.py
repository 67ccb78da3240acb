"""Hindsight goals: training windows conditioned on a goal that their own episode reaches.

A goal-conditioned dataset (Dict observations with `achieved_goal` and `desired_goal`, as
gymnasium-robotics' and Minari's goal datasets store them) shows each episode pursuing one goal.
Any state an episode passes through is also a goal that the same steps reached, so a window
may be relabelled with one (HER's "future" strategy, Andrychowicz et al., 2017):

* **The goal.** For a window starting at step t, a step j is drawn uniformly among t .. the
  episode's last step, and the goal is the achieved goal after step j.
* **The relabelled episode** is what the data would have been had that been its goal: the
  window's observations carry it in their `desired_goal` dimensions; the reward of every step
  is the environment's own reward for the achieved goal after it and the new goal
  (`compute_reward`, gymnasium-robotics' goal-env API); and the episode ends, by truncation, at
  the first step that reaches the goal (whose reward is the reward at the goal itself), as a
  goal-reaching dataset's episodes end. The window's steps after that end are masked out, as
  the padding after any episode; the value tokens are the discounted reward-to-go up to it.
  Relabelling an episode with its own goal, where it ends at its goal, gives back its own
  rewards and values.
* Actions are kept: the path to an intermediate goal is the first part of a path that the
  behaviour took to a later one.

A goal-reaching dataset never shows what follows arrival: its episodes end there, while an
evaluation counts the steps spent at the goal after it. Windows relabelled with a goal **they
reach themselves** show it: the goal is the achieved goal after one of the window's own steps,
drawn uniformly, and the relabelled episode goes on past it to the end of the episode, every
step rewarded for where it ends. The data passes some goals at speed and comes to rest at
others (the maze controller settles at every cell centre), so these windows' values, the
rewards to come, tell a goal the point stays at from one it passes.

**The scale of a continuing episode's rewards.** A dataset episode that ends on arrival has
one reward, 1, and its values lie in [0, 1]; the value bins are fit on them. A continuing
episode rewards every step at the goal, and a window's few steps seldom leave the goal's
radius, so its values (sums of many rewards, up to about 60 on the mazes) would lie above the
bins, be encoded as the top bin, and say "at the goal" however long the point stays. So each
reward of a continuing episode is multiplied by 1 - discount (`continuing_rewards="scaled"`, the
default): staying at the goal for good is then worth 1, what the dataset's episodes give
arriving (their reward, the episode truncated there), and a point that rests at the goal for a
while is worth more than one that passes through, within the bins. `"raw"` keeps the
environment's rewards (the held comparison on large was trained so);
`continuing_values_above_bins` measures what falls above the bins, and tt-train warns.

`GoalRelabelledWindows` relabels each window of a batch with a later goal with probability
`probability`, with one it reaches itself with probability `reached`, drawn from torch's global
generator (saved and restored with a run's state), and leaves the others as `TokenWindows` has
them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.episodes import Episodes
from trajectory_transformer.data.minari_source import observation_columns
from trajectory_transformer.data.windows import TokenWindows

GoalReward = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""`reward(achieved (..., G), desired (..., G)) -> (...)`: the environment's reward of reaching
`achieved` when the goal is `desired` (gymnasium-robotics' `compute_reward` without its info)."""


@dataclass(frozen=True)
class GoalLayout:
    """Where the goals sit in a flattened observation: the columns of `achieved_goal` and of
    `desired_goal`."""

    achieved: slice
    desired: slice

    @classmethod
    def of(cls, layout: tuple[tuple[str, tuple[int, ...]], ...] | None) -> GoalLayout:
        """From a Dict observation's keys and shapes in flattening order
        (`minari_source.observation_layout`); refuses observations without both goal keys."""
        keys = [key for key, _ in layout or ()]
        if "achieved_goal" not in keys or "desired_goal" not in keys:
            found = "a flat Box" if layout is None else f"the keys {keys}"
            raise ValueError(
                "relabelling goals needs Dict observations with `achieved_goal` and "
                f"`desired_goal` keys (a goal-conditioned dataset), and this dataset has {found}; "
                "set dataset.relabel_goals=0 to train on its own rewards."
            )
        columns = observation_columns(layout)
        achieved, desired = columns["achieved_goal"], columns["desired_goal"]
        if achieved.stop - achieved.start != desired.stop - desired.start:
            raise ValueError(
                f"achieved_goal has {achieved.stop - achieved.start} values and desired_goal "
                f"{desired.stop - desired.start}: a goal is compared with what was achieved, "
                "so they must have the same size"
            )
        return cls(achieved, desired)


CONTINUING_REWARDS = ("scaled", "raw")
"""The rewards of a relabelled episode that goes on past its goal: multiplied by 1 - discount, so
that staying at the goal for good is worth 1 (`scaled`), or the environment's own (`raw`)."""


def continuing_share(later: float, end_at_goal: bool, reached: float) -> float:
    """The share of the windows relabelled with an episode that goes on past its goal, of those
    relabelled with a later goal (`later`) and with one they reach (`reached`)."""
    return reached + (0.0 if end_at_goal else later)


def continuing_rewards_of(dataset_config: dict) -> str | None:
    """The rewards past the goal that a tt-train run's `dataset` config trains with: None where
    no window goes on past its goal, `raw` where it names none (runs before the setting had
    the environment's rewards)."""
    share = continuing_share(
        dataset_config.get("relabel_goals", 0.0),
        dataset_config.get("relabel_end_at_goal", True),
        dataset_config.get("relabel_reached", 0.0),
    )
    return dataset_config.get("relabel_continuing_rewards", "raw") if share > 0 else None


class ValuesAboveBins(NamedTuple):
    """Value targets above the value bins' range: their `share`, the `largest` value, and the
    bins' `top` edge."""

    share: float
    largest: float
    top: float


def env_goal_reward(env) -> GoalReward:
    """The reward function of a goal-conditioned env (`env.unwrapped.compute_reward`), refused
    with a clear message where the env has none."""
    compute = getattr(env.unwrapped, "compute_reward", None)
    if compute is None:
        raise ValueError(
            f"{env.spec.id if env.spec else env} has no compute_reward(achieved_goal, "
            "desired_goal, info), so the rewards of a relabelled goal cannot be recomputed; set "
            "dataset.relabel_goals=0."
        )

    def reward(achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
        return np.asarray(compute(achieved, desired, {}), dtype=np.float64)

    return reward


def episode_last_rows(episodes: Episodes, rows: np.ndarray) -> np.ndarray:
    """The last row of the episode that holds each of `rows`."""
    ends = episodes.starts + episodes.lengths - 1  # ascending
    return ends[np.searchsorted(ends, rows)]


def relabel(
    episodes: Episodes,
    goals: GoalLayout,
    reward: GoalReward,
    discount: float,
    starts: np.ndarray,
    goal: np.ndarray,
    goal_steps: np.ndarray,
    length: int,
    next_achieved: np.ndarray | None = None,
    end_at_goal: bool | np.ndarray = True,
    continuing_scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Windows of `length` transitions starting at rows `starts` (B,) of `episodes`,
    relabelled with goals `goal` (B, G) that are reached at the latest at rows `goal_steps`
    (B,), in the same episode at or after the start (the step whose achieved goal it is).
    Returns their joint transitions (B, length, O + A + 2) `obs | act | reward | value` as
    float32, and which of their steps are in the relabelled episode (B, length).
    `next_achieved` (N, G), the achieved goal after every step, is computed if not given.
    Where `end_at_goal` (a bool, or one per window) is false, the relabelled episode goes on to
    the end of the episode, every step rewarded for where it ends (a continuing task, as the
    mazes are evaluated), its rewards multiplied by `continuing_scale`."""
    if next_achieved is None:
        next_achieved = episodes.next_observations()[:, goals.achieved]
    last = episode_last_rows(episodes, starts)  # (B,)
    if np.any(goal_steps < starts) or np.any(goal_steps > last):
        raise ValueError("each goal step must lie in its window's episode, at or after its start")
    # Every step from the start to the goal's step, or to the episode's end (later columns
    # repeat the last): the relabelled episode ends at the first step that reaches the goal,
    # at the latest the goal's own step, or at the episode's end.
    end_at_goal = np.broadcast_to(np.asarray(end_at_goal, dtype=bool), starts.shape)
    last_row = np.where(end_at_goal, goal_steps, last)
    span = int((last_row - starts).max()) + 1
    rows = np.minimum(starts[:, None] + np.arange(span), last_row[:, None])  # (B, span)
    rewards = reward(next_achieved[rows], goal[:, None, :])  # (B, span)
    end = last - starts
    if end_at_goal.any():
        ending = end_at_goal.nonzero()[0]
        at_goal = reward(goal[ending], goal[ending])  # the reward of reaching the goal
        reached = (rewards[ending] >= at_goal[:, None]) | (rows[ending] == goal_steps[ending, None])
        end[ending] = np.argmax(reached, axis=1)  # the first reaching step, from the start
    rewards = np.where(np.arange(span)[None, :] <= end[:, None], rewards, 0.0)
    rewards = np.where(end_at_goal[:, None], rewards, continuing_scale * rewards)
    # V_k = sum_{m>k, m<=end} discount^(m-k-1) r_m: a backward recursion over the span.
    values = np.zeros_like(rewards)
    following = np.zeros(len(starts))
    for k in range(span - 1, -1, -1):
        values[:, k] = following
        following = rewards[:, k] + discount * following
    steps = np.arange(length)
    valid = steps[None, :] <= end[:, None]  # (B, length) steps of the relabelled episode
    window_rows = np.minimum(starts[:, None] + steps, last_row[:, None])
    observations = episodes.observations[window_rows]
    observations[..., goals.desired] = goal[:, None, :]
    columns = np.minimum(steps, span - 1)  # steps past the span are past the end
    transitions = np.concatenate(
        [
            observations,
            episodes.actions[window_rows],
            rewards[:, columns, None],
            values[:, columns, None],
        ],
        axis=-1,
    )
    return np.where(valid[..., None], transitions, 0.0).astype(np.float32), valid


class GoalRelabelledWindows:
    """`TokenWindows` whose batches relabel each window's goal: with probability
    `probability` with a goal its episode reaches later, with probability `reached` with one
    the window reaches itself (see the module docstring); the same windows, lengths and
    device. `continuing_rewards` (one of `CONTINUING_REWARDS`) scales the rewards of the
    relabelled episodes that go on past their goal."""

    def __init__(
        self,
        windows: TokenWindows,
        episodes: Episodes,
        discretizer: Discretizer,
        goals: GoalLayout,
        reward: GoalReward,
        discount: float,
        probability: float,
        end_at_goal: bool = True,
        reached: float = 0.0,
        continuing_rewards: str = "scaled",
    ) -> None:
        if min(probability, reached) < 0.0 or probability + reached > 1.0:
            raise ValueError(
                "the relabelling probabilities must be at least 0 and sum to at most 1, got "
                f"{probability} (a later goal) and {reached} (a goal the window reaches)"
            )
        if continuing_rewards not in CONTINUING_REWARDS:
            raise ValueError(
                f"continuing_rewards must be one of {', '.join(CONTINUING_REWARDS)}, got "
                f"{continuing_rewards!r}"
            )
        self.windows = windows
        self.episodes = episodes
        self.discretizer = discretizer
        self.goals = goals
        self.reward = reward
        self.discount = discount
        self.probability = probability
        self.end_at_goal = end_at_goal
        self.reached = reached
        self._continuing_scale = 1.0 - discount if continuing_rewards == "scaled" else 1.0
        if self.continuing > 0 and self._continuing_scale <= 0.0:
            raise ValueError(
                "scaled continuing rewards (1 - discount a step at the goal) need a discount "
                f"below 1, got {discount}; set dataset.relabel_continuing_rewards=raw"
            )
        self._next_achieved = episodes.next_observations()[:, goals.achieved]  # (N, G)

    def __len__(self) -> int:
        return len(self.windows)

    def __getattr__(self, name: str):  # sequence_transitions, transition_dim, device, nbytes
        if name == "windows":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.windows, name)

    def to(self, device: torch.device | str) -> GoalRelabelledWindows:
        moved = copy.copy(self)
        moved.windows = self.windows.to(device)
        return moved

    def _relabelled(
        self, starts: np.ndarray, later: np.ndarray, draws: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """`relabel` for windows starting at transitions `starts`: with a goal their episode
        reaches later where `later`, else with one they reach themselves, its step drawn
        uniformly by `draws` (in [0, 1))."""
        last = episode_last_rows(self.episodes, starts)
        L = self.windows.sequence_transitions
        goal_last = np.where(later, last, np.minimum(last, starts + L - 1))
        goal_steps = starts + np.floor(draws * (goal_last - starts + 1)).astype(np.int64)
        goal_steps = np.minimum(goal_steps, goal_last)
        return relabel(
            self.episodes,
            self.goals,
            self.reward,
            self.discount,
            starts,
            self._next_achieved[goal_steps],
            goal_steps,
            L,
            self._next_achieved,
            later & self.end_at_goal,
            self._continuing_scale,
        )

    @property
    def continuing(self) -> float:
        """The share of the windows relabelled with an episode that goes on past its goal."""
        return continuing_share(self.probability, self.end_at_goal, self.reached)

    def continuing_values_above_bins(self, count: int = 2048, seed: int = 0) -> ValuesAboveBins:
        """Of the value targets of `count` windows whose relabelled episode goes on past its
        goal (drawn with numpy's generator `seed`: torch's, a run's saved state, is left
        alone; a later goal or one the window reaches, in the shares that batches draw them),
        the share above the value bins' top edge, the largest, and that edge. The bins are fit
        on the dataset's own values, and a value above them is encoded as the top bin, and
        clipped to it as an input: such windows' values then say "at the goal" however long
        the point stays. Scaled rewards keep them within 1, the top of bins fit on episodes
        that reach their goals."""
        if self.continuing == 0:
            raise ValueError("no window is relabelled with an episode that goes on past its goal")
        generator = np.random.default_rng(seed)
        starts = generator.integers(0, len(self.windows), count)
        later = generator.random(count) >= self.reached / self.continuing
        transitions, valid = self._relabelled(starts, later, generator.random(count))
        values = transitions[..., -1][valid]
        top = float(self.discretizer.fitted_range()[1][-1])  # the value's
        return ValuesAboveBins(float(np.mean(values > top)), float(values.max()), top)

    def batch(
        self, window_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """As `TokenWindows.batch`, each window relabelled with a later goal with probability
        `probability`, with one it reaches itself with probability `reached`."""
        tokens, mask, values = self.windows.batch(window_ids)
        draws = torch.rand(len(window_ids), 2)  # torch's global generator: a run's saved state
        chosen = (draws[:, 0] < self.probability + self.reached).nonzero().flatten()
        if len(chosen) == 0:
            return tokens, mask, values
        later = (draws[chosen, 0] < self.probability).numpy()  # else a goal the window reaches
        # TokenWindows keeps one window per transition, in order: window i starts at
        # transition i.
        starts = window_ids.cpu().numpy()[chosen.numpy()]
        transitions, valid = self._relabelled(starts, later, draws[chosen, 1].numpy())
        flat = torch.as_tensor(transitions.reshape(-1, transitions.shape[-1]))
        new_tokens = self.discretizer.encode(flat.to(self.discretizer.device))
        L, T = self.windows.sequence_transitions, self.windows.transition_dim
        rows = chosen.to(tokens.device)
        tokens[rows] = new_tokens.reshape(len(chosen), L * T).to(tokens.device, tokens.dtype)
        valid_tokens = torch.as_tensor(valid).repeat_interleave(T, dim=1)
        mask[rows] = valid_tokens.to(mask.device)
        if values is not None:
            values[rows] = flat.reshape(len(chosen), L * T).to(values.device)
        return tokens, mask, values
