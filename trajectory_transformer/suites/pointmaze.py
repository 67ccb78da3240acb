"""Embedded goal-conditioned datasets for gymnasium-robotics' PointMaze, built locally.

``pointmaze/{umaze,medium,large}-v0`` follow the recipe of D4RL's maze2d datasets (Fu et al.,
2020), which Minari's ``D4RL/pointmaze/*-v2`` regenerated on the same environments
(``PointMaze_UMaze-v3``, ``PointMaze_Medium-v3``, ``PointMaze_Large-v3``); they are built on
demand, offline, over the suites' shared machinery (:mod:`trajectory_transformer.suites.collect`).
Nothing is downloaded: the maze, the point and the sparse reward are gymnasium-robotics' own.

Observations are a Dict, stored as such: ``achieved_goal`` (the point's x, y), ``desired_goal``
(the goal's x, y) and ``observation`` (x, y, vx, vy); training flattens them in that order
(:mod:`trajectory_transformer.data.minari_source`). Actions are forces in ``[-1, 1]^2``. The
reward is sparse: 1 on a step that ends within 0.45 of the goal, else 0.

The recipe (all of it is in each dataset's metadata, under ``recipe``):

* **Controller** (:class:`WaypointController`, D4RL's ``WaypointController``): the shortest
  path over the maze's grid of cells from the point's cell to the goal's (breadth-first search,
  ties in a fixed order); waypoints are the centres of the cells along it and, last, the goal
  itself. The point moves on to the next waypoint once it is within 0.1 of the current one
  and slower than 0.1. The action is a PD law on position and velocity, ``10 (waypoint -
  position) - velocity``, plus Gaussian noise of standard deviation 0.5 (``NOISE``), clipped to
  ``[-1, 1]``. Two departures from D4RL's controller, both deliberate: D4RL compared the
  *displacement in one step* with its speed threshold of 0.1, which a point that moves at most
  0.05 per step never exceeds, so its controller moved on at 0.1 from a waypoint at any speed;
  here the threshold applies to the velocity, so the point settles at every cell centre, and
  the noise then costs time: the behaviour policy scores about three quarters of the
  controller without noise, where D4RL's noisy and clean controllers scored alike (measured
  here on these mazes: both within 1% of each other), leaving the data no room below its
  reference. D4RL also shifted each waypoint by a random amount up to 0.2; here the action
  noise alone varies the paths.
* **Goals** are drawn at random by the environment (``reset_target=True``): a free cell, uniformly,
  and a uniform offset of up to 0.25 in x and y. **The task continues** after a goal is reached
  (``continuing_task=True``): the environment draws the next goal at once and the point goes on
  from where it is, without a reset. Each of ``STREAMS`` envs plays one such trajectory.
* **Episodes are cut** as in Minari's PointMaze datasets: an episode ends, by **truncation**, at
  the step that reaches its goal (reward 1), and the next one starts there with the new goal.
  Nothing terminates: the terminal penalty never applies, and every episode's value targets
  count down to its goal. The unfinished end of each trajectory is dropped, so every episode
  ends at its goal with a return of 1 (its only reward).
* **Observations show the goal in force.** At the step that reaches a goal, gymnasium-robotics
  returns the observation with the goal it has just replaced; :class:`ShowCurrentGoal` puts the
  new goal in it, the goal that the next episode pursues from that observation on (so the
  controller and the data never pair an observation with a goal that is no longer the task).
* **Size**: ``TRANSITIONS[maze]`` steps in ``STREAMS`` trajectories (D4RL's maze2d datasets hold
  1M to 4M); ``episodes=n`` builds one trajectory and keeps its first ``n`` episodes instead.

Evaluation follows Minari's ``eval_env``: the same maze with one goal cell (``Maze.goal_cell``,
Minari's), the start drawn among the other free cells, ``continuing_task=True`` and
``reset_target=False`` (the goal stays after it is reached), for the environment's time limit
(300, 600 or 800 steps). The return is the number of steps spent within 0.45 of the goal.
Reference scores, stored in the metadata: ``ref_min_score`` is the mean return of the uniform
random policy and ``ref_max_score`` that of the controller without noise, over
``REFERENCE_EPISODES`` seeded evaluation episodes. The behaviour policy (the controller with
its noise) is scored the same way and recorded as ``behaviour_policy``: the episodes of the
dataset itself have a return of 1 each and say nothing of how well the data's policy does the
evaluation task.
"""

from __future__ import annotations

import contextlib
import functools
import io
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.wrappers import FlattenObservation

from trajectory_transformer.scores import normalized_score
from trajectory_transformer.suites import collect

__all__ = [
    "MAZES",
    "NOISE",
    "OBSERVATION_SPACE",
    "STREAMS",
    "SUITES",
    "TRANSITIONS",
    "BehaviourAgent",
    "ShowCurrentGoal",
    "WaypointController",
    "behaviour_score",
    "episodes_of",
    "evaluation_env",
    "reference_scores",
    "split_at_goals",
]

ENTRY_POINT = "gymnasium_robotics.envs.maze.point_maze:PointMazeEnv"
REQUIREMENTS = ("gymnasium-robotics>=1.4",)
NOISE = 0.5
"""Standard deviation of the Gaussian noise added to the controller's actions (D4RL's)."""
POSITION_GAIN, VELOCITY_GAIN = 10.0, 1.0  # D4RL's p_gain 10, d_gain -1
WAYPOINT_DISTANCE, WAYPOINT_SPEED = 0.1, 0.1  # D4RL's solve_thresh and vel_thresh (on velocity)
GOAL_RADIUS = 0.45  # gymnasium-robotics: reward 1 within this distance of the goal
STREAMS = 10
"""Continuing trajectories collected side by side (one env each)."""
TRANSITIONS = {"umaze": 100_000, "medium": 150_000, "large": 200_000}
"""Default size of each dataset: steps over all trajectories, before their unfinished ends."""
REFERENCE_EPISODES = 50
"""Evaluation episodes of each reference policy (and of the behaviour policy): fewer than the
other suites' 100, since a maze episode is 300 to 800 steps and these take most of a build."""
REFERENCE_ENVS = 25  # evaluation episodes stepped together

OBSERVATION_SPACE = gym.spaces.Dict(
    {
        "achieved_goal": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64),
        "desired_goal": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64),
        "observation": gym.spaces.Box(-np.inf, np.inf, (4,), np.float64),
    }
)
"""PointMaze's observation space, whose flattened order (sorted keys) the controller reads."""
POSITION, GOAL, VELOCITY = slice(0, 2), slice(2, 4), slice(6, 8)  # in a flat observation


@dataclass(frozen=True)
class Maze:
    name: str
    env_id: str
    maze_map: tuple[tuple[int, ...], ...]  # gymnasium-robotics' map: 1 is a wall
    goal_cell: tuple[int, int]  # (row, column) of the evaluation goal, as Minari's eval maps
    time_limit: int  # the registered env's max_episode_steps

    @property
    def evaluation_map(self) -> list[list[int | str]]:
        """The map with its one goal cell marked "g" (starts are the other free cells)."""
        rows = [list(row) for row in self.maze_map]
        rows[self.goal_cell[0]][self.goal_cell[1]] = "g"
        return rows


MAZES = {
    "umaze": Maze(
        "umaze",
        "PointMaze_UMaze-v3",
        ((1, 1, 1, 1, 1), (1, 0, 0, 0, 1), (1, 1, 1, 0, 1), (1, 0, 0, 0, 1), (1, 1, 1, 1, 1)),
        (1, 1),
        300,
    ),
    "medium": Maze(
        "medium",
        "PointMaze_Medium-v3",
        (
            (1, 1, 1, 1, 1, 1, 1, 1),
            (1, 0, 0, 1, 1, 0, 0, 1),
            (1, 0, 0, 1, 0, 0, 0, 1),
            (1, 1, 0, 0, 0, 1, 1, 1),
            (1, 0, 0, 1, 0, 0, 0, 1),
            (1, 0, 1, 0, 0, 1, 0, 1),
            (1, 0, 0, 0, 1, 0, 0, 1),
            (1, 1, 1, 1, 1, 1, 1, 1),
        ),
        (6, 6),
        600,
    ),
    "large": Maze(
        "large",
        "PointMaze_Large-v3",
        (
            (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
            (1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1),
            (1, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1),
            (1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1),
            (1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1),
            (1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1),
            (1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1, 1),
            (1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1),
            (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
        ),
        (7, 9),
        800,
    ),
}


# ----------------------------------------------------------------------------- environments


def _spec(maze: Maze, maze_map: list, reset_target: bool, steps: int | None) -> EnvSpec:
    # A spec, not the registered id: building one imports nothing of gymnasium-robotics.
    return EnvSpec(
        id=maze.env_id,
        entry_point=ENTRY_POINT,
        max_episode_steps=steps,
        kwargs={
            "maze_map": maze_map,
            "reward_type": "sparse",
            "continuing_task": True,
            "reset_target": reset_target,
        },
    )


def collection_env(maze: Maze, steps: int | None = None) -> EnvSpec:
    """The env the data comes from: random goals, redrawn when reached; no time limit of its
    own (the trajectories' length is the collection's)."""
    return _spec(maze, [list(row) for row in maze.maze_map], True, steps)


def evaluation_env(maze: Maze) -> EnvSpec:
    """The env agents are scored in: one goal cell, kept when reached, the time limit."""
    return _spec(maze, maze.evaluation_map, False, maze.time_limit)


def import_gymnasium_robotics() -> None:
    """Import gymnasium-robotics, which registers its envs, without the notice it prints on
    import (about its Adroit envs' versions, none of which is used here)."""
    with contextlib.redirect_stderr(io.StringIO()):
        import gymnasium_robotics  # noqa: F401


class ShowCurrentGoal(gym.ObservationWrapper):
    """The observation's ``desired_goal`` is the goal in force after the step: at the step that
    reaches a goal, gymnasium-robotics returns the goal it has just replaced."""

    def observation(self, observation: dict) -> dict:
        return {**observation, "desired_goal": self.env.unwrapped.goal.copy()}


# ----------------------------------------------------------------------------- the controller


class WaypointController:
    """D4RL maze2d's waypoint controller, batched, settling at each waypoint (see the module
    docstring): a :data:`collect.Policy` over flat observations (``OBSERVATION_SPACE`` order).

    Each row keeps the waypoint it is heading for; a row whose goal changes (a goal reached and
    redrawn) or that starts an episode (``forget``, which ``collect.rollout`` calls) starts
    again from the next cell on its shortest path.
    """

    def __init__(self, maze: Maze, noise: float) -> None:
        walls = np.array(maze.maze_map) == 1
        self.rows, self.columns = walls.shape
        self.noise = noise
        cells = walls.size
        row, column = np.divmod(np.arange(cells), self.columns)
        # Cell centres in the maze's coordinates (gymnasium-robotics' cell_rowcol_to_xy).
        self.centres = np.stack([column + 0.5 - self.columns / 2, self.rows / 2 - row - 0.5], 1)
        self.next_cell = _next_cells(walls)  # (goal cell, cell) -> next cell on a shortest path
        self._goals = np.zeros((0, 2))
        self._waypoints = np.zeros(0, dtype=np.int64)  # the cell each row heads for

    def cell(self, xy: np.ndarray) -> np.ndarray:
        """(N,) flat cell index of positions (N, 2) (gymnasium-robotics' cell_xy_to_rowcol)."""
        row = np.clip(np.floor(self.rows / 2 - xy[:, 1]).astype(np.int64), 0, self.rows - 1)
        column = np.floor(xy[:, 0] + self.columns / 2).astype(np.int64)
        return row * self.columns + np.clip(column, 0, self.columns - 1)

    def __call__(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        action = self.steer(obs)
        noise = rng.normal(size=action.shape)  # drawn whatever the noise, for equal streams
        return np.clip(action + self.noise * noise, -1.0, 1.0).astype(np.float32)

    def steer(self, obs: np.ndarray) -> np.ndarray:
        """The PD law's action (N, 2) toward each row's waypoint, before noise and clipping;
        rows that have settled at their waypoint move on to the next."""
        position, goal, velocity = obs[:, POSITION], obs[:, GOAL], obs[:, VELOCITY]
        if len(self._goals) != len(obs):
            self._goals = np.full((len(obs), 2), np.nan)
            self._waypoints = np.zeros(len(obs), dtype=np.int64)
        goal_cell, here = self.cell(goal), self.cell(position)
        new = ~(self._goals == goal).all(axis=1)
        self._goals[new] = goal[new]
        self._waypoints[new] = self.next_cell[goal_cell[new], here[new]]
        target = self._target(goal, goal_cell)
        close = ((target - position) ** 2).sum(axis=1) < WAYPOINT_DISTANCE**2
        settled = close & ((velocity**2).sum(axis=1) < WAYPOINT_SPEED**2)
        advance = settled & (self._waypoints != goal_cell)
        self._waypoints[advance] = self.next_cell[goal_cell[advance], self._waypoints[advance]]
        target = self._target(goal, goal_cell)
        return POSITION_GAIN * (target - position) - VELOCITY_GAIN * velocity

    def forget(self, row: int) -> None:
        """Row `row` starts a new episode: its next call plans the path from where it is, even
        to a goal equal to its last one."""
        if row < len(self._goals):
            self._goals[row] = np.nan

    def _target(self, goal: np.ndarray, goal_cell: np.ndarray) -> np.ndarray:
        """The current waypoint's position: its cell's centre, or the goal in the goal's cell."""
        at_goal = (self._waypoints == goal_cell)[:, None]
        return np.where(at_goal, goal, self.centres[self._waypoints])


def _next_cells(walls: np.ndarray) -> np.ndarray:
    """(cells, cells) table: for a goal cell and a free cell, the neighbouring cell that a
    shortest path to the goal takes next (the goal cell for the goal itself; -1 for walls)."""
    rows, columns = walls.shape
    cells = walls.size
    table = np.full((cells, cells), -1, dtype=np.int64)
    for goal in np.flatnonzero(~walls.ravel()):
        table[goal, goal] = goal
        frontier = deque([goal])
        while frontier:  # breadth first from the goal: each cell's parent is its next step
            cell = frontier.popleft()
            row, column = divmod(int(cell), columns)
            for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
                r, c = row + dr, column + dc
                neighbour = r * columns + c
                inside = 0 <= r < rows and 0 <= c < columns
                if inside and not walls[r, c] and table[goal, neighbour] < 0:
                    table[goal, neighbour] = cell
                    frontier.append(neighbour)
    return table


def uniform_random(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=(len(obs), 2)).astype(np.float32)


# ----------------------------------------------------------------------------- episodes


def split_at_goals(stream: collect.Rollout) -> collect.Rollout:
    """Each trajectory of ``stream`` cut into episodes that end, by truncation, at the step
    that reaches their goal (reward 1); the unfinished end of each trajectory is dropped. The
    first episode of a trajectory keeps its reset seed, the others began without one."""
    columns: dict[str, list] = {c: [] for c in ("seeds", "o", "a", "r", "d", "t")}
    for i, seed in enumerate(stream.seeds):
        rewards = stream.rewards[i]
        if stream.terminations[i].any() or not np.isin(rewards, (0.0, 1.0)).all():
            raise RuntimeError("PointMaze episodes were expected to never terminate, rewards 0/1")
        start = 0
        for end in np.flatnonzero(rewards == 1.0):
            columns["seeds"].append(seed if start == 0 else None)
            columns["o"].append(stream.observations[i][start : end + 2])
            columns["a"].append(stream.actions[i][start : end + 1])
            columns["r"].append(rewards[start : end + 1])
            columns["d"].append(np.zeros(end + 1 - start, dtype=bool))
            truncated = np.zeros(end + 1 - start, dtype=bool)
            truncated[-1] = True
            columns["t"].append(truncated)
            start = end + 1
    return collect.Rollout(*(tuple(columns[c]) for c in ("seeds", "o", "a", "r", "d", "t")))


def episodes_of(maze_name: str, kind: str, episodes: int | None, seed: int) -> collect.Rollout:
    """The noisy controller's episodes (``kind`` "noisy"): by default ``STREAMS`` trajectories
    holding ``TRANSITIONS[maze]`` steps; with ``episodes``, the first ``episodes`` of one
    trajectory (twice the time limit per episode, ample for the controller)."""
    import_gymnasium_robotics()
    maze = MAZES[maze_name]
    if episodes is None:
        streams, steps = STREAMS, TRANSITIONS[maze_name] // STREAMS
    else:
        streams, steps = 1, 2 * episodes * maze.time_limit
    stream = collect.play(
        collection_env(maze),
        WaypointController(maze, NOISE),
        seed=seed,
        kind=_KIND_OFFSET[kind],
        episodes=streams,
        num_envs=streams,
        max_episode_steps=steps,
        fixed_length=True,
        wrappers=(ShowCurrentGoal, FlattenObservation),
    )
    result = split_at_goals(stream)
    if episodes is None:
        return result
    if len(result) < episodes:
        raise RuntimeError(
            f"the controller reached {len(result)} goals in {steps} steps of {maze.env_id}, "
            f"fewer than the {episodes} episodes asked for"
        )
    columns = ("seeds", "observations", "actions", "rewards", "terminations", "truncations")
    return collect.Rollout(*(getattr(result, c)[:episodes] for c in columns))


_KIND_OFFSET = {"noisy": 1}
_EVALUATION_STREAM = {"random": 0, "controller": 1, "behaviour": 2}  # each policy's noise


def returns_from_starts(
    maze_name: str, policies: dict[str, collect.Policy], starts: Sequence[int], seed: int = 0
) -> dict[str, float]:
    """Mean return of each policy over the evaluation env's episodes reset with the seeds
    ``starts`` (which place the point and the goal), each policy's noise drawn from ``seed``.
    The reference scores are these over ``collect.evaluation_seeds``; ``tt-eval`` plays the
    seeds ``eval.seed, eval.seed + 1, ...``."""
    import_gymnasium_robotics()
    maze = MAZES[maze_name]
    return {
        name: float(
            collect.rollout(
                evaluation_env(maze),
                policy,
                starts,
                np.random.default_rng([seed, collect.EVALUATION, _EVALUATION_STREAM[name]]),
                num_envs=min(REFERENCE_ENVS, len(starts)),
                fixed_length=True,
                wrappers=(FlattenObservation,),
            ).returns.mean()
        )
        for name, policy in policies.items()
    }


@functools.cache
def reference_scores(
    maze_name: str, seed: int = 0, episodes: int = REFERENCE_EPISODES
) -> tuple[float, float]:
    """``(ref_min_score, ref_max_score)``: mean returns of the uniform random policy and of the
    controller without noise in the evaluation env, over ``episodes`` seeded episodes (the same
    starts for both). Cached per process."""
    maze = MAZES[maze_name]
    policies = {"random": uniform_random, "controller": WaypointController(maze, 0.0)}
    starts = collect.evaluation_seeds(seed, episodes)
    returns = returns_from_starts(maze_name, policies, starts, seed)
    return returns["random"], returns["controller"]


@functools.cache
def behaviour_score(maze_name: str, seed: int = 0, episodes: int = REFERENCE_EPISODES) -> float:
    """Mean return of the behaviour policy (the controller with its noise) in the evaluation
    env, over the reference scores' episodes."""
    policy = {"behaviour": WaypointController(MAZES[maze_name], NOISE)}
    starts = collect.evaluation_seeds(seed, episodes)
    return returns_from_starts(maze_name, policy, starts, seed)["behaviour"]


class BehaviourAgent:
    """The policy that made a maze's dataset (the waypoint controller with its noise) as an
    evaluation agent, beside the learned ones (``tt-eval checkpoint=behaviour:<dataset id>``):
    ``reset``, ``reset_env``, ``act``, ``observe``, over flat observations.

    Each episode draws its noise from a stream of its own, named by ``seed`` and the episode's
    seed, so that it plays alike in whichever env; ``seed`` is the agent's draw of the noise,
    as a training seed is a model's. ``behaviour_score`` plays the same policy, with one
    stream for the whole batch."""

    def __init__(self, maze_name: str, seed: int = 0, noise: float = NOISE) -> None:
        self.maze = MAZES[maze_name]
        self.seed = seed
        self.noise = noise
        self.controller = WaypointController(self.maze, noise)
        self.generators: list[np.random.Generator] = []

    def reset(self, num_envs: int, seed: int | None = None) -> None:
        self.controller = WaypointController(self.maze, self.noise)
        self.generators = [self._stream(env + (seed or 0)) for env in range(num_envs)]

    def reset_env(self, env: int, seed: int | None = None) -> None:
        self.controller.forget(env)
        self.generators[env] = self._stream(env if seed is None else seed)

    def _stream(self, episode: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, episode])

    def act(self, observations: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
        action = self.controller.steer(np.asarray(observations, dtype=np.float64))
        noise = np.stack([generator.normal(size=action.shape[1]) for generator in self.generators])
        return np.clip(action + self.noise * noise, -1.0, 1.0).astype(np.float32)

    def observe(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        pass  # the controller's state follows the observations


# ----------------------------------------------------------------------------- the suites


def describe(maze_name: str, collected: collect.Collected) -> str:
    maze = MAZES[maze_name]
    low, high = collected.ref_scores
    episodes = collected.episodes
    behaviour = behaviour_score(maze_name, collected.seed, collected.reference_episodes)
    lengths = [len(r) for r in episodes.rewards]
    return (
        f"{collected.dataset.summary} {len(episodes)} episodes, {episodes.transitions} "
        f"transitions (mean length {np.mean(lengths):.0f}), each ending by truncation at the "
        "step that reaches its goal (reward 1, its only reward); the task continues "
        "(continuing_task=True): the next goal is drawn at once (reset_target=True) and the "
        "next episode starts there; nothing terminates. Base seed "
        f"{collected.seed}. Evaluation: {maze.env_id} with its goal in cell {maze.goal_cell}, "
        f"kept when reached (reset_target=False), {maze.time_limit} steps; the return counts "
        f"the steps within {GOAL_RADIUS} of the goal. Reference scores over "
        f"{collected.reference_episodes} episodes: uniform random {low:.1f}, the controller "
        f"without noise {high:.1f}; the behaviour policy scores {behaviour:.1f} (normalised "
        f"{float(normalized_score(behaviour, low, high)):.1f})."
    )


def metadata(maze_name: str, collected: collect.Collected) -> dict:
    """The recipe's settings and the behaviour policy's score, beside Minari's keys."""
    maze = MAZES[maze_name]
    low, high = collected.ref_scores
    behaviour = behaviour_score(maze_name, collected.seed, collected.reference_episodes)
    lengths = [len(r) for r in collected.episodes.rewards]
    return {
        "recipe": {
            "controller": "shortest path over the maze's cells (breadth-first search); "
            "waypoints: the cell centres along it, then the goal; next waypoint once within "
            f"{WAYPOINT_DISTANCE} and with a velocity below {WAYPOINT_SPEED} (D4RL maze2d's "
            "thresholds; D4RL compared its speed threshold with the displacement in one step, "
            "so its point never settled at the waypoints)",
            "action": f"clip({POSITION_GAIN} (waypoint - position) - {VELOCITY_GAIN} velocity "
            f"+ N(0, {NOISE}^2), -1, 1)",
            "action_noise_std": NOISE,
            "goals": "drawn by the env (reset_target=True): a free cell uniformly, plus a "
            "uniform offset of up to 0.25 in x and y",
            "continuing_task": True,
            "reset_target": True,
            "episode_end": "truncation at the step that reaches the goal (reward 1), as "
            "Minari's D4RL/pointmaze datasets; the unfinished end of each trajectory dropped",
            "terminations": 0,
            "observation_goal": "the goal in force after the step (ShowCurrentGoal)",
            "trajectories": sum(seed is not None for seed in collected.episodes.seeds),
            "default_steps": TRANSITIONS[maze_name],
            "episodes": len(lengths),
            "transitions": int(sum(lengths)),
            "episode_length_mean": float(np.mean(lengths)),
            "evaluation": {
                "goal_cell": list(maze.goal_cell),
                "continuing_task": True,
                "reset_target": False,
                "max_episode_steps": maze.time_limit,
                "return": f"steps within {GOAL_RADIUS} of the goal",
            },
            "reference_policies": {
                "ref_min_score": "uniform random actions",
                "ref_max_score": "the controller without noise",
            },
            "base_seed": collected.seed,
        },
        "behaviour_policy": {
            "return": behaviour,
            "normalized_score": float(normalized_score(behaviour, low, high)),
            "episodes": collected.reference_episodes,
        },
    }


def _suite(maze: Maze) -> collect.Suite:
    dataset = collect.Dataset(
        f"{maze.env_id}, D4RL maze2d's waypoint controller with action noise {NOISE}, to "
        "random goals.",
        f"waypoint PD controller (D4RL maze2d), noise {NOISE}",
        ("noisy",),
    )
    return collect.Suite(
        env_id=collection_env(maze),
        datasets={f"pointmaze/{maze.name}-v0": dataset},
        episodes_of=functools.partial(episodes_of, maze.name),
        reference_scores=functools.partial(reference_scores, maze.name),
        describe=functools.partial(describe, maze.name),
        namespace_description="PointMaze (gymnasium-robotics) datasets built locally in D4RL's "
        "maze2d recipe, by trajectory_transformer.",
        default_episodes=None,  # TRANSITIONS
        reference_episodes=REFERENCE_EPISODES,
        eval_env=evaluation_env(maze),
        observation_space=OBSERVATION_SPACE,
        requirements=REQUIREMENTS,
        metadata=functools.partial(metadata, maze.name),
        behaviour_agent=functools.partial(BehaviourAgent, maze.name),
    )


SUITES = tuple(_suite(maze) for maze in MAZES.values())
"""One suite per maze (each has an env of its own)."""
