"""Beam-search planning with a static KV cache, batched over environments.

One planner serves one environment or many (a single env is a batch of one). Per plan call
each environment's context (its last real transitions plus the current observation) runs
through the model once; its keys and values are cached once per environment and shared by the
env's beams (`SharedPrefixKVCache`), which cache only their planned positions. Per planned
transition the beams expand, sample action, reward and value tokens, are scored by discounted
expected reward plus the expected terminal value, and the best `beam_width` per environment
survive to sample the next observation. Sampling stays on the device: no host sync in a plan call,
no tensor that grows per token, the same shapes throughout a plan call.

Rows. The cache holds E * beam_width * n_expand rows in its `RowLayout` order, an
environment being a group, its beams the members and the expansion candidates the copies:
the first copy holds the surviving beams, so the observation tokens, which are only decoded
after selection, run on a prefix of the rows. Every row of an environment shares its context,
stored once per env, so attention reads it once per env and beam selection only copies the
planned part of the cache. All row arithmetic goes through the layout.

Unequal context lengths. All rows of a forward pass share one position index, and positions
carry meaning (learned position embedding, dimension = position % T), so a short history can
neither be left-aligned nor padded without changing the plan. Environments are therefore
grouped by the number of past transitions they have and each group is planned on its own
(in order of length, reusing the same cache). In lock-step vector envs all environments have
the same history except for `context_transitions` steps after a reset, so there is almost
always one group. Inactive environments are not planned at all (their rows of the plan stay
zeros), so a batch with finished environments costs only the rows of the others.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import torch

from trajectory_transformer.checkpoint import (
    PRETRAINED,
    CheckpointError,
    pretrained_name,
    pretrained_planner_settings,
)
from trajectory_transformer.critic.model import IQLCritic, check_critic_matches, load_critic
from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.goals import GoalLayout
from trajectory_transformer.data.minari_source import DatasetInfo
from trajectory_transformer.model.decode import fused
from trajectory_transformer.model.decode.captured import CapturedCall
from trajectory_transformer.model.gpt import TrajectoryGPT
from trajectory_transformer.model.kv_cache import SharedPrefixKVCache
from trajectory_transformer.planning.config import PlannerConfig, goal_velocity_columns
from trajectory_transformer.planning.plan import Plan, build_plan, critic_q
from trajectory_transformer.planning.sampling import SearchNoise, sample_tokens
from trajectory_transformer.planning.waypoints import WaypointGraph, head_for_waypoints

if TYPE_CHECKING:
    import os

VALUE_PLACEHOLDER = 0
"""Token stored for the value of a real transition: the attention mask hides it anyway."""


def _compile_step(step: Callable) -> Callable:
    """`step` through `torch.compile`, whole and for fixed shapes. Dynamo keeps a graph per
    shape of the step, two per number of planned envs, and with fullgraph=True fails past its
    limit per function (8): a continuous-batching tail plans more numbers of envs than that,
    so only its overall limit applies here, and only inside these calls (a patch of dynamo's
    config, not a change of the process's)."""
    compiled = torch.compile(step, fullgraph=True, dynamic=False)

    def call(*args: torch.Tensor) -> torch.Tensor:
        dynamo = torch._dynamo.config
        with dynamo.patch(recompile_limit=dynamo.accumulated_recompile_limit):
            return compiled(*args)

    return call


@dataclass
class _Beams:
    """The per-row state of a search, rows in the cache's `RowLayout` order."""

    tokens: torch.Tensor  # (rows, H * T) the planned tokens
    rewards: torch.Tensor  # (rows, H) expected rewards
    values: torch.Tensor  # (rows, H) expected values
    so_far: torch.Tensor  # (rows,) sum_{i<h} discount^i reward_i
    log_likelihood: torch.Tensor  # (rows,) of the actions planned so far (`value=likelihood`)

    def select_(self, parent: torch.Tensor) -> None:
        """Rows [0, len(parent)) become the old rows `parent`, in every tensor."""
        for name in ("tokens", "rewards", "values", "so_far", "log_likelihood"):
            tensor = getattr(self, name)
            tensor[: len(parent)] = tensor.index_select(0, parent)


@dataclass
class _Search:
    """What one group's search leaves behind; `rows` and `cache` are kept for tests."""

    tokens: torch.Tensor  # (G, B, H, T)
    rewards: torch.Tensor  # (G, B, H)
    values: torch.Tensor  # (G, B, H)
    scores: torch.Tensor  # (G, B)
    rows: torch.Tensor  # (G * B,) cache row of each final beam
    cache: SharedPrefixKVCache


@dataclass
class _CapturedSearch:
    """A search's planned transitions captured as a CUDA graph, and the noise buffer it reads."""

    call: CapturedCall
    noise: SearchNoise


class BeamPlanner:
    """Batched beam-search planner over a trained `TrajectoryGPT`.

    ``reset(num_envs)`` (and ``reset_env(env, seed)`` as each env starts an episode), then
    per step ``act(observations)`` and ``observe(rewards, dones)``, for any of gymnasium's
    autoreset modes (`reset`'s ``autoreset_mode``: the vector env's, by default its default);
    ``plan(observations)`` returns all beams without changing any state. The model is put in
    eval mode.
    """

    def __init__(
        self,
        model: TrajectoryGPT,
        discretizer: Discretizer,
        config: PlannerConfig | None = None,
        device: torch.device | str | None = None,
        *,
        action_low: list[float] | np.ndarray | torch.Tensor | None = None,
        action_high: list[float] | np.ndarray | torch.Tensor | None = None,
        dataset: DatasetInfo | None = None,
        training_config: dict | None = None,
        critic_network: IQLCritic | None = None,
        **overrides: object,
    ) -> None:
        """`dataset` and `training_config` describe where the model came from (the dataset's
        spaces and ids, the resolved tt-train config); `from_checkpoint` fills them, and
        evaluation and figures read them. `critic_network` is the critic that `value=critic`
        scores with, else the one `config.critic` names is loaded. `overrides` set
        `PlannerConfig` fields."""
        self.config = (config or PlannerConfig()).with_overrides(**overrides)
        self.dataset = dataset
        self.training_config = training_config or {}
        self.device = torch.device(device) if device is not None else model.head_weight.device
        self.model = model.to(self.device).eval()
        self.discretizer = discretizer.to(self.device)
        gpt = model.config
        self.observation_dim, self.action_dim = gpt.observation_dim, gpt.action_dim
        self.transition_dim = T = gpt.transition_dim
        if self.discretizer.dims != T:
            raise ValueError(
                f"the discretizer has {self.discretizer.dims} dimensions but the model's "
                f"transitions have {T}; load both from the same checkpoint"
            )
        c = self.config
        self._sampling = c.token_sampling()  # per kind of token, fixed with the config
        self.max_len = (c.context_transitions + c.horizon) * T
        if self.max_len > gpt.block_size:
            raise ValueError(
                f"context_transitions + horizon = {c.context_transitions} + {c.horizon} "
                f"transitions of {T} tokens = {self.max_len} tokens exceeds the model's block "
                f"size of {gpt.block_size} ({gpt.sequence_transitions} transitions); lower "
                f"them to at most {gpt.sequence_transitions} transitions together"
            )
        held_length = (c.context_transitions + 1) * T + self.observation_dim
        if c.goal_tries is not None and held_length > gpt.block_size:
            raise ValueError(
                f"planner.goal_tries reads the observation after a tried action: "
                f"context_transitions + 1 = {c.context_transitions + 1} transitions and an "
                f"observation, {held_length} tokens, exceed the model's block size of "
                f"{gpt.block_size}; lower planner.context_transitions"
            )
        self.action_low = self._bound(action_low)
        self.action_high = self._bound(action_high)
        self.critic = self._critic(critic_network)
        self.goals = self._goal_layout()
        self.goal_velocity = self._goal_velocity()
        self._waypoint_graph: WaypointGraph | None = None  # built at the first use
        self.config = self._with_discount(self.config)
        # Device-held positions: a decode step reads its position without a host sync.
        self._positions = torch.arange(gpt.block_size, device=self.device)
        self._cache: SharedPrefixKVCache | None = None
        if c.decode == "fused" and (reason := fused.unavailable_reason(self.model)) is not None:
            raise ValueError(f"planner.decode=fused cannot run here: {reason}")
        # What is captured as a CUDA graph: nothing off CUDA.
        self.cuda_graph = self.config.cuda_graph if self.device.type == "cuda" else "none"
        # `goal_tries` on a device judges every env and masks: picking the held ones would
        # wait on the device to read which they are.
        self._hold_judges_every_env = self.device.type != "cpu"
        self.autoreset_mode = gym.vector.AutoresetMode.NEXT_STEP  # gymnasium's default
        # Captured or compiled decode steps and searches by shape, over `_cache`'s buffers.
        self._captures: OrderedDict[tuple, object] = OrderedDict()
        self._graph_pool = None
        self.reset(1)

    def _bound(self, bound: object) -> torch.Tensor | None:
        if bound is None:
            return None
        bound = torch.as_tensor(bound, dtype=torch.float32, device=self.device).reshape(-1)
        if bound.numel() != self.action_dim:
            raise ValueError(f"action bound has {bound.numel()} entries, not {self.action_dim}")
        return bound

    def _critic(self, network: IQLCritic | None) -> IQLCritic | None:
        """The critic of `value=critic`, refused when it was trained on another dataset."""
        c = self.config
        if c.value != "critic":
            return None
        if network is None:
            if c.critic is None:
                raise ValueError(
                    "planner.value=critic needs planner.critic=<path of a critic.pt>; train one "
                    "on the model's dataset with tt-train-critic"
                )
            checkpoint = load_critic(c.critic, self.device)
            if self.dataset is not None:
                check_critic_matches(checkpoint.dataset, self.dataset, c.critic)
            network = checkpoint.critic
        shape = network.shape
        if (shape.observation_dim, shape.action_dim) != (self.observation_dim, self.action_dim):
            raise CheckpointError(
                f"the critic takes {shape.observation_dim} observation and {shape.action_dim} "
                f"action dimensions, the model {self.observation_dim} and {self.action_dim}; "
                "train a critic on the model's dataset with tt-train-critic"
            )
        return network.to(self.device).eval()

    def _goal_layout(self) -> GoalLayout | None:
        """Where `goal_radius`, `goal_reward_radius` and `waypoint_lead` read the goal and the
        position in an observation."""
        named = [
            name
            for name in ("goal_radius", "goal_reward_radius", "waypoint_lead")
            if getattr(self.config, name) is not None
        ]
        if not named:
            return None
        layout = self.dataset.observation_layout if self.dataset is not None else None
        try:
            return GoalLayout.of(layout)
        except ValueError:
            keys = "no Dict layout" if layout is None else f"the keys {[k for k, _ in layout]}"
            raise ValueError(
                f"planner.{named[0]} reads the position and the goal from the observation's "
                f"achieved_goal and desired_goal, and this model's observations have {keys}; "
                f"leave planner.{named[0]}=null"
            ) from None

    @property
    def waypoints(self) -> WaypointGraph | None:
        """With `waypoint_lead`, the cells of the model's dataset through which `act` finds
        the ways to far goals (None without it); loaded at the first use, so that a planner
        that never acts needs no dataset."""
        if self.config.waypoint_lead is not None and self._waypoint_graph is None:
            # `_goal_layout` has found the goals in the dataset's layout.
            cell = self.config.waypoint_cell
            self._waypoint_graph, _ = WaypointGraph.of_dataset(self.dataset, cell)
        return self._waypoint_graph

    def _heading(self, observations: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """`observations` with each goal farther than `waypoint_lead` replaced by its waypoint
        (unchanged without `waypoint_lead`)."""
        graph = self.waypoints
        if graph is None:
            return observations
        if isinstance(observations, torch.Tensor):
            observations = observations.cpu().numpy()
        observations = np.asarray(observations, dtype=np.float32)
        lead = self.config.waypoint_lead
        return head_for_waypoints(observations, graph, self.goals, lead)

    def _goal_velocity(self) -> slice | None:
        """The observation's columns that `goal_velocity` names (None without it), one for
        each of the achieved goal's."""
        if self.config.goal_velocity is None:
            return None
        layout = self.dataset.observation_layout if self.dataset is not None else None
        columns = goal_velocity_columns(self.config.goal_velocity, layout or ())
        size = columns.stop - columns.start
        goal_size = self.goals.achieved.stop - self.goals.achieved.start
        if size != goal_size:
            raise ValueError(
                f"planner.goal_velocity={self.config.goal_velocity} has {size} values and the "
                f"achieved goal {goal_size}: it is the goal's velocity, one value per coordinate"
            )
        return columns

    def _with_discount(self, config: PlannerConfig) -> PlannerConfig:
        """`config` with the discount of its search. Scored by a critic, the planned rewards
        and the critic's Q are added, so they must be one reward with one discount: the
        critic's discount, and a critic trained with the model's terminal penalty."""
        if self.critic is None:
            return config.resolved()
        critic = self.critic
        if config.discount is not None and config.discount != critic.discount:
            raise ValueError(
                f"planner.discount={config.discount} differs from the discount "
                f"{critic.discount} that the critic was trained with; with planner.value=critic "
                "the search discounts the planned rewards and the critic's Q alike: leave "
                "planner.discount unset, or train a critic with "
                f"critic.discount={config.discount}"
            )
        if self.training_config or self.dataset is not None:
            from trajectory_transformer.checkpoint import value_targets_of

            _, penalty = value_targets_of(self.training_config)
            if critic.terminal_penalty != penalty:
                raise CheckpointError(
                    f"the critic was trained with a terminal penalty of "
                    f"{critic.terminal_penalty:g} on terminations, the model with {penalty:g}: "
                    "a critic-scored search would add planned rewards and Q values of two "
                    "different rewards. Train the critic with the model's, "
                    f"tt-train-critic critic.terminal_penalty={penalty:g}"
                )
        return config.resolved(critic.discount)

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, device: torch.device | str = "cpu", **overrides: object
    ) -> BeamPlanner:
        """A planner over a checkpoint's model, clipping actions to its dataset's bounds and
        discounting, unless told otherwise, as the checkpoint's value targets were built (as
        its critic was trained, with `value="critic"`). A pretrained one (`pretrained:<dataset
        id>`) plans with the settings its manifest's scores were measured with, under
        `overrides`."""
        from trajectory_transformer.checkpoint import load_checkpoint, value_targets_of

        checkpoint = load_checkpoint(path, device)
        name = pretrained_name(path)
        if name is not None:
            overrides = {**pretrained_planner_settings(name), **overrides}
        if overrides.get("discount") is None and overrides.get("value") != "critic":
            overrides["discount"] = value_targets_of(checkpoint.config)[0]
        return cls(
            checkpoint.model,
            checkpoint.discretizer,
            device=device,
            action_low=checkpoint.dataset.action_low,
            action_high=checkpoint.dataset.action_high,
            dataset=checkpoint.dataset,
            training_config=checkpoint.config,
            **overrides,
        )

    @classmethod
    def from_pretrained(
        cls, name: str, device: torch.device | str = "cpu", **overrides: object
    ) -> BeamPlanner:
        """A planner over the pretrained checkpoint of dataset `name` (`hopper/medium-v0`):
        `from_checkpoint("pretrained:<name>")`, with the planner settings its manifest's scores
        were measured with (`overrides` change any of them); an unknown name is refused with
        the list of known ones."""
        return cls.from_checkpoint(PRETRAINED + name, device, **overrides)

    # --- per-environment state ------------------------------------------------------------

    def reset(
        self,
        num_envs: int,
        seed: int | None = None,
        autoreset_mode: gym.vector.AutoresetMode | str | None = None,
    ) -> None:
        """Forget every context and plan, and seed every env's random stream: env e plays
        episode `seed + e` (episode e without a `seed`), see `episode_stream`.

        `autoreset_mode` is how the vector env starts an env's next episode after it ends
        (`env.metadata["autoreset_mode"]`; None keeps the planner's, at first gymnasium's
        default, `NEXT_STEP`). Under `NEXT_STEP` the step after an episode's end only resets
        that env: it ignores the action and returns the next episode's first observation
        with a reward of 0, so `act` does not plan for that step (the env gets a zero action)
        and `observe` stores nothing of it. Under `SAME_STEP` the step that ends an episode
        already returns the next one's first observation, and under `DISABLED` the caller
        resets the env: either way the next `act` starts the new episode."""
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        if seed is not None and seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if autoreset_mode is not None:
            try:
                self.autoreset_mode = gym.vector.AutoresetMode(autoreset_mode)
            except ValueError:
                modes = ", ".join(repr(mode.value) for mode in gym.vector.AutoresetMode)
                raise ValueError(
                    f"autoreset_mode must be a gymnasium AutoresetMode ({modes}), got "
                    f"{autoreset_mode!r}; pass the vector env's env.metadata['autoreset_mode']"
                ) from None
        E, K, T = num_envs, self.config.context_transitions, self.transition_dim
        H, n_act = self.config.horizon, self.action_dim
        self.num_envs = E
        # One generator per env: an episode's draws come from its own stream alone.
        self.generators = [torch.Generator(self.device) for _ in range(E)]
        for env in range(E):
            self.generators[env].manual_seed(self.episode_stream(env + (seed or 0)))
        # Shift buffer of each env's last K real transitions, oldest first; the valid ones are
        # the last `_history[e]`.
        self._context = torch.zeros(E, K, T, dtype=torch.long, device=self.device)
        # ... and their real values, the inputs of a model with value inputs.
        self._context_values = torch.zeros(E, K, T, device=self.device)
        self._history = np.zeros(E, dtype=np.int64)
        self._plan_actions = torch.zeros(E, H, n_act, device=self.device)  # best plan, decoded
        self._plan_tokens = torch.zeros(E, H, n_act, dtype=torch.long, device=self.device)
        self._plan_age = np.full(E, H, dtype=np.int64)  # steps taken since the last plan
        self._pending: torch.Tensor | None = None  # (E, T) transition awaiting its reward
        self._pending_values: torch.Tensor | None = None  # (E, T) its real values
        self._pending_envs = np.zeros(E, dtype=bool)
        # Under NEXT_STEP, envs whose next step only resets them, and those whose last `act`
        # was such a step.
        self._resetting = np.zeros(E, dtype=bool)
        self._skipped = np.zeros(E, dtype=bool)
        self.last_plan: Plan | None = None  # the latest search of `act`, all beams

    def reset_env(self, env: int, seed: int | None = None) -> None:
        """Env `env` alone starts a new episode: its context and plan are forgotten, and its
        random stream is seeded for episode `seed` (episode `env` without one); the other envs
        carry on. Evaluation calls it with each episode's seed as a slot starts it."""
        if not 0 <= env < self.num_envs:
            raise ValueError(f"env {env} is not one of the planner's {self.num_envs} envs")
        if seed is not None and seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self._history[env] = 0
        self._plan_age[env] = self.config.horizon
        self._resetting[env] = False  # reset by the caller: its observation is the episode's
        self.generators[env].manual_seed(self.episode_stream(env if seed is None else seed))

    def episode_stream(self, episode: int) -> int:
        """The seed of the random stream that plans episode `episode` (an evaluation's episode
        seed): one of `config.seed`'s own per episode, so that episodes draw independent
        numbers whichever env plays them."""
        stream = np.random.SeedSequence([self.config.seed, episode])
        return int(stream.generate_state(1, dtype=np.uint64)[0])

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """Host data on the device without the host waiting for the device: on CUDA a copy
        from pageable memory waits for the stream, one from pinned memory does not."""
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if self.device.type != "cuda":
            return tensor.to(self.device)
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _as_batch(self, observations: np.ndarray | torch.Tensor) -> torch.Tensor:
        if not isinstance(observations, torch.Tensor):
            observations = self._upload(np.asarray(observations, dtype=np.float32))
        obs = torch.as_tensor(observations, dtype=torch.float32, device=self.device)
        if obs.shape != (self.num_envs, self.observation_dim):
            raise ValueError(
                f"expected observations of shape ({self.num_envs}, {self.observation_dim}), "
                f"got {tuple(obs.shape)}; call reset(num_envs) to change the number of envs"
            )
        return obs

    def _mask(self, active: np.ndarray | torch.Tensor | None) -> np.ndarray:
        if active is None:
            return np.ones(self.num_envs, dtype=bool)
        if isinstance(active, torch.Tensor):
            active = active.cpu().numpy()
        mask = np.asarray(active, dtype=bool).reshape(-1)
        if mask.shape != (self.num_envs,):
            raise ValueError(f"active mask must have {self.num_envs} entries, got {mask.shape}")
        return mask

    def act(
        self,
        observations: np.ndarray | torch.Tensor,
        active: np.ndarray | torch.Tensor | None = None,
    ) -> np.ndarray:
        """Actions (E, A) for observations (E, O); inactive envs get zeros and record nothing,
        and so do envs whose next step only resets them (see `reset`'s `autoreset_mode`).

        Replans an env when its last plan is `plan_every` steps old, else follows that plan.
        Call `observe` with the rewards before the next `act`.
        """
        if self._pending_envs.any() or self._skipped.any():
            raise RuntimeError("act() was called twice; call observe(rewards, dones) in between")
        obs = self._as_batch(self._heading(observations))
        mask = self._mask(active)
        self._skipped = mask & self._resetting
        mask = mask & ~self._resetting
        stale = mask & (self._plan_age >= self.config.plan_every)
        if stale.any():
            self.last_plan = plan = self.plan(obs, active=stale)
            envs = self._upload(np.flatnonzero(stale))
            n_obs, n_act = self.observation_dim, self.action_dim
            best = plan.tokens[envs, plan.best[envs]]  # (n, H, T)
            self._plan_tokens[envs] = best[..., n_obs : n_obs + n_act]
            self._plan_actions[envs] = plan.actions[envs]
            self._plan_age[stale] = 0
        age = self._upload(np.minimum(self._plan_age, self.config.horizon - 1))
        envs = torch.arange(self.num_envs, device=self.device)
        keep = self._upload(mask)[:, None]  # (E, 1)
        actions = self._plan_actions[envs, age] * keep  # (E, A)
        transition = torch.zeros(
            self.num_envs, self.transition_dim, dtype=torch.long, device=self.device
        )
        transition[:, : self.observation_dim] = self._encode_observations(obs)
        transition[:, self.observation_dim : -2] = self._plan_tokens[envs, age]
        transition[:, -1] = VALUE_PLACEHOLDER
        self._pending = transition
        # The values the env sees: the observation, the action played; the reward follows.
        real = torch.zeros(self.num_envs, self.transition_dim, device=self.device)
        real[:, : self.observation_dim] = obs
        real[:, self.observation_dim : -2] = actions
        real[:, -1] = self._placeholder_value
        self._pending_values = real
        self._pending_envs = mask.copy()
        self._plan_age[mask] += 1
        return actions.cpu().numpy()

    def observe(self, rewards: np.ndarray | torch.Tensor, dones: np.ndarray | torch.Tensor) -> None:
        """Store the rewards (E,) of the last `act`; a done env starts its next act afresh."""
        dones = self._mask(dones)
        if self._pending is not None and self._pending_envs.any():
            if not isinstance(rewards, torch.Tensor):
                rewards = self._upload(np.asarray(rewards, dtype=np.float32))
            r = torch.as_tensor(rewards, dtype=torch.float32, device=self.device).reshape(-1, 1)
            dim = self.observation_dim + self.action_dim
            self._pending[:, dim] = self.discretizer.encode(r, slice(dim, dim + 1))[:, 0]
            self._pending_values[:, dim] = r[:, 0]
            envs = self._upload(np.flatnonzero(self._pending_envs))
            if self.config.context_transitions > 0:
                for kept, new in (
                    (self._context, self._pending),
                    (self._context_values, self._pending_values),
                ):
                    kept[envs] = torch.cat([kept[envs, 1:], new[envs, None]], dim=1)
            K = self.config.context_transitions
            self._history[self._pending_envs] = np.minimum(self._history[self._pending_envs] + 1, K)
        self._pending, self._pending_values = None, None
        self._pending_envs = np.zeros(self.num_envs, dtype=bool)
        self._resetting[self._skipped] = False  # that step reset them: their episode begins
        self._skipped = np.zeros(self.num_envs, dtype=bool)
        self._history[dones] = 0
        self._plan_age[dones] = self.config.horizon
        if self.autoreset_mode == gym.vector.AutoresetMode.NEXT_STEP:
            self._resetting |= dones

    def set_history(
        self, env: int, transitions: torch.Tensor, values: torch.Tensor | None = None
    ) -> None:
        """Make `transitions` (n, T) tokens, oldest first, env `env`'s last n <= context
        real transitions, as if it had acted and observed them (a benchmark's context, or
        an episode resumed mid-way). `values` (n, T) are their real values, for a model with
        value inputs (default: what the tokens decode to)."""
        K, T = self.config.context_transitions, self.transition_dim
        n = transitions.shape[0]
        if transitions.ndim != 2 or transitions.shape[1] != T or n > K:
            raise ValueError(
                f"a history is (n, {T}) tokens with n <= {K} (context_transitions), got "
                f"{tuple(transitions.shape)}"
            )
        if values is not None and values.shape != transitions.shape:
            raise ValueError(
                f"the history's values {tuple(values.shape)} must have its tokens' shape"
            )
        transitions = transitions.to(self._context)
        if values is None:
            values = self.discretizer.decode(transitions)
        self._context[env, K - n :] = transitions
        self._context_values[env, K - n :] = values.to(self._context_values)
        self._history[env] = n

    def _encode_observations(self, obs: torch.Tensor) -> torch.Tensor:
        return self.discretizer.encode(obs, slice(0, self.observation_dim))  # (E, O)

    def context_tokens(self, observations: np.ndarray | torch.Tensor) -> list[torch.Tensor]:
        """Each env's planning context, 1-D: its kept real transitions, then the observation
        (headed for its waypoint, as `act` plans from it)."""
        obs = self._encode_observations(self._as_batch(self._heading(observations)))
        K = self.config.context_transitions
        return [
            torch.cat([self._context[e, K - int(n) :].reshape(-1), obs[e]])
            for e, n in enumerate(self._history)
        ]

    def context_values(self, observations: np.ndarray | torch.Tensor) -> list[torch.Tensor]:
        """The real values of `context_tokens`: what a model with value inputs is given."""
        obs = self._as_batch(self._heading(observations))
        K = self.config.context_transitions
        return [
            torch.cat([self._context_values[e, K - int(n) :].reshape(-1), obs[e]])
            for e, n in enumerate(self._history)
        ]

    @property
    def _placeholder_value(self) -> torch.Tensor:
        """The real value stored with `VALUE_PLACEHOLDER`: what it decodes to (hidden too)."""
        return self.discretizer.values[self.transition_dim - 1, VALUE_PLACEHOLDER]

    # --- planning -------------------------------------------------------------------------

    @torch.inference_mode()
    def plan(
        self,
        observations: np.ndarray | torch.Tensor,
        active: np.ndarray | torch.Tensor | None = None,
    ) -> Plan:
        """Plan from every active env's context and current observation (E, O).

        Nothing in the call waits on the device: the envs are grouped by host data, and the
        searches write their results into preallocated tensors."""
        c = self.config
        E, B, H, T = self.num_envs, c.beam_width, c.horizon, self.transition_dim
        obs = self._as_batch(observations)  # (E, O)
        obs_tokens = self._encode_observations(obs)  # (E, O)
        value_inputs = self.model.config.value_inputs
        mask = self._mask(active)
        tokens = torch.zeros(E, B, H, T, dtype=torch.long, device=self.device)
        rewards = torch.zeros(E, B, H, device=self.device)
        values = torch.zeros(E, B, H, device=self.device)
        scores = torch.zeros(E, B, device=self.device)
        groups = self._groups(mask)
        if groups:
            cache = self._get_cache(max(len(envs) for envs in groups.values()))
        for n, envs in groups.items():
            index = self._upload(envs)
            K = c.context_transitions
            past = self._context[index, K - n :].reshape(len(envs), n * T)  # (G, n*T)
            context = torch.cat([past, obs_tokens[index]], dim=1)  # (G, n*T + O)
            real = None
            if value_inputs:
                past = self._context_values[index, K - n :].reshape(len(envs), n * T)
                real = torch.cat([past, obs[index]], dim=1)  # (G, n*T + O)
            generators = [self.generators[e] for e in envs]
            search = self._search(context, cache, generators, real)
            if c.goal_tries is not None:
                self._hold_action(search.tokens, context, real, generators)
            tokens[index] = search.tokens
            rewards[index] = search.rewards
            values[index] = search.values
            scores[index] = search.scores
        return build_plan(
            tokens,
            rewards,
            values,
            scores,
            self._upload(mask),
            self.discretizer,
            self.observation_dim,
            self.action_low,
            self.action_high,
        )

    def _groups(self, mask: np.ndarray) -> dict[int, np.ndarray]:
        """Indices of the active envs per history length (host data: no device read)."""
        lengths = np.where(mask, self._history, -1)
        return {int(n): np.flatnonzero(lengths == n) for n in np.unique(lengths[mask])}

    def _get_cache(self, envs: int) -> SharedPrefixKVCache:
        """The planner's cache, reallocated only when more rows are needed.

        Each env's context (at most `context_transitions` transitions and an observation) is
        its shared prefix; each row keeps the planned positions after it.
        """
        c, T, n_obs = self.config, self.transition_dim, self.observation_dim
        rows = envs * c.beam_width * c.n_expand
        if self._cache is None or self._cache.rows < rows:
            self._cache = self.model.new_shared_prefix_cache(
                prefix_rows=envs,
                rows_per_prefix=c.beam_width,
                rows=rows,
                prefix_len=c.context_transitions * T + n_obs,
                own_len=c.horizon * T - n_obs,
            )
            self._captures.clear()  # they read the old buffers
        return self._cache

    MAX_CAPTURES = 8
    """Decode steps or searches kept captured or compiled per planner, one per shape (the
    number of planned envs; for a step also its rows, for a search their history length; a
    continuous-batching tail plans fewer and fewer envs); the least recently used goes first."""

    def _captured(self, key: tuple, build: Callable[[], object]) -> object:
        """The capture (or compilation) of shape `key`, built on first use."""
        entry = self._captures.get(key)
        if entry is None:
            while len(self._captures) >= self.MAX_CAPTURES:
                self._captures.popitem(last=False)
            entry = self._captures[key] = build()
        self._captures.move_to_end(key)
        return entry

    def _pool(self) -> tuple[int, int]:
        """The memory pool that this planner's CUDA graphs share."""
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        return self._graph_pool

    def _decoder(self, cache: SharedPrefixKVCache) -> Callable:
        """The decode step of a search over `cache` (after its prefill): `_step`, captured as
        a CUDA graph with `cuda_graph=step`."""
        step = self._step(cache)
        if self.cuda_graph != "step":
            return step

        def captured_step(
            tokens: torch.Tensor, position: torch.Tensor, observation: torch.Tensor | None = None
        ) -> torch.Tensor:
            # One capture per number of envs and of rows: a search decodes observations on
            # its beams' rows, everything else on all its candidates'.
            key = ("captured step", cache.groups, tokens.shape[0])
            inputs = (tokens, position) if observation is None else (tokens, position, observation)
            return self._captured(key, lambda: CapturedCall(step, self._pool()))(*inputs)

        return captured_step

    def _step(self, cache: SharedPrefixKVCache) -> Callable:
        """The decode step as `decode` computes it, uncaptured. Where something is captured,
        the PyTorch step with a device-held position (`static_decoder`); otherwise
        `model.decoder`, which takes the native kernels on the CPU; with `decode=fused`, the
        Triton kernels, captured or not."""
        if self.config.decode == "fused":
            return fused.decoder(self.model, cache)
        if self.config.decode == "compile":
            key = ("compiled step", cache.groups)
            return self._captured(key, lambda: _compile_step(self.model.static_decoder(cache)))
        if self.cuda_graph == "none":
            return self.model.decoder(cache)
        return self.model.static_decoder(cache)

    def _position(self, position: int) -> torch.Tensor:
        """Absolute `position` as a device tensor (1,): a view, no host-to-device copy."""
        return self._positions[position : position + 1]

    def _sample(self, logits: torch.Tensor, kind: str, noise: torch.Tensor | None) -> torch.Tensor:
        """Tokens of `kind` (obs, act, reward, value) under the planner's settings, drawn with
        `noise` (rows, N) from a `SearchNoise`."""
        return sample_tokens(logits, noise, **self._sampling[kind])

    def _expected(self, logits: torch.Tensor, dim: int) -> torch.Tensor:
        probs = (logits / self.config.temperature).softmax(dim=-1)
        return self.discretizer.expectation(probs, dim, self.config.value_percentile)

    def _score(
        self,
        beams: _Beams,
        h: int,
        reward: torch.Tensor,
        value: torch.Tensor,
        at_goal: torch.Tensor | None = None,
    ):
        """The scoring rule, in one place: after planning transition `h`, a candidate scores
        its discounted expected rewards so far plus the discounted expected value after `h`,
        `sum_{i<=h} discount^i r_i + discount^(h+1) V_h`. Records `reward` and `value` (rows,)
        and returns the scores (rows,).

        With `value=critic` the critic's `Q(s_h, a_h)` of the transition just planned (its
        observation and action tokens decoded) ends the score instead, and the model's
        expected rewards before it count in the critic's units (`r' = scale * r + bias`, as
        it was trained): `sum_{i<h} discount^i r'_i + discount^h Q(s_h, a_h)`. Q already holds
        r_h and everything after it, so the model's value token is not used; `values`
        records Q. With `goal_radius`, a candidate whose env is at its goal (`at_goal`, rows,
        from `_at_goal`) scores by `_stay_at_goal` instead.

        With `value=likelihood` the score is the log-probability of the planned action tokens
        so far (summed as they are drawn, `_plan_transitions`); `rewards` and `values` still
        record the model's expectations."""
        discount = self.config.discount
        if self.config.value == "likelihood":
            beams.rewards[:, h], beams.values[:, h] = reward, value
            scores = beams.log_likelihood
        elif self.critic is None:
            beams.rewards[:, h], beams.values[:, h] = reward, value
            beams.so_far = beams.so_far + discount**h * reward
            scores = beams.so_far + discount ** (h + 1) * value
        else:
            T, n_obs = self.transition_dim, self.observation_dim
            transition = beams.tokens[:, h * T : (h + 1) * T - 2]  # (rows, O + A)
            q = critic_q(
                self.critic, self.discretizer, transition, n_obs, self.action_low, self.action_high
            )
            beams.rewards[:, h], beams.values[:, h] = reward, q
            scores = beams.so_far + discount**h * q
            beams.so_far = beams.so_far + discount**h * self.critic.scale_rewards(reward)
        if at_goal is not None:
            scores = self._stay_at_goal(beams.tokens, h, scores, at_goal)
        return scores

    def _at_goal(
        self, tokens: torch.Tensor, radius: float, desired: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Whether the position of each row's observation (its first O tokens) is within
        `radius` of its goal (rows,); `desired`, the goals (rows, G), where the caller has
        them decoded already (`_desired_goals`)."""
        goals = self.goals
        if desired is None:
            desired = self._desired_goals(tokens)
        now = self.discretizer.decode(tokens[:, goals.achieved], goals.achieved)
        return (now - desired).norm(dim=-1) <= radius

    def _desired_goals(self, tokens: torch.Tensor) -> torch.Tensor:
        """The goal (rows, G) of each row's observation (its first O tokens)."""
        return self.discretizer.decode(tokens[:, self.goals.desired], self.goals.desired)

    def _stay_at_goal(
        self, tokens: torch.Tensor, h: int, scores: torch.Tensor, at_goal: torch.Tensor
    ) -> torch.Tensor:
        """`goal_radius`'s rule: where a candidate's env is at its goal (`at_goal`), its score
        is minus the mean distance from the goal of its planned positions up to transition
        `h` (the latest the plan has decoded), so that the search keeps what gets closest
        soonest and stays; with `goal_velocity`, each position carried on at its planned
        velocity for `goal_lookahead`, so that it stops on the goal; elsewhere `scores`
        (rows,)."""
        goals, decode, T = self.goals, self.discretizer.decode, self.transition_dim
        desired = self._desired_goals(tokens)  # (rows, G)
        planned = tokens[:, : (h + 1) * T].view(-1, h + 1, T)
        positions = decode(planned[:, :, goals.achieved], goals.achieved)  # (rows, h + 1, G)
        velocity = None
        if self.goal_velocity is not None:
            velocity = decode(planned[:, :, self.goal_velocity], self.goal_velocity)
        distance = self._lookahead_distance(positions, velocity, desired)
        return torch.where(at_goal, -distance, scores)

    def _hold_action(
        self,
        plans: torch.Tensor,
        context: torch.Tensor,
        real: torch.Tensor | None,
        generators: list[torch.Generator],
    ) -> None:
        """`goal_tries`' rule: where env g's current observation is within `goal_radius` of
        its goal, its `plans` (tokens (G, B, H, T), in place) start with the best of
        `goal_tries` actions drawn uniformly over the bins from `generators[g]`. Each action is
        judged by where the model expects it to lead: after it, the most likely reward, value
        and observation tokens are fed back one at a time, and the expected values of the next
        position (and of its velocity, with `goal_velocity`) give `_lookahead_distance`.

        Every env draws its tries, held or not, so that its random numbers do not depend on
        where the others are. On the CPU only the held envs are judged; on a GPU every env is,
        and the mask picks (`_hold_judges_every_env`)."""
        c, n_obs, n_act = self.config, self.observation_dim, self.action_dim
        K, N = c.goal_tries, self.model.config.n_bins
        current = context[:, context.shape[1] - n_obs :]  # (G, O): the current observations
        desired = self._desired_goals(current)  # (G, goal dims)
        held = self._at_goal(current, c.goal_radius, desired)  # (G,)
        draws = [
            torch.randint(N, (K, n_act), generator=generator, device=self.device)
            for generator in generators
        ]
        actions = torch.stack(draws)  # (G, K, A)
        envs = None
        if not self._hold_judges_every_env:
            envs = held.nonzero()[:, 0]
            if len(envs) == 0:
                return
            context, actions, desired = context[envs], actions[envs], desired[envs]
            real = None if real is None else real[envs]
        G, L = context.shape
        # Then the reward and the value, and the next observation up to the last column read,
        # each the likeliest token fed back: a decode step each, over a cache whose shared
        # prefix is each env's context and whose K rows per env start with its tries.
        goals, velocity = self.goals, self.goal_velocity
        last = max(goals.achieved.stop, velocity.stop if velocity is not None else 0)
        columns = [n_obs + n_act, n_obs + n_act + 1, *range(last)]
        cache = self.model.new_shared_prefix_cache(
            prefix_rows=G,
            rows_per_prefix=K,
            rows=G * K,
            prefix_len=L,
            own_len=n_act + len(columns) - 1,  # the tries and every token fed back
        )
        self.model.prefill(context, cache, values=real)
        observation = None  # the tries' transition's vector, with `observation_vector`
        if self.model.config.observation_vector:
            observation = self._current_observation_vectors(context, real)
            observation = observation.repeat_interleave(K, dim=0)  # (G*K, d): row r is env r // K
        tries = actions.reshape(G * K, n_act)
        action_values = None
        if self.model.config.value_inputs:
            action_values = self.discretizer.decode(tries, slice(n_obs, n_obs + n_act))
        logits = self.model.prefill(
            tries, cache, start=L, values=action_values, observation=observation
        )[:, -1]  # (G*K, N)
        step = self.model.decoder(cache)
        expected = torch.zeros(G * K, last, device=self.device)
        for i, column in enumerate(columns):
            token = logits.argmax(dim=-1)  # (G*K,)
            if column < n_obs:
                probs = logits.softmax(dim=-1)
                expected[:, column] = self.discretizer.expectation(probs, column)
            if i + 1 < len(columns):  # the next column's logits, after this token
                logits = step(token, L + n_act + i, observation)
        positions = expected[:, goals.achieved].view(G, K, 1, -1)
        speeds = None if velocity is None else expected[:, velocity].view(G, K, 1, -1)
        distance = self._lookahead_distance(positions, speeds, desired[:, None])  # (G, K)
        best = actions[torch.arange(G, device=self.device), distance.argmin(dim=-1)]  # (G, A)
        first = slice(n_obs, n_obs + n_act)
        if envs is None:
            plans[:, :, 0, first] = torch.where(
                held[:, None, None], best[:, None], plans[:, :, 0, first]
            )
        else:
            plans[envs, :, 0, first] = best[:, None]

    def _lookahead_distance(
        self, positions: torch.Tensor, velocity: torch.Tensor | None, desired: torch.Tensor
    ) -> torch.Tensor:
        """Mean distance (...,) from `desired` (..., G) of positions (..., n, G), each carried
        on at its `velocity` (..., n, G) for `goal_lookahead` where a velocity is given."""
        if velocity is not None:
            positions = positions + self.config.goal_lookahead * velocity
        return (positions - desired[..., None, :]).norm(dim=-1).mean(-1)

    def _search(
        self,
        context: torch.Tensor,
        cache: SharedPrefixKVCache,
        generators: list[torch.Generator],
        context_values: torch.Tensor | None = None,
    ) -> _Search:
        """Beam search from contexts (G, n*T + O) of one length, with their real values (for
        a model with value inputs; the planned tokens carry what they decode to), env g
        drawing its random numbers from `generators[g]`; see the module docstring.

        The context's prefill and the random numbers come first; the planned transitions
        (`_plan_transitions`) then have fixed shapes and call no generator, so with
        `cuda_graph=search` they are one CUDA graph per (envs, context length)."""
        G, context_length = context.shape
        # Prefill: one forward pass per env, whose context is the shared prefix of its rows.
        logits = self.model.prefill(context, cache, values=context_values)[:, -1]  # (G, N)
        observation = self._current_observation_vectors(context, context_values)
        if self.cuda_graph == "search":
            search = self._captured(
                ("search", G, context_length), lambda: self._new_search(cache, G)
            )
            search.noise.draw(generators)  # into the buffer that the graph reads
            found = search.call(context, logits, observation)
        else:
            noise = self._new_noise(G, context.device)
            noise.draw(generators)
            decode = self._decoder(cache)
            found = self._plan_transitions(context, logits, observation, noise, cache, decode)
        return _Search(*found, cache=cache)

    def _current_observation_vectors(
        self, context: torch.Tensor, context_values: torch.Tensor | None
    ) -> torch.Tensor:
        """The vectors (G, d) of the contexts' current observations, from their real values,
        for a model with `observation_vector`; (G, 0) for another."""
        if not self.model.config.observation_vector:
            return context.new_zeros(context.shape[0], 0, dtype=torch.float32)
        O = self.observation_dim  # noqa: E741
        values = None if context_values is None else context_values[:, -O:]
        return self.model.observation_vectors(context[:, -O:], values)

    def _new_noise(self, groups: int, device: torch.device) -> SearchNoise:
        c = self.config
        n_bins, B, X, H = self.model.config.n_bins, c.beam_width, c.n_expand, c.horizon
        sampling, A, O = self._sampling, self.action_dim, self.observation_dim  # noqa: E741
        return SearchNoise(sampling, A, O, n_bins, groups, B, X, H, device)

    def _new_search(self, cache: SharedPrefixKVCache, groups: int) -> _CapturedSearch:
        """`_plan_transitions` over `cache` for `groups` envs, captured as one CUDA graph, with
        the noise buffer it reads."""
        noise = self._new_noise(groups, cache.device)
        decode = self._step(cache)

        def plan_transitions(
            context: torch.Tensor, logits: torch.Tensor, observation: torch.Tensor
        ):
            return self._plan_transitions(context, logits, observation, noise, cache, decode)

        return _CapturedSearch(CapturedCall(plan_transitions, self._pool()), noise)

    def _plan_transitions(
        self,
        context: torch.Tensor,
        first_logits: torch.Tensor,
        first_observation: torch.Tensor,
        noise: SearchNoise,
        cache: SharedPrefixKVCache,
        decode: Callable,
    ) -> tuple[torch.Tensor, ...]:
        """The planned transitions of a search after its prefill: from the contexts (G, L),
        each env's logits of its first action token (G, N) and its current observation's
        vector (G, d) (`_current_observation_vectors`), and the search's drawn `noise`,
        decoding with `decode(tokens, position, observation)`. Returns the tokens
        (G, B, H, T), rewards and values (G, B, H), scores (G, B) and cache rows (G * B,) of
        the final beams.

        Plan columns index a transition's tokens in the plan (transition h starts at column
        h * T); absolute positions are where a token sits in the model's sequence, the plan
        starting at `plan_start`, the position of the current observation."""
        c = self.config
        obs_dim, act_dim, T = self.observation_dim, self.action_dim, self.transition_dim
        REWARD, VALUE = obs_dim + act_dim, obs_dim + act_dim + 1  # offsets in a transition
        G, context_length = context.shape
        B, X, H = c.beam_width, c.n_expand, c.horizon
        plan_start = context_length - obs_dim
        layout = cache.layout
        n_beams = layout.per_copy  # G * B rows hold the beams (expansion copy 0)
        n_candidates = n_beams * X  # every beam's X expansion copies
        # Observations are decoded on the beams' rows alone (their copies would decode the
        # same tokens), and the copies are refilled after: half the rows for two thirds of the
        # steps. A static step so takes two shapes per search, compiled or captured once each.
        at = self._position  # absolute position -> device tensor (1,)
        env_of_row = layout.group_of_rows(n_candidates, context.device)  # (rows,)
        logits = first_logits[env_of_row]  # (rows, N)
        # With `observation_vector`, every step takes its transition's observation vector:
        # the real observation's, then each planned one's once its tokens are decoded.
        with_observation = self.model.config.observation_vector
        observation = first_observation[env_of_row] if with_observation else None  # (rows, d)
        beams = _Beams(
            tokens=torch.zeros(n_candidates, H * T, dtype=torch.long, device=context.device),
            rewards=torch.zeros(n_candidates, H, device=context.device),
            values=torch.zeros(n_candidates, H, device=context.device),
            so_far=torch.zeros(n_candidates, device=context.device),
            log_likelihood=torch.zeros(n_candidates, device=context.device),
        )
        beams.tokens[:, :obs_dim] = context[env_of_row, plan_start:]
        # With `goal_radius`, the candidates of an env at its goal try actions drawn uniformly
        # over the bins (the model's own there are the data's, which pass through goals), and
        # score by `_stay_at_goal`. A row stays its env's as beams are selected: computed once.
        with_radius = self.config.goal_radius is not None
        at_goal = self._at_goal(beams.tokens, self.config.goal_radius) if with_radius else None
        by_likelihood = self.config.value == "likelihood"

        for h in range(H):
            column = h * T  # transition h's first plan column
            position = plan_start + column  # ... and its absolute position

            # Actions: every candidate samples its own, so the X copies of a beam diverge.
            for j in range(obs_dim, REWARD):
                draws = noise.rows("act", j - obs_dim, h)
                token = self._sample(logits, "act", draws)
                if at_goal is not None and draws is not None:
                    # The least of N Exp(1) draws falls on each bin alike.
                    token = torch.where(at_goal, draws.argmin(dim=-1), token)
                beams.tokens[:, column + j] = token
                if by_likelihood:  # the model's own probability: no temperature, no filter
                    log_p = logits.log_softmax(dim=-1).gather(-1, token[:, None])[:, 0]
                    beams.log_likelihood = beams.log_likelihood + log_p
                logits = decode(token, at(position + j), observation)  # (rows, N)

            # Reward and value: their expectations score the candidate; a token of each is
            # fed back into the sequence.
            reward = self._expected(logits, REWARD)  # (rows,)
            if self.config.goal_reward_radius is not None:
                # Where transition h starts: within the radius of its goal or not.
                start = beams.tokens[:, column : column + obs_dim]
                reward = self._at_goal(start, self.config.goal_reward_radius).to(reward.dtype)
            beams.tokens[:, column + REWARD] = token = self._sample(
                logits, "reward", noise.rows("reward", 0, h)
            )
            logits = decode(token, at(position + REWARD), observation)
            value = self._expected(logits, VALUE)  # (rows,)
            beams.tokens[:, column + VALUE] = self._sample(
                logits, "value", noise.rows("value", 0, h)
            )
            candidate_scores = self._score(beams, h, reward, value, at_goal)  # (rows,)

            # Select: the best B of each env's X * B candidates become its beams, rows [0, G*B).
            scores, choice = layout.by_group(candidate_scores).topk(B, dim=-1)  # (G, B)
            chosen = layout.rows_of(choice)  # (G * B,) best first within each env
            if h == H - 1:
                beams.select_(chosen)
                break
            beams.select_(layout.repeat(chosen, X))  # every expansion copy continues a beam
            # Only the planned positions move: the context is shared.
            cache.reorder_(chosen, position + VALUE, start=context_length)
            if with_observation:
                observation = observation[chosen]  # (beams, d)

            # Next observation: decode the value token, then sample the O observation tokens
            # of transition h + 1, one draw per beam that its copies share.
            value_tokens = beams.tokens[:n_beams, column + VALUE].contiguous()
            logits = decode(value_tokens, at(position + VALUE), observation)
            next_column = column + T
            for i in range(obs_dim):
                token = self._sample(logits, "obs", noise.rows("obs", i, h))  # (beams,)
                beams.tokens[:, next_column + i] = layout.repeat(token, X)
                if with_observation and i == obs_dim - 1:  # the new observation is whole
                    planned = beams.tokens[:n_beams, next_column : next_column + obs_dim]
                    observation = self.model.observation_vectors(planned)  # (beams, d)
                logits = decode(token, at(position + T + i), observation)  # (beams, N)

            # Refill: the other copies continue their beams from here, from the very same keys
            # and logits, so that copies which then draw the same tokens tie exactly.
            written = plan_start + next_column + obs_dim  # positions decoded so far
            cache.repeat_rows_(n_beams, X, written, start=context_length)
            logits = layout.repeat(logits, X)  # (rows, N)
            if with_observation:
                observation = layout.repeat(observation, X)  # (rows, d)

        return (
            beams.tokens[:n_beams].view(G, B, H, T),
            beams.rewards[:n_beams].view(G, B, H),
            beams.values[:n_beams].view(G, B, H),
            scores,
            chosen,
        )
