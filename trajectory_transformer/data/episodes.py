"""Episodes as flat arrays, and the per-transition targets derived from them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DISCOUNT = 0.99
"""Default discount of the reward-to-go that becomes the value token (the paper's)."""
TERMINAL_PENALTY = -100.0
"""Default penalty added to the reward of a true termination (the paper's)."""


@dataclass(frozen=True)
class Episodes:
    """All transitions of a dataset, concatenated episode after episode.

    `terminated` marks a true end of the task (the environment said so); `truncated` marks a
    time limit or any other cut. Only terminations receive the terminal penalty.
    """

    observations: np.ndarray  # (N, O) float32
    actions: np.ndarray  # (N, A) float32
    rewards: np.ndarray  # (N,) float32
    terminated: np.ndarray  # (N,) bool, True only on the last step of a terminated episode
    truncated: np.ndarray  # (N,) bool
    lengths: np.ndarray  # (E,) int64, transitions per episode
    episode_ids: np.ndarray | None = None  # (E,) the dataset's own episode ids, for messages
    final_observations: np.ndarray | None = None
    """(E, O) float32, the observation after each episode's last step (Minari stores it): the
    next state of a truncated episode's last transition, which a critic bootstraps from."""

    def __post_init__(self) -> None:
        n = len(self.rewards)
        if int(self.lengths.sum()) != n:
            raise ValueError(f"episode lengths sum to {int(self.lengths.sum())}, not {n}")
        for name in ("observations", "actions", "terminated", "truncated"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, expected {n}")
        finals = self.final_observations
        if finals is not None and len(finals) != len(self.lengths):
            raise ValueError(f"final_observations has {len(finals)} rows, not {len(self.lengths)}")

    @property
    def num_transitions(self) -> int:
        return len(self.rewards)

    @property
    def num_episodes(self) -> int:
        return len(self.lengths)

    @property
    def observation_dim(self) -> int:
        return self.observations.shape[1]

    @property
    def action_dim(self) -> int:
        return self.actions.shape[1]

    @property
    def starts(self) -> np.ndarray:
        """Index of each episode's first transition, (E,)."""
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)

    def episode_returns(self) -> np.ndarray:
        """Undiscounted return of every episode, (E,)."""
        return np.add.reduceat(self.rewards.astype(np.float64), self.starts)

    def select(self, episodes: np.ndarray) -> Episodes:
        """The given episodes (indices, in the given order) as a dataset of their own."""
        episodes = np.asarray(episodes, dtype=np.int64)
        starts, lengths = self.starts[episodes], self.lengths[episodes]
        rows = np.concatenate(
            [np.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)]
            or [np.zeros(0, dtype=np.int64)]
        )
        return Episodes(
            observations=self.observations[rows],
            actions=self.actions[rows],
            rewards=self.rewards[rows],
            terminated=self.terminated[rows],
            truncated=self.truncated[rows],
            lengths=lengths.copy(),
            episode_ids=None if self.episode_ids is None else self.episode_ids[episodes],
            final_observations=(
                None if self.final_observations is None else self.final_observations[episodes]
            ),
        )

    def next_observations(self) -> np.ndarray:
        """The observation that follows each step, (N, O): the next step's, and after an
        episode's last step its final observation."""
        if self.final_observations is None:
            raise ValueError(
                "these episodes carry no final observations, so the last transition of each "
                "has no next state; load them with `episodes_from_minari`"
            )
        following = np.empty_like(self.observations)
        following[:-1] = self.observations[1:]
        ends = np.cumsum(self.lengths) - 1
        following[ends] = self.final_observations
        return following

    def split(self, fraction: float, seed: int) -> tuple[Episodes, Episodes, np.ndarray]:
        """(training, validation, validation episode indices): `fraction` of the episodes,
        whole, drawn with `seed`; at least one on each side when `fraction` > 0."""
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"the validation fraction must be in [0, 1), got {fraction}")
        E = self.num_episodes
        count = 0 if fraction == 0 else min(max(1, round(fraction * E)), E - 1)
        held_out = np.sort(np.random.default_rng(seed).permutation(E)[:count])
        kept = np.setdiff1d(np.arange(E), held_out)
        return self.select(kept), self.select(held_out), held_out

    def check_finite(self) -> None:
        """Refuse NaN or inf, naming the first episode that holds one: in its steps, or in
        the observation after its last step (which a critic bootstraps from)."""
        for name in ("observations", "actions", "rewards"):
            array = getattr(self, name)
            bad_rows = ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)
            if bad_rows.any():
                row = int(np.argmax(bad_rows))
                episode = int(np.searchsorted(np.cumsum(self.lengths), row, side="right"))
                step = row - int(self.starts[episode])
                raise ValueError(
                    f"episode {self._label(episode)} has a non-finite value (NaN or inf) in "
                    f"its {name} at step {step}; clean or drop that episode before training."
                )
        if self.final_observations is not None:
            bad = ~np.isfinite(self.final_observations.reshape(self.num_episodes, -1)).all(1)
            if bad.any():
                episode = int(np.argmax(bad))
                raise ValueError(
                    f"episode {self._label(episode)} has a non-finite value (NaN or inf) in "
                    "its final observation (the one after its last step); clean or drop that "
                    "episode before training."
                )

    def _label(self, episode: int) -> int:
        """The dataset's own id of episode `episode` (its index where there are none)."""
        return episode if self.episode_ids is None else int(self.episode_ids[episode])


def penalized_rewards(episodes: Episodes, terminal_penalty: float) -> np.ndarray:
    """Rewards with `terminal_penalty` added on true terminations only, (N,) float32."""
    rewards = episodes.rewards.astype(np.float32).copy()
    rewards[episodes.terminated] += terminal_penalty
    return rewards


def reward_to_go(rewards: np.ndarray, lengths: np.ndarray, discount: float) -> np.ndarray:
    """Discounted return that follows each step within its episode, (N,) float32.

    `V_t = sum_{k>t} discount^(k-t-1) r_k`: the reward of step t itself is not included, since
    the reward token already carries it. The last step of every episode has value 0.
    """
    values = np.zeros(len(rewards), dtype=np.float64)
    end = 0
    for length in lengths:
        start, end = end, end + int(length)
        following = 0.0
        # Backwards recursion V_t = r_{t+1} + discount * V_{t+1}; episodes are short enough
        # that a Python loop over steps is cheaper than building discount matrices.
        for t in range(end - 1, start - 1, -1):
            values[t] = following
            following = rewards[t] + discount * following
    return values.astype(np.float32)


def joint_transitions(episodes: Episodes, discount: float, terminal_penalty: float) -> np.ndarray:
    """The rows the model sees: `obs | act | reward | value`, (N, O + A + 2) float32."""
    rewards = penalized_rewards(episodes, terminal_penalty)
    values = reward_to_go(rewards, episodes.lengths, discount)
    return np.concatenate(
        [episodes.observations, episodes.actions, rewards[:, None], values[:, None]], axis=1
    ).astype(np.float32)
