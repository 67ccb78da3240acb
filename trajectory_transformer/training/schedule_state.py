"""The trainer's course through its schedule (`schedule.py`): the learning rate of each
step, the step the run ends at (the step cap, the time budget, WSD's cooldown), schedule-free's
two sets of weights, the time the work between steps takes from the budget, and how the
progress bar and the closing summary describe the run's length."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from trajectory_transformer.progress import format_duration
from trajectory_transformer.training.schedule import (
    Cooldown,
    RunClock,
    cooldown_due,
    cooldown_from,
    cosine_learning_rate,
    wsd_learning_rate,
)

if TYPE_CHECKING:
    from trajectory_transformer.training.trainer import TrainerConfig


def learning_rate(cfg: TrainerConfig, tokens_seen: float, planned_tokens: float) -> float:
    """The cosine schedule: linear warm-up, then cosine decay to `min_lr_fraction` of the
    peak, by tokens seen."""
    return cosine_learning_rate(
        cfg.learning_rate, cfg.warmup_fraction, cfg.min_lr_fraction, tokens_seen, planned_tokens
    )


def schedule_free_optimizer(adamw: torch.optim.AdamW, warmup_steps: int) -> torch.optim.Optimizer:
    """The `schedulefree` package's AdamW over `adamw`'s parameter groups (the same weight
    decay on the same parameters), its learning rate and betas, warming up over
    `warmup_steps`."""
    from schedulefree import AdamWScheduleFree

    defaults = adamw.defaults
    groups = [
        {"params": group["params"], "weight_decay": group["weight_decay"]}
        for group in adamw.param_groups
    ]
    return AdamWScheduleFree(
        groups, lr=defaults["lr"], betas=defaults["betas"], warmup_steps=warmup_steps
    )


def planned_steps(cfg: TrainerConfig, windows: int) -> tuple[int, int]:
    """(epochs, steps): explicit epochs, else the paper's reference epochs per 1M transitions."""
    steps_per_epoch = math.ceil(windows / cfg.batch_size)
    if cfg.epochs is not None:
        epochs = cfg.epochs
    else:
        epochs = max(1, int(cfg.reference_epochs * 1e6 / windows))
    steps = epochs * steps_per_epoch
    if cfg.max_steps is not None:
        steps = min(steps, cfg.max_steps)
        epochs = math.ceil(steps / steps_per_epoch)
    return epochs, steps


class ScheduleState:
    """The learning rate and the length of a `Trainer`'s run, as it goes. A part of `Trainer`,
    whose `__init__` sets the attributes below."""

    cfg: TrainerConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    step: int
    tokens_seen: float
    total_steps: int
    scheduled_steps: int
    planned_tokens: float
    tokens_per_step: int
    stopping_rule: bool
    clock: RunClock
    cooldown: Cooldown | None
    _cooldown_reason: str
    _work_seconds: dict[str, float]
    _work_total: float

    def learning_rate(self) -> float:
        """This step's learning rate under `trainer.schedule`."""
        cfg = self.cfg
        if cfg.schedule == "wsd":
            return wsd_learning_rate(
                cfg.learning_rate,
                cfg.warmup_fraction,
                cfg.min_lr_fraction,
                self.tokens_seen,
                self.planned_tokens,
                self.step,
                self.cooldown,
            )
        if cfg.schedule == "schedule_free":
            return cfg.learning_rate  # the optimiser warms up and averages by itself
        return learning_rate(cfg, self.tokens_seen, self.planned_tokens)

    def last_step(self) -> int:
        """The step the run ends at, as planned now: the cooldown's end once it has begun,
        else the step cap or, sooner, the last step the time budget fits."""
        if self.cooldown is not None:
            return self.cooldown.end
        fit = self.clock.steps_that_fit(self.step)
        return self.total_steps if fit is None else min(self.total_steps, fit)

    def _replan(self) -> None:
        """After each step: what the time budget fits at the pace measured so far, the
        cosine's span that follows it, and whether WSD's cooldown is due."""
        fit = self.clock.steps_that_fit(self.step)
        if fit is not None:
            span = min(self.scheduled_steps, max(fit, 1))  # the cosine's span, the warm-up's
            self.planned_tokens = float(span * self.tokens_per_step)
            if self.cfg.schedule == "schedule_free":  # its warm-up counts steps, itself
                for group in self.optimizer.param_groups:
                    group["warmup_steps"] = round(self.cfg.warmup_fraction * span)
            if self.cooldown is not None and fit < self.cooldown.end:  # slower than planned
                self.cooldown = replace(self.cooldown, end=max(fit, self.step))
        if self.cfg.schedule == "wsd" and self.cooldown is None:
            last = self.last_step()
            level = self._rate_level()
            cooldown = cooldown_due(self.step, self.cfg.cooldown_fraction, last, level)
            if cooldown is not None:
                self._keep_state_before_cooldown()
                self.cooldown = cooldown
                self._cooldown_reason = (
                    f"the time budget of {self.cfg.time_budget} drew near"
                    if last < self.total_steps
                    else f"the run neared its {self.total_steps} planned steps"
                )

    def _rate_level(self) -> float:
        """This step's learning rate as a fraction of the peak: where a cooldown starts from
        (below 1 while the warm-up lasts)."""
        return self.learning_rate() / self.cfg.learning_rate if self.cfg.learning_rate else 1.0

    def _start_cooldown(self, reason: str) -> None:
        """WSD: cool down from now over `cooldown_fraction` of the steps so far."""
        self._keep_state_before_cooldown()
        self.cooldown = cooldown_from(
            self.step, self.cfg.cooldown_fraction, self.last_step(), self._rate_level()
        )
        self._cooldown_reason = reason

    def _in_schedule_free_steps(self) -> bool:
        """The model holds the point schedule-free takes its steps at, not its average."""
        return self.cfg.schedule == "schedule_free" and self.optimizer.param_groups[0]["train_mode"]

    @contextlib.contextmanager
    def _evaluation_weights(self) -> Iterator[None]:
        """Validation, planner evaluations and checkpoints use schedule-free's averaged
        weights, the model it converges to; its steps are taken at other points, restored
        exactly afterwards (recomputing them from the average would round). A no-op for the
        other schedules."""
        if not self._in_schedule_free_steps():
            yield
            return
        steps_point = [p.detach().clone() for p in self.model.parameters()]
        self.optimizer.eval()
        try:
            yield
        finally:
            with torch.no_grad():
                for p, saved in zip(self.model.parameters(), steps_point, strict=True):
                    p.copy_(saved)
            for group in self.optimizer.param_groups:
                group["train_mode"] = True

    @contextlib.contextmanager
    def _timed(self, work: str) -> Iterator[None]:
        """Time the work between steps (`validate`, `evaluate`, `save`): the time budget
        plans the next of each as long as the last took, and keeps room for the closing ones
        (two saves: the checkpoint and the model to plan with)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self._work_seconds[work] = seconds
            self._work_total += seconds

    def _closing_seconds(self, costs: dict[str, float]) -> float:
        reserve = 2 * costs.get("save", 0.0)
        if self.validation is not None:
            reserve += costs.get("validate", 0.0)
        if self.cfg.eval_every is not None:
            reserve += costs.get("evaluate", 0.0)
        return reserve

    def _periodic_seconds(self, costs: dict[str, float], start: int, end: int) -> float:
        """The work due after steps `start` (just taken, its work still to come) to `end`,
        `end` excluded (its work is the closing work)."""

        def due(every: int | None) -> int:
            return 0 if every is None else max(0, (end - 1) // every - (start - 1) // every)

        cfg, save = self.cfg, costs.get("save", 0.0)
        seconds = due(cfg.checkpoint_every) * save
        if self.validation is not None:
            seconds += due(cfg.validate_every) * costs.get("validate", 0.0)
        return seconds + due(cfg.eval_every) * costs.get("evaluate", 0.0)

    def _progress(self, **fields: str) -> dict[str, str]:
        """The progress bar's fields: the loss, and what decides the run's length. Under the
        stopping rule that is the validations since the best against `patience`, not the cap's
        distant end; under a time budget the time left."""
        if self.cooldown is not None:
            fields["cooldown"] = f"{self.cooldown.start}-{self.cooldown.end}"
        elif self.stopping_rule and self.best_validation is not None:
            loss, step = self.best_validation
            fields["best"] = f"{loss:.4f}@{step}"
            fields["since_best"] = f"{self.validations_since_best}/{self.cfg.patience}"
            fields["cap"] = str(self.total_steps)
        if self.clock.budget is not None:
            fields["left"] = format_duration(self.clock.left)
        return fields

    def _bar_total(self) -> int | None:
        """The progress bar's length: the planned last step, or none (no time estimate) while
        the stopping rule decides and no budget or cooldown gives an end."""
        if self.stopping_rule and self.cooldown is None and self.clock.budget is None:
            return None
        return self.last_step()

    def _stop_reason(self, reason: str | None) -> str:
        """Why the run ended, for the closing summary: the schedule and the budget included."""
        if reason is None and self.cooldown is not None:
            reason = (
                f"{self._cooldown_reason}, so the learning rate cooled down from step "
                f"{self.cooldown.start} to {self.cooldown.end}"
            )
        elif reason is None and self.clock.budget is not None and self.step < self.total_steps:
            reason = f"the time budget of {self.cfg.time_budget} was used"
        elif reason is None and self.stopping_rule:
            reason = f"the budget of {self.total_steps} steps was reached"
        elif reason is None:
            reason = f"all {self.total_steps} planned steps were taken"
        if self.clock.budget is not None:
            reason += (
                f" (time budget {self.cfg.time_budget}: {format_duration(self.clock.elapsed)} "
                f"used, {self.step} steps)"
            )
        return reason
