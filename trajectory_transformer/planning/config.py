"""The beam search's settings, documented once here."""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass, fields, replace

from trajectory_transformer.data.episodes import DISCOUNT
from trajectory_transformer.data.minari_source import observation_columns
from trajectory_transformer.planning.sampling import MIN_TEMPERATURE, draws_noise

TOKEN_KINDS = ("obs", "act", "reward", "value")
"""The kinds of token a planned transition samples, in `PlannerConfig.token_sampling`."""


def goal_velocity_columns(
    spec: str, layout: tuple[tuple[str, tuple[int, ...]], ...] | None = None
) -> slice | None:
    """`planner.goal_velocity`'s `<key>[start:stop]` as columns of the flattened observation
    of `layout` (a Dict observation's keys and shapes in flattening order); without a layout,
    only its form is checked (None)."""
    form = re.fullmatch(r"([\w/]+)\[(\d+):(\d+)\]", spec)
    if form is None or int(form[2]) >= int(form[3]):
        raise ValueError(
            f"planner.goal_velocity must read <key>[start:stop], a part of one key of the "
            f"observation (observation[2:4] in the mazes), got {spec!r}"
        )
    if layout is None:
        return None
    key, start, stop = form[1], int(form[2]), int(form[3])
    columns = observation_columns(layout)
    if key not in columns or stop > columns[key].stop - columns[key].start:
        sizes = {k: c.stop - c.start for k, c in columns.items()}
        raise ValueError(
            f"planner.goal_velocity={spec} is not within this model's observation, whose keys "
            f"and sizes are {sizes}"
        )
    return slice(columns[key].start + start, columns[key].start + stop)


@dataclass(frozen=True)
class PlannerConfig:
    """Beam-search settings; the defaults are the original Trajectory Transformer's."""

    horizon: int = 15
    """Transitions planned ahead."""
    beam_width: int = 128
    """Sequences kept per environment after each planned transition."""
    n_expand: int = 2
    """Candidates sampled from each beam per planned transition."""
    context_transitions: int = 5
    """Past real transitions the model sees before the current observation."""
    k_obs: int | None = 1
    """Top-k filter for observation tokens (1: the most likely bin); None keeps all."""
    k_act: int | None = None
    """Top-k filter for action tokens; None keeps all."""
    cdf_obs: float | None = None
    """Keep the most likely observation tokens whose probability mass reaches this; None: all."""
    cdf_act: float | None = 0.6
    """Keep the most likely action tokens whose probability mass reaches this; None: all."""
    temperature: float = 1.0
    """Logits are divided by this before filtering and sampling, and before the expectations
    of reward and value (as in the original)."""
    discount: float | None = None
    """Discount of planned rewards and of the terminal value. None: the discount that the
    model's value tokens were trained with (`from_checkpoint` reads it from the checkpoint; a
    planner built from a bare model assumes the training default, 0.99)."""
    plan_every: int = 1
    """`act` replans every this many steps and follows the rest of the last plan in between."""
    value_percentile: float | None = None
    """Score rewards and values by this percentile of their predicted distributions, in (0, 1);
    None uses the mean."""
    reward_token: str = "greedy"
    """The reward token fed back into the sequence after a planned action: `greedy`, the most
    likely one (the original's `k_rew=1`), or `sample`d from the predicted distribution. The
    beam's score uses the expectation either way. `greedy` by measurement: AdaStop could not
    tell the two apart (docs/departures.md)."""
    value_token: str = "greedy"
    """The value token fed back into the sequence: `greedy` or `sample`, as `reward_token`."""
    deterministic: bool = False
    """Greedy (argmax) tokens everywhere instead of sampling; for tests and ablations."""
    seed: int = 0
    """Seed of the planner's random streams: `reset` and evaluation derive one independent
    stream from it per episode (`BeamPlanner.episode_stream`)."""
    value: str = "model"
    """What scores a beam: `model`, its planned rewards and the model's own expected value
    token; `critic`, an IQL critic's `Q(s_h, a_h)` of the transition just planned, with the
    planned rewards before it in the critic's reward units (see `BeamPlanner._score`; needs
    `critic`); or `likelihood`, no reward or value at all: the log-probability under the model
    of the plan's action tokens, the paper's goal-reaching search (with the goal in the
    observation, the likeliest way there as the data went; `planner=maze-likely`)."""
    critic: str | None = None
    """Path of the critic.pt (tt-train-critic) that `value=critic` scores with; it must have
    been trained on the model's dataset."""
    decode: str = "eager"
    """How the model computes each planned token: `eager`, operator by operator as written (on
    the CPU the native kernels where they build, else PyTorch); `compile`, the PyTorch step
    through `torch.compile` (fused kernels; tens of seconds to compile once per shape); or
    `fused`, on CUDA, one Triton kernel per transformer block (`model/decode/fused.py`;
    compiled once per model shape). All plan the same, up to float rounding."""
    cuda_graph: str = "step"
    """On CUDA, what is captured once as a CUDA graph and replayed: `none`; `step`, the decode
    step, per number of planned envs; or `search`, the whole search after the context's prefill
    (decode steps, sampling, scoring, beam selection), per number of planned envs and history
    length. Nothing is captured on the CPU. All plan the same."""
    goal_radius: float | None = None
    """On a goal-conditioned dataset (Dict observations with `achieved_goal` and
    `desired_goal`), the distance from its goal within which an env is held there: its
    candidates try actions drawn uniformly over the bins, and the search keeps the plan whose
    planned positions keep closest to the goal, not the model's score
    (`BeamPlanner._stay_at_goal`). A goal-reaching dataset's episodes end on arrival, so its
    model's own actions at a goal are the data's, which pass through. None: the model's
    actions and score everywhere. Wider than the goal's own radius (0.45 in the mazes), an env
    that drifts out is brought back; with `goal_velocity`, which stops it, the goal's own radius
    holds it better (`planner=maze-hold`). Needs sampled actions (not `deterministic`, nor
    `k_act=1`)."""
    goal_velocity: str | None = None
    """With `goal_radius`, where the velocity of the achieved goal sits in the observation, as
    `<key>[start:stop]` of its Dict layout (`observation[2:4]` in the mazes: the point's
    velocity after its position). An env at its goal then keeps the plan whose look-ahead
    positions keep closest to the goal: each planned position carried on at its planned
    velocity for `goal_lookahead`. So the point stops on the goal, rather than where it
    happens to be within the radius, and a plan that will overshoot scores as far as it will
    go. Held near a goal, the point moves a position bin or less over a whole plan: planned
    positions alone hardly tell a plan that stops from one that drifts. None: the planned
    positions alone."""
    goal_lookahead: float = 0.2
    """`goal_velocity`'s look-ahead, in the velocity's unit of time (seconds in the mazes)."""
    goal_tries: int | None = None
    """With `goal_radius`, an env at its goal plays the best of this many actions drawn
    uniformly over the bins, each judged by the position the model expects it to lead to
    (with `goal_velocity`, carried on at the expected velocity for `goal_lookahead`):
    `BeamPlanner._hold_action`. The search's own hold tries only `beam_width` first actions,
    drawn before any is judged: it scores a candidate on the positions it has decoded, and the
    one its action leads to is decoded after the selection, so its copies tie until then.
    None: the search's first action. Needs `plan_every=1`: the plan's later actions were
    searched after another first action."""
    waypoint_lead: float | None = None
    """On a goal-conditioned dataset, where the goal is farther than this (in the goal's units)
    along the shortest way through the cells of the goal space that the data's steps cross,
    the agent heads for the point that way reaches this far ahead, and for the goal itself
    from nearer (`planning.waypoints`): a goal near enough for the value to rank plans by.
    Every agent plays so (the search, `planner=bc`, `planner=iql`); tt-eval builds the cells
    from the checkpoint's dataset. None: the goal."""
    waypoint_cell: float = 0.25
    """With `waypoint_lead`, the width of the cells (in the goal's units)."""
    goal_reward_radius: float | None = None
    """On a goal-conditioned dataset, the distance from its goal within which a planned
    position earns a reward of 1, in place of the model's expected reward token (a sparse goal
    reward: gymnasium-robotics' mazes reward 1 within 0.45). A goal-reaching dataset's episodes
    end on arrival, so its model has seen a reward only for entering a goal, never for staying:
    scored by it, a plan that leaves the goal and comes back outscores one that stays. Planned
    transition `h` is rewarded for where it starts (its end is decoded with the next one; the
    value after the last covers it). None: the model's rewards."""
    agent: str = "beam"
    """What tt-eval plays: `beam`, this beam search over the checkpoint's model; or `iql`, the
    IQL policy of the critic checkpoint given as tt-eval's `checkpoint`, without model or
    search (a baseline)."""

    TOKEN_FEEDBACK: typing.ClassVar[tuple[str, ...]] = ("greedy", "sample")
    VALUES: typing.ClassVar[tuple[str, ...]] = ("model", "critic", "likelihood")
    AGENTS: typing.ClassVar[tuple[str, ...]] = ("beam", "iql")
    DECODES: typing.ClassVar[tuple[str, ...]] = ("eager", "compile", "fused")
    CUDA_GRAPHS: typing.ClassVar[tuple[str, ...]] = ("none", "step", "search")

    def __post_init__(self) -> None:
        for f in fields(self):  # NaN passes every comparison below, and inf most of them
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"planner.{f.name} must be a finite number, got {value}")
        for name in ("reward_token", "value_token"):
            if getattr(self, name) not in self.TOKEN_FEEDBACK:
                raise ValueError(
                    f"planner.{name} must be one of {', '.join(self.TOKEN_FEEDBACK)}, got "
                    f"{getattr(self, name)!r}"
                )
        for name in ("horizon", "beam_width", "n_expand", "plan_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"planner.{name} must be at least 1, got {getattr(self, name)}")
        if self.context_transitions < 0:
            raise ValueError(
                f"planner.context_transitions must be >= 0, got {self.context_transitions}"
            )
        for name in ("k_obs", "k_act"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"planner.{name} must be >= 1 or None, got {value}")
        for name in ("cdf_obs", "cdf_act"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value <= 1.0:
                raise ValueError(f"planner.{name} must be in (0, 1] or None, got {value}")
        if self.seed < 0:
            raise ValueError(f"planner.seed must be non-negative, got {self.seed}")
        if self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"planner.temperature must be at least {MIN_TEMPERATURE:g} (float32 logits "
                f"divided by less can overflow to inf, and every score becomes NaN), got "
                f"{self.temperature}"
            )
        if self.discount is not None and not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"planner.discount must be in [0, 1], got {self.discount}")
        if self.value_percentile is not None and not 0.0 < self.value_percentile < 1.0:
            raise ValueError(
                f"planner.value_percentile must be in (0, 1) or None, got {self.value_percentile}"
            )
        if self.value not in self.VALUES:
            raise ValueError(
                f"planner.value must be model, critic or likelihood, got {self.value!r}"
            )
        if self.decode not in self.DECODES:
            raise ValueError(f"planner.decode must be eager, compile or fused, got {self.decode!r}")
        if self.cuda_graph not in self.CUDA_GRAPHS:
            raise ValueError(
                f"planner.cuda_graph must be none, step or search, got {self.cuda_graph!r}"
            )
        for name in ("goal_radius", "goal_reward_radius", "waypoint_lead"):
            radius = getattr(self, name)
            if radius is not None and radius <= 0.0:
                raise ValueError(f"planner.{name} must be positive or None, got {radius}")
        if self.value == "likelihood" and self.goal_reward_radius is not None:
            raise ValueError(
                "planner.goal_reward_radius rewards planned steps at the goal, and "
                "planner.value=likelihood scores plans by their actions' likelihood alone: set "
                "planner.goal_reward_radius=null (planner=maze-likely does)"
            )
        greedy = not draws_noise(top_k=self.k_act, deterministic=self.deterministic)
        if self.goal_radius is not None and greedy:
            # At the goal the candidates try actions drawn uniformly: a greedy search draws none.
            raise ValueError(
                "planner.goal_radius draws the actions of an env at its goal, and this search "
                "samples none (planner.deterministic=true or planner.k_act=1); sample actions, "
                "or leave planner.goal_radius=null"
            )
        if self.waypoint_cell <= 0.0:
            raise ValueError(f"planner.waypoint_cell must be positive, got {self.waypoint_cell}")
        if self.goal_lookahead <= 0.0:
            raise ValueError(f"planner.goal_lookahead must be positive, got {self.goal_lookahead}")
        if self.goal_velocity is not None:
            goal_velocity_columns(self.goal_velocity)  # its form, before a layout is known
            if self.goal_radius is None:
                raise ValueError(
                    "planner.goal_velocity looks ahead for an env held at its goal, and "
                    "planner.goal_radius=null holds none: set planner.goal_radius too, or leave "
                    "planner.goal_velocity=null"
                )
        if self.goal_tries is not None:
            if self.goal_tries < 1:
                raise ValueError(f"planner.goal_tries must be at least 1, got {self.goal_tries}")
            if self.goal_radius is None:
                raise ValueError(
                    "planner.goal_tries chooses the action of an env held at its goal, and "
                    "planner.goal_radius=null holds none: set planner.goal_radius too, or leave "
                    "planner.goal_tries=null"
                )
            if self.plan_every != 1:
                raise ValueError(
                    f"planner.goal_tries chooses the next action alone, and planner.plan_every="
                    f"{self.plan_every} would play the plan's later actions, searched after "
                    "another: set planner.plan_every=1, or leave planner.goal_tries=null"
                )
        if self.agent not in self.AGENTS:
            raise ValueError(f"planner.agent must be beam or iql, got {self.agent!r}")
        if self.plan_every > self.horizon:
            raise ValueError(
                f"planner.plan_every ({self.plan_every}) cannot exceed the horizon "
                f"({self.horizon}): a plan has only {self.horizon} actions to follow"
            )

    def token_sampling(self) -> dict[str, dict]:
        """`sample_tokens`' settings for each kind of token (`TOKEN_KINDS`)."""
        greedy = {"reward": self.reward_token == "greedy", "value": self.value_token == "greedy"}
        filters = {"obs": (self.k_obs, self.cdf_obs), "act": (self.k_act, self.cdf_act)}
        return {
            kind: dict(
                temperature=self.temperature,
                top_k=filters.get(kind, (None, None))[0],
                cdf=filters.get(kind, (None, None))[1],
                deterministic=self.deterministic or greedy.get(kind, False),
            )
            for kind in TOKEN_KINDS
        }

    def with_overrides(self, **overrides: object) -> PlannerConfig:
        names = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown planner settings {unknown}; valid ones: {sorted(names)}")
        return replace(self, **overrides)

    def resolved(self, trained_discount: float = DISCOUNT) -> PlannerConfig:
        """This config with the discount the value tokens were trained with where it is None."""
        return self if self.discount is not None else replace(self, discount=trained_discount)
