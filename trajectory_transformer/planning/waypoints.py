"""Waypoints toward a far goal, along the paths the data travels.

A goal-conditioned model's value ranks plans well within a few dozen steps of its goal and
hardly at all hundreds of steps away, where a plan of a few steps changes the discounted
chance of arriving by less than the model's error. `WaypointGraph` joins the cells of the goal
space between which the data's consecutive steps move, and `head_for_waypoints` gives an agent,
in place of a goal farther than `lead`, the point that the shortest way there through those
cells reaches `lead` ahead: a goal near enough to plan toward, which moves on as the agent
does. `BeamPlanner` heads so itself (`planner.waypoint_lead`); `WaypointAgent` wraps any other
agent. The graph is the data's own steps, so it goes only where the data went (round walls, in
a maze) and needs no map: search on the replay buffer (Eysenbach et al., 2019) with the data's
transitions for edges in place of a learned distance.
"""

from __future__ import annotations

import heapq
import warnings

import numpy as np

from trajectory_transformer.data.episodes import Episodes
from trajectory_transformer.data.goals import GoalLayout
from trajectory_transformer.data.minari_source import DatasetInfo, load_episodes


class WaypointGraph:
    """The cells of a regular grid over the goal space (`cell` wide) that the data's achieved
    goals visit, each at the mean of the goals in it, with a directed edge from one cell to
    another wherever a step of an episode moves from the first to the second, as long as the
    straight line between their centres."""

    def __init__(self, positions: np.ndarray, lengths: np.ndarray, cell: float) -> None:
        """`positions` (N, G): the achieved goals of every row, episode after episode, whose
        lengths are `lengths` (E,)."""
        if cell <= 0.0:
            raise ValueError(f"the waypoints' cell must be positive, got {cell}")
        positions = np.asarray(positions, dtype=np.float64)
        self.cell = float(cell)
        keys = np.floor(positions / cell).astype(np.int64)
        cells, index = np.unique(keys, axis=0, return_inverse=True)
        index = index.reshape(-1)
        counts = np.bincount(index, minlength=len(cells))
        centres = np.zeros((len(cells), positions.shape[1]))
        np.add.at(centres, index, positions)
        self.centres = centres / counts[:, None]
        self._node_of = {tuple(key): node for node, key in enumerate(cells.tolist())}
        # Steps within an episode: every row but the last of each.
        within = np.ones(len(index), dtype=bool)
        within[np.cumsum(lengths) - 1] = False
        steps = np.stack([index[:-1][within[:-1]], index[1:][within[:-1]]], axis=1)
        edges = np.unique(steps[steps[:, 0] != steps[:, 1]], axis=0)
        cost = np.linalg.norm(self.centres[edges[:, 0]] - self.centres[edges[:, 1]], axis=1)
        # Incoming edges by destination, for searches back from a goal.
        order = np.argsort(edges[:, 1], kind="stable")
        self._sources, self._costs = edges[order, 0], cost[order]
        self._first_in = np.searchsorted(edges[order, 1], np.arange(len(cells) + 1))
        self._to_goal: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @classmethod
    def of(cls, episodes: Episodes, goals: GoalLayout, cell: float) -> WaypointGraph:
        """The graph of a goal-conditioned dataset's achieved goals."""
        return cls(episodes.observations[:, goals.achieved], episodes.lengths, cell)

    @classmethod
    def of_dataset(cls, info: DatasetInfo, cell: float) -> tuple[WaypointGraph, GoalLayout]:
        """The graph of the dataset `info` describes (a model's or a critic's), loaded by its
        id, and where its observations hold the goals; refused in a line that says what to
        do where they hold none."""
        layout = info.observation_layout
        try:
            goals = GoalLayout.of(layout)
        except ValueError:
            found = "a flat Box" if layout is None else f"the keys {[k for k, _ in layout]}"
            raise ValueError(
                "planner.waypoint_lead heads for points on the way to the goal, read from Dict "
                f"observations' achieved_goal and desired_goal, and {info.dataset_id}'s "
                f"observations have {found}; leave planner.waypoint_lead=null"
            ) from None
        episodes, loaded = load_episodes(info.dataset_id)
        trained, here = info.fingerprint, loaded.fingerprint
        if trained is not None and here is not None and trained != here:
            # Warned, not refused: an embedded dataset rebuilt on another machine may differ
            # in its last bits, and its paths still run through the same maze.
            warnings.warn(
                f"the waypoints come from {info.dataset_id} as it is on this machine (content "
                f"{here}), not the data the model or critic was trained on ({trained}): its "
                "ways to the goal may differ from the ones the agent learned",
                UserWarning,
                stacklevel=2,
            )
        return cls.of(episodes, goals, cell), goals

    @property
    def num_cells(self) -> int:
        return len(self.centres)

    def node(self, position: np.ndarray) -> int:
        """The cell holding `position`, or where no data went there, the nearest centre."""
        key = tuple(np.floor(np.asarray(position) / self.cell).astype(np.int64).tolist())
        node = self._node_of.get(key)
        if node is None:
            node = int(np.argmin(np.linalg.norm(self.centres - position, axis=1)))
        return node

    def to_goal(self, goal: int) -> tuple[np.ndarray, np.ndarray]:
        """From every cell, the length of the shortest way to cell `goal` (inf where the data
        never goes from it to there) and the next cell on it (-1 at the goal and where there is
        no way); computed once per goal cell (Dijkstra's, backwards from the goal)."""
        if goal in self._to_goal:
            return self._to_goal[goal]
        distance = np.full(self.num_cells, np.inf)
        next_cell = np.full(self.num_cells, -1, dtype=np.int64)
        distance[goal] = 0.0
        queue = [(0.0, goal)]
        while queue:
            length, node = heapq.heappop(queue)
            if length > distance[node]:
                continue
            for edge in range(self._first_in[node], self._first_in[node + 1]):
                source, through = int(self._sources[edge]), length + self._costs[edge]
                if through < distance[source]:
                    distance[source], next_cell[source] = through, node
                    heapq.heappush(queue, (through, source))
        self._to_goal[goal] = distance, next_cell
        return distance, next_cell

    def waypoint(self, position: np.ndarray, goal: np.ndarray, lead: float) -> np.ndarray:
        """The goal to head for from `position`: `goal` itself where the shortest way there is
        `lead` long or shorter (or where the data shows none), else the centre of the first
        cell on that way at least `lead` along it."""
        distance, next_cell = self.to_goal(self.node(goal))
        node = self.node(position)
        if not distance[node] > lead or not np.isfinite(distance[node]):
            return np.asarray(goal)
        start = distance[node]
        while start - distance[node] < lead:
            node = next_cell[node]
        return self.centres[node].astype(np.asarray(goal).dtype)


def head_for_waypoints(
    observations: np.ndarray, graph: WaypointGraph, goals: GoalLayout, lead: float
) -> np.ndarray:
    """A copy of `observations` (E, O) with each desired goal replaced by `graph`'s waypoint
    toward it from the row's achieved goal, `lead` ahead."""
    heading = np.array(observations, copy=True)
    for row in heading:
        row[goals.desired] = graph.waypoint(row[goals.achieved], row[goals.desired], lead)
    return heading


class WaypointAgent:
    """An agent (`evaluation.Agent`) that plays `agent` with each observation's desired goal
    replaced by `graph`'s waypoint toward it, `lead` ahead; everything else is `agent`'s. For a
    policy of its own, such as a critic's (`planner=iql`): `BeamPlanner` heads for waypoints
    itself, with `planner.waypoint_lead`."""

    def __init__(self, agent, graph: WaypointGraph, goals: GoalLayout, lead: float) -> None:
        if lead <= 0.0:
            raise ValueError(f"the waypoints' lead must be positive, got {lead}")
        self.agent, self.graph, self.goals, self.lead = agent, graph, goals, float(lead)

    @classmethod
    def of(cls, agent, lead: float, cell: float) -> WaypointAgent:
        """`agent` (a policy with a `dataset`, its `DatasetInfo`) headed for waypoints through
        the cells of its own dataset's achieved goals."""
        graph, goals = WaypointGraph.of_dataset(agent.dataset, cell)
        return cls(agent, graph, goals, lead)

    def reset(self, num_envs: int, seed: int | None = None) -> None:
        self.agent.reset(num_envs, seed)

    def reset_env(self, env: int, seed: int | None = None) -> None:
        if hasattr(self.agent, "reset_env"):
            self.agent.reset_env(env, seed)

    def act(self, observations: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
        heading = head_for_waypoints(observations, self.graph, self.goals, self.lead)
        return self.agent.act(heading, active)

    def observe(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        self.agent.observe(rewards, dones)

    def __getattr__(self, name: str):  # dataset, config, ...
        if name == "agent":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.agent, name)
