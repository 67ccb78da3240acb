"""Implicit Q-learning (Kostrikov et al., 2021) on a dataset's continuous transitions.

Per step, on a batch drawn uniformly with replacement (IQL's, as CORL's single-file IQL):

1. V by expectile regression on the target Q: `L_V = E[|tau - 1(u < 0)| u^2]`,
   `u = min(Q1', Q2')(s, a) - V(s)`; an expectile above 0.5 leans V towards the better
   actions of the data without ever querying an action outside it.
2. Q1, Q2 by TD towards `r + discount * (1 - terminated) * V(s')`: a true termination has no
   future, a truncation (a time limit, or the cut at a maze's goal) bootstraps from the
   episode's final observation, which Minari stores.
3. The target Q networks follow by Polyak averaging, rate `target_update_rate`.
4. The policy by advantage-weighted regression: maximise
   `E[min(exp(beta * (Q'(s, a) - V(s))), max_advantage_weight) log pi(a | s)]`, its
   learning rate decaying as a cosine over the run (IQL's).

The rewards are the model's: a true termination's carries `terminal_penalty`, as tt-train's
reward tokens do, so that a critic-scored search adds planned rewards and Q values of one
reward. They are normalised as IQL does before training (`reward_scale * r + reward_bias`;
`normalize_returns` is its rule for locomotion, 1000 / (max - min episode return)), and
observations are standardised; all of it is stored with the critic.

On a goal-conditioned dataset, `relabel_goals` conditions a share of every batch on a goal its
episode reaches later (HER's "future" goals, `GoalRelabelledTransitions`), so that TD learning
chains the data's paths into values of goals far away. Every row's reward and termination are
then the goal's: reaching it ends the episode with the return of staying there for good.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from trajectory_transformer.critic.model import CriticShape, IQLCritic, IQLPolicy
from trajectory_transformer.data.episodes import TERMINAL_PENALTY, Episodes, penalized_rewards
from trajectory_transformer.data.goals import GoalLayout, GoalReward, episode_last_rows
from trajectory_transformer.progress import format_duration, progress_bar
from trajectory_transformer.training.interrupts import StopRequests
from trajectory_transformer.training.schedule import (
    RunClock,
    cosine_learning_rate,
    parse_duration,
)
from trajectory_transformer.training.trainer import NonFiniteLossError

OBSERVATION_STD_FLOOR = 1e-3  # IQL's epsilon: a constant dimension is not blown up

LogFn = Callable[[dict, int], None]
SaveFn = Callable[[dict], Path]  # save(training_state) -> the file written


@dataclass
class CriticConfig:
    """IQL's hyperparameters (the paper's for locomotion; AntMaze uses expectile 0.9 and
    beta 10) and the run's length."""

    expectile: float = 0.7
    """tau of the expectile regression of V on Q: 0.5 is the mean, near 1 the maximum."""
    discount: float = 0.99
    """Discount of the TD targets. A critic-scored search discounts by it (a model trained
    with another discount is refused unless `planner.discount` says which)."""
    terminal_penalty: float = TERMINAL_PENALTY
    """Added to the reward of a true termination (never to a truncation), as tt-train's
    `dataset.terminal_penalty` does for the model's reward tokens. A critic-scored search
    needs the two to match, and refuses a critic trained with another."""
    target_update_rate: float = 0.005
    """Polyak rate of the target Q networks per step."""
    beta: float = 3.0
    """Inverse temperature of the advantage weights of the policy's regression."""
    max_advantage_weight: float = 100.0
    """Advantage weights are clipped to this (IQL's)."""
    hidden_dim: int = 256
    """Width of every network's hidden layers."""
    hidden_layers: int = 2
    """Hidden layers of every network."""
    learning_rate: float = 3e-4
    """Adam's learning rate, for every network (the policy's decays as a cosine)."""
    batch_size: int = 256
    """Transitions per step."""
    steps: int = 100_000
    """Gradient steps (IQL trains 1M; a small maze's values settle much sooner)."""
    reward_scale: float = 1.0
    """Rewards are trained on as `reward_scale * r + reward_bias` (IQL's normalisation)."""
    reward_bias: float = 0.0
    """Added to every scaled reward (IQL's AntMaze rule is -1, for goals that terminate)."""
    normalize_returns: bool = False
    """IQL's locomotion rule: `reward_scale` becomes 1000 / (max - min episode return)."""
    normalize_observations: bool = True
    """Standardise observations by the data's mean and standard deviation."""
    relabel_goals: float = 0.0
    """Share of every batch conditioned on a goal its episode reaches later instead of the
    dataset's (goal-conditioned datasets only, as tt-train's `dataset.relabel_goals`). Above 0,
    every row's reward and termination are its goal's: reaching it terminates, with the return
    of staying there for good (the env's reward at the goal / (1 - discount)), so that the Q
    values add to a maze search's planned rewards. 0: the dataset's own rewards."""
    time_budget: str | None = None
    """Wall-clock training time, e.g. `10m` (over all resumes): the run stops there."""
    checkpoint_every: int = 5000
    """Write `critic.pt` every this many steps (and always at the end and on Ctrl-C)."""
    log_every: int = 500
    """Steps between progress-bar and wandb updates."""

    def __post_init__(self) -> None:
        def require(name: str, ok: Callable[[float], bool], allowed: str) -> None:
            value = getattr(self, name)
            if not ok(value):
                raise ValueError(f"critic.{name} must be {allowed}, got {value!r}")

        finite = lambda x: isinstance(x, int | float) and math.isfinite(x)  # noqa: E731
        require("expectile", lambda x: finite(x) and 0 < x < 1, "in (0, 1)")
        require("discount", lambda x: finite(x) and 0 <= x < 1, "in [0, 1)")
        require("target_update_rate", lambda x: finite(x) and 0 < x <= 1, "in (0, 1]")
        for name in ("beta", "max_advantage_weight", "learning_rate", "reward_scale"):
            require(name, lambda x: finite(x) and x > 0, "a finite number > 0")
        require("reward_bias", finite, "a finite number")
        require("relabel_goals", lambda x: finite(x) and 0 <= x <= 1, "in [0, 1]")
        require("terminal_penalty", finite, "a finite number")
        for name in ("hidden_dim", "hidden_layers", "batch_size", "steps"):
            require(name, lambda x: x >= 1, "at least 1")
        for name in ("checkpoint_every", "log_every"):
            require(name, lambda x: x >= 1, "at least 1")
        if self.time_budget is not None:
            parse_duration(self.time_budget)


@dataclass(frozen=True)
class Transitions:
    """A dataset's transitions as tensors, rewards already scaled."""

    observations: torch.Tensor  # (N, O)
    actions: torch.Tensor  # (N, A)
    rewards: torch.Tensor  # (N,)
    next_observations: torch.Tensor  # (N, O)
    terminated: torch.Tensor  # (N,) 1.0 where the episode truly ended, else 0.0

    def __len__(self) -> int:
        return len(self.rewards)

    def batch(
        self, rows: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, ...]:
        """(s, a, r, s', terminated) of `rows`; `generator` draws nothing here."""
        return tuple(
            t[rows]
            for t in (
                self.observations,
                self.actions,
                self.rewards,
                self.next_observations,
                self.terminated,
            )
        )


class GoalRelabelledTransitions:
    """`Transitions` whose batches are conditioned on goals: each row, with probability
    `probability`, on the achieved goal after a step of its episode drawn uniformly from its
    own onwards (HER's "future" strategy), else on its own desired goal. A row's reward is
    the goal's (`reward` of its next achieved goal), and a row that reaches its goal
    terminates with `reward / (1 - discount)`, the return of staying there for good, as a
    maze's evaluation counts every step at the goal; every reward scaled as `transitions`'
    (`scale * r + bias`). A true termination of the data still ends its row, without the
    terminal penalty, as tt-train's relabelled windows carry none."""

    def __init__(
        self,
        transitions: Transitions,
        episodes: Episodes,
        goals: GoalLayout,
        reward: GoalReward,
        probability: float,
        discount: float,
        scale: float,
        bias: float,
    ) -> None:
        if not 0 < probability <= 1:
            raise ValueError(f"the relabelling probability must be in (0, 1], got {probability}")
        self.transitions = transitions
        self.goals, self.reward = goals, reward
        self.probability, self.discount = probability, discount
        self.scale, self.bias = scale, bias
        rows = np.arange(len(episodes.rewards))
        self._last = episode_last_rows(episodes, rows)  # (N,)
        self._next_achieved = episodes.next_observations()[:, goals.achieved]  # (N, G)
        self.rewards = transitions.rewards  # the device's, for `CriticTrainer`

    def __len__(self) -> int:
        return len(self.transitions)

    def batch(
        self, rows: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, ...]:
        """(s, a, r, s', terminated) of `rows`, each conditioned on its goal; `generator` (on
        the transitions' device) draws which rows are relabelled and their goals' steps."""
        device = self.transitions.rewards.device
        observations, actions, _, next_observations, ended = self.transitions.batch(rows)
        draws = torch.rand(len(rows), 2, generator=generator, device=device).cpu().numpy()
        at = rows.cpu().numpy()
        later = draws[:, 0] < self.probability
        steps = at + np.floor(draws[:, 1] * (self._last[at] - at + 1)).astype(np.int64)
        steps = np.minimum(steps, self._last[at])
        desired = observations[:, self.goals.desired].cpu().numpy()
        goal = np.where(later[:, None], self._next_achieved[steps], desired)
        rewards = self.reward(self._next_achieved[at], goal)  # (B,)
        reached = rewards >= self.reward(goal, goal)
        rewards = np.where(reached, rewards / (1.0 - self.discount), rewards)
        as_tensor = lambda x: torch.as_tensor(x, dtype=torch.float32, device=device)  # noqa: E731
        goal_tensor = as_tensor(goal)  # the batch's tensors are its own copies: written in place
        observations[:, self.goals.desired] = goal_tensor
        next_observations[:, self.goals.desired] = goal_tensor
        return (
            observations,
            actions,
            as_tensor(self.scale * rewards + self.bias),
            next_observations,
            torch.maximum(ended, as_tensor(reached)),  # a true termination has no future either
        )


def reward_normalisation(episodes: Episodes, cfg: CriticConfig) -> tuple[float, float]:
    """(scale, bias) of the rewards the critic trains on (terminal penalty included)."""
    if not cfg.normalize_returns:
        return cfg.reward_scale, cfg.reward_bias
    rewards = penalized_rewards(episodes, cfg.terminal_penalty).astype(np.float64)
    returns = np.add.reduceat(rewards, episodes.starts)
    spread = float(returns.max() - returns.min())
    if spread <= 0:
        raise ValueError(
            "critic.normalize_returns divides by the spread of the episode returns, but every "
            "episode has the same return; set critic.reward_scale instead"
        )
    return 1000.0 / spread, cfg.reward_bias


def transitions_of(
    episodes: Episodes,
    reward_scale: float,
    reward_bias: float,
    device: torch.device | str,
    *,
    terminal_penalty: float,
) -> Transitions:
    """The continuous transitions (s, a, r, s', terminated) of `episodes`, a termination's
    reward with `terminal_penalty`, every reward scaled. Only a true termination stops the
    bootstrap; a truncated last step keeps its final observation."""
    rewards = reward_scale * penalized_rewards(episodes, terminal_penalty) + reward_bias
    as_tensor = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float32), device=device)  # noqa: E731
    return Transitions(
        observations=as_tensor(episodes.observations),
        actions=as_tensor(episodes.actions),
        rewards=as_tensor(rewards),
        next_observations=as_tensor(episodes.next_observations()),
        terminated=as_tensor(episodes.terminated),
    )


def critic_transitions(
    critic: IQLCritic, episodes: Episodes, device: torch.device | str
) -> Transitions:
    """The transitions `critic` trains on: rewards with its terminal penalty, scaled as it
    records (`transitions_of` with the critic's own settings)."""
    return transitions_of(
        episodes,
        critic.reward_scale,
        critic.reward_bias,
        device,
        terminal_penalty=critic.terminal_penalty,
    )


def expectile_loss(difference: torch.Tensor, expectile: float) -> torch.Tensor:
    """Mean of `|expectile - 1(u < 0)| u^2` over `difference` u = target - prediction."""
    weight = torch.where(difference < 0, 1.0 - expectile, expectile)
    return (weight * difference.square()).mean()


def new_critic(
    episodes: Episodes,
    cfg: CriticConfig,
    action_low: list[float],
    action_high: list[float],
) -> tuple[IQLCritic, IQLPolicy]:
    """Freshly initialised networks with the normalisation of `episodes`."""
    shape = CriticShape(
        episodes.observation_dim, episodes.action_dim, cfg.hidden_dim, cfg.hidden_layers
    )
    scale, bias = reward_normalisation(episodes, cfg)
    critic = IQLCritic(shape, cfg.discount, scale, bias, cfg.terminal_penalty)
    policy = IQLPolicy(shape, action_low, action_high)
    if cfg.normalize_observations:
        mean = torch.as_tensor(episodes.observations.mean(axis=0), dtype=torch.float32)
        std = torch.as_tensor(episodes.observations.std(axis=0), dtype=torch.float32)
        for network in (critic, policy):
            network.observation_mean.copy_(mean)
            network.observation_std.copy_(std.clamp_min(OBSERVATION_STD_FLOOR))
    return critic, policy


@dataclass
class CriticSummary:
    steps: int
    seconds: float
    losses: dict[str, float]
    checkpoint: Path | None
    stop_reason: str

    def line(self) -> str:
        losses = " | ".join(f"{k} {v:.4f}" for k, v in self.losses.items())
        return (
            f"trained the critic {self.steps} steps in {self.seconds:.1f} s | {losses} | "
            f"checkpoint {self.checkpoint}\nstopped: {self.stop_reason}"
        )


class CriticTrainer:
    """Trains `critic` and `policy` on `transitions`; `save(training_state)` writes the
    checkpoint. Resumable to the step: `state()` holds the optimisers, the batch generator and
    the step; `load_state` restores them."""

    def __init__(
        self,
        critic: IQLCritic,
        policy: IQLPolicy,
        transitions: Transitions | GoalRelabelledTransitions,
        cfg: CriticConfig,
        save: SaveFn,
        seed: int = 0,
        log: LogFn | None = None,
        progress: bool = True,
    ) -> None:
        self.critic, self.policy, self.transitions, self.cfg = critic, policy, transitions, cfg
        self.save, self.log, self.progress = save, log, progress
        self.device = transitions.rewards.device
        lr = cfg.learning_rate
        self.value_optimizer = torch.optim.Adam(critic.v.parameters(), lr=lr)
        q_parameters = [*critic.q1.parameters(), *critic.q2.parameters()]
        self.q_optimizer = torch.optim.Adam(q_parameters, lr=lr)
        self.policy_optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
        self._parameters = [*critic.parameters(), *policy.parameters()]
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.clock = RunClock(None if cfg.time_budget is None else parse_duration(cfg.time_budget))
        self.stops = StopRequests()
        self.step = 0
        self.losses: dict[str, float] = {}
        self.saved_step: int | None = None

    def train_step(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """One IQL step on the transitions `rows`; returns the losses (on the device)."""
        cfg, critic = self.cfg, self.critic
        observations, actions, rewards, next_observations, terminated = self.transitions.batch(
            rows, self.generator
        )
        with torch.no_grad():
            target_q = torch.minimum(*critic.twin_q(observations, actions, target=True))  # (B,)
            next_value = critic.value(next_observations)  # (B,)
            td_target = rewards + cfg.discount * (1.0 - terminated) * next_value
        advantage = target_q - critic.value(observations)  # (B,)
        value_loss = expectile_loss(advantage, cfg.expectile)
        q1, q2 = critic.twin_q(observations, actions)
        q_loss = (F.mse_loss(q1, td_target) + F.mse_loss(q2, td_target)) / 2
        weights = torch.exp(cfg.beta * advantage.detach()).clamp(max=cfg.max_advantage_weight)
        policy_loss = -(weights * self.policy.log_prob(observations, actions)).mean()
        # The three losses touch disjoint parameters, so one backward pass serves all three.
        for optimizer in (self.value_optimizer, self.q_optimizer, self.policy_optimizer):
            optimizer.zero_grad(set_to_none=True)
        total = value_loss + q_loss + policy_loss
        total.backward()
        # One host sync per step: a NaN or inf must never reach the weights or the checkpoint.
        gradients = [p.grad for p in self._parameters if p.grad is not None]
        if not torch.isfinite(total + sum(g.square().sum() for g in gradients)):
            what = "losses are" if not torch.isfinite(total) else "gradients are"
            raise NonFiniteLossError(
                f"the critic's {what} not finite (NaN or inf) at step {self.step + 1}, so "
                "training stopped before applying it and the last checkpoint written is "
                "untouched. Likely causes: a learning rate too high "
                f"(critic.learning_rate={cfg.learning_rate}), rewards too large for the "
                "critic (critic.reward_scale), or NaN or inf values in the dataset"
            )
        with self.stops.applying():
            self.value_optimizer.step()
            self.q_optimizer.step()
            rate = cosine_learning_rate(cfg.learning_rate, 0.0, 0.0, self.step, cfg.steps)
            for group in self.policy_optimizer.param_groups:
                group["lr"] = rate
            self.policy_optimizer.step()
            with torch.no_grad():
                for online, target in (
                    (critic.q1, critic.target_q1),
                    (critic.q2, critic.target_q2),
                ):
                    for p, p_target in zip(online.parameters(), target.parameters(), strict=True):
                        p_target.lerp_(p, cfg.target_update_rate)
            self.step += 1
        losses = {"value_loss": value_loss, "q_loss": q_loss, "policy_loss": policy_loss}
        return {name: loss.detach() for name, loss in losses.items()}

    def state(self, finished: bool = False) -> dict:
        """`finished`: the run ended as planned (its steps or its time budget), not by Ctrl-C."""
        return {
            "step": self.step,
            "finished": finished,
            "value_optimizer": self.value_optimizer.state_dict(),
            "q_optimizer": self.q_optimizer.state_dict(),
            "policy_optimizer": self.policy_optimizer.state_dict(),
            "generator_state": self.generator.get_state(),
            "elapsed_seconds": self.clock.elapsed,
            "losses": dict(self.losses),
        }

    def load_state(self, state: dict) -> None:
        self.step = int(state["step"])
        self.value_optimizer.load_state_dict(state["value_optimizer"])
        self.q_optimizer.load_state_dict(state["q_optimizer"])
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        self.generator.set_state(state["generator_state"])
        self.clock = RunClock(self.clock.budget, float(state.get("elapsed_seconds", 0.0)))
        self.losses = dict(state.get("losses", {}))

    def _save(self, finished: bool = False) -> Path:
        path = self.save(self.state(finished))
        self.saved_step = self.step
        return path

    def train(self) -> CriticSummary:
        cfg = self.cfg
        self.critic.train()
        self.policy.train()
        start = time.perf_counter()
        self.clock.started(self.step)
        bar = progress_bar(cfg.steps, "critic", self.step, disable=not self.progress)
        try:
            with self.stops.installed():
                while self.step < cfg.steps and not self.clock.out_of_time:
                    if self.stops.requested:
                        raise KeyboardInterrupt
                    rows = torch.randint(
                        len(self.transitions),
                        (cfg.batch_size,),
                        generator=self.generator,
                        device=self.device,
                    )
                    losses = self.train_step(rows)
                    bar.update(1)
                    self.clock.tick(time.perf_counter() - start)
                    if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                        self.losses = {k: float(v) for k, v in losses.items()}  # a host sync
                        fields = {k: f"{v:.4f}" for k, v in self.losses.items()}
                        if self.clock.budget is not None:
                            fields["left"] = format_duration(self.clock.left)
                        bar.set_postfix(fields)
                        if self.log is not None:
                            self.log({f"train/{k}": v for k, v in self.losses.items()}, self.step)
                    if self.step % cfg.checkpoint_every == 0 and self.step < cfg.steps:
                        self._save()
        except KeyboardInterrupt:
            self._save()
            raise
        finally:
            bar.close()
            self.critic.eval()
            self.policy.eval()
        path = self._save(finished=True)
        if self.step >= cfg.steps:
            reason = f"all {cfg.steps} planned steps were taken"
        else:
            reason = f"the time budget of {cfg.time_budget} was used"
        return CriticSummary(self.step, time.perf_counter() - start, self.losses, path, reason)
