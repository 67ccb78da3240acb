"""Learning-rate schedules and the run's length: when to cool down, when to stop.

Three schedules (`trainer.schedule`):

- `cosine`: linear warm-up, then cosine decay to `min_lr_fraction` of the peak over the
  planned length (the original code's schedule). A run stopped before that length holds a
  model trained at a high learning rate.
- `wsd` (warmup-stable-decay): warm-up, then the peak learning rate for as long as the run
  goes on, then a cooldown that decays it linearly to the floor over `cooldown_fraction` of
  the steps taken so far. The cooldown starts when the run decides to end: at the step that
  leaves room for it before the step cap or the time budget, when the stopping rule fires, or,
  if asked, on a first Ctrl-C. Every way a run ends, it ends annealed.
- `schedule_free`: the `schedulefree` package's AdamW (Defazio et al., 2024), whose averaged
  weights are a finished model at every step; it takes the peak learning rate after warm-up
  and needs no length.

`RunClock` turns a wall-clock budget (`trainer.time_budget`, e.g. `30m`) into steps: it
measures the time per step as the run goes (validations and checkpoints included) and keeps
re-planning how many steps fit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

SCHEDULES = ("cosine", "wsd", "schedule_free")
_DURATION = re.compile(r"^(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s)?$")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `90s`, `30m`, `2h` or `1h30m`."""
    match = _DURATION.match(str(text).strip().lower())
    if not match or not any(match.groups()):
        raise ValueError(
            f"trainer.time_budget must be a duration such as 90s, 30m, 2h or 1h30m, got {text!r}"
        )
    hours, minutes, seconds = (float(part) if part else 0.0 for part in match.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise ValueError(f"trainer.time_budget must be longer than zero, got {text!r}")
    return total


def cosine_learning_rate(
    peak: float, warmup_fraction: float, floor_fraction: float, tokens_seen: float, planned: float
) -> float:
    """Linear warm-up over `warmup_fraction` of the `planned` tokens, then cosine decay to
    `floor_fraction` of the peak, by tokens seen."""
    warmup = warmup_fraction * planned
    if tokens_seen < warmup:
        return peak * tokens_seen / max(warmup, 1.0)
    progress = min(1.0, (tokens_seen - warmup) / max(planned - warmup, 1.0))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak * max(floor_fraction, cosine)


@dataclass(frozen=True)
class Cooldown:
    """WSD's decay, linear from step `start` to step `end`: from `level` times the peak (1
    after the warm-up, less if the run ends during it) to `floor_fraction` of that."""

    start: int
    end: int
    level: float = 1.0

    def learning_rate(self, peak: float, floor_fraction: float, step: int) -> float:
        """The rate of the step taken after `step` steps: the last one is at the floor."""
        progress = min(1.0, max(0.0, (step + 1 - self.start) / max(self.end - self.start, 1)))
        return peak * self.level * (1.0 - (1.0 - floor_fraction) * progress)


def wsd_learning_rate(
    peak: float,
    warmup_fraction: float,
    floor_fraction: float,
    tokens_seen: float,
    planned: float,
    step: int,
    cooldown: Cooldown | None,
) -> float:
    """Warm-up as `cosine` does, then the peak until the cooldown, then its linear decay."""
    if cooldown is not None and step >= cooldown.start:
        return cooldown.learning_rate(peak, floor_fraction, step)
    warmup = warmup_fraction * planned
    return peak * min(1.0, tokens_seen / max(warmup, 1.0))


def cooldown_due(step: int, fraction: float, last_step: int, level: float) -> Cooldown | None:
    """WSD's cooldown for a run that can go on to `last_step` (the step cap, or what the time
    budget fits), once the steps left are no more than `fraction` of the steps taken; None
    while there is room to go on. `level`: the rate it starts from, a fraction of the peak."""
    return Cooldown(step, last_step, level) if last_step - step <= fraction * step else None


def cooldown_from(step: int, fraction: float, last_step: int, level: float) -> Cooldown:
    """A cooldown started now (the stopping rule fired, or a Ctrl-C asked for one):
    `fraction` of the steps so far, ending by `last_step`."""
    return Cooldown(step, min(step + max(1, math.ceil(fraction * step)), last_step), level)


class RunClock:
    """The training time of a run (over its resumes) against a budget in seconds, and the
    steps that still fit. The time per step is measured over this process's steps, less the
    time of the work between steps (validations, evaluations, saves), which is planned apart:
    an evaluation every 1,000 steps costs nothing for 999 steps, then all at once."""

    def __init__(self, budget: float | None, elapsed: float = 0.0) -> None:
        self.budget = budget
        self.elapsed = elapsed  # seconds of training before this process, then running total
        self.work = 0.0  # seconds of this process's work between steps
        self.reserve = 0.0
        """Seconds kept free for the run's closing work (its last validation, evaluation and
        saves), as long as they took when last measured."""
        self.periodic: Callable[[int, int], float] | None = None
        """Seconds of the work due strictly between two steps (from, to)."""
        self._start_elapsed = elapsed
        self._start_step: int | None = None

    def started(self, step: int) -> None:
        self._start_step, self._start_elapsed = step, self.elapsed

    def tick(self, seconds_in_this_process: float) -> None:
        self.elapsed = self._start_elapsed + seconds_in_this_process

    def seconds_per_step(self, step: int) -> float | None:
        """Measured once this process has taken a few steps; None before."""
        taken = step - (self._start_step or 0)
        if self._start_step is None or taken < 5:
            return None
        return max(0.0, self.elapsed - self._start_elapsed - self.work) / taken

    def steps_that_fit(self, step: int) -> int | None:
        """The last step the budget reaches at the measured pace, the work due before it and
        the closing work included; None without a budget or a measurement yet."""
        if self.budget is None:
            return None
        pace = self.seconds_per_step(step)
        if pace is None:
            return None
        room = self.budget - self.reserve - self.elapsed
        pace = max(pace, 1e-9)

        def fits(last: int) -> bool:  # a step that fits up to rounding counts as fitting
            work = 0.0 if self.periodic is None else self.periodic(step, last)
            return (last - step) * pace + work <= room + 1e-6 * pace

        low, high = step, step + max(0, math.floor(room / pace + 1e-6))
        while low < high:  # the last step that fits, by bisection
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(middle) else (low, middle - 1)
        return low

    @property
    def out_of_time(self) -> bool:
        """No time is left for another step: only for the closing work."""
        return self.budget is not None and self.elapsed + self.reserve >= self.budget

    @property
    def left(self) -> float | None:
        return None if self.budget is None else max(0.0, self.budget - self.elapsed)
