"""Training loop: weighted cross-entropy, AdamW, a learning-rate schedule, resumable.

One process, or several under torchrun (`Distributed`): `batch_size` is always the global
batch, split across the ranks, and the loss is normalised by the global batch's token count,
so N ranks take exactly the step that one process takes on the whole batch. Optional: a
validation split (loss per token kind, a stopping rule, `best_validation.pt`) and planner
evaluation during training (`best.pt`).

The trainer's parts: the loss (`loss.py`); the learning rate and the run's length as it
goes (`schedule_state.py`, over the schedules and the wall-clock budget of `schedule.py`);
what a checkpoint holds to resume or extend a run (`state.py`); validation, the stopping rule
and planner evaluations (`validation.py`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.model import TrajectoryGPT
from trajectory_transformer.progress import progress_bar
from trajectory_transformer.training.distributed import Distributed
from trajectory_transformer.training.interrupts import StopRequests
from trajectory_transformer.training.loss import (
    GaussianTargets,
    input_values,
    loss_weights,
    target_dims,
    token_kinds,
    weighted_loss,
)
from trajectory_transformer.training.schedule import SCHEDULES, Cooldown, RunClock, parse_duration
from trajectory_transformer.training.schedule_state import (
    ScheduleState,
    planned_steps,
    schedule_free_optimizer,
)
from trajectory_transformer.training.state import ResumableState
from trajectory_transformer.training.validation import Validation

LogFn = Callable[[dict, int], None]
SaveFn = Callable[..., Path]  # save(training_state, name="checkpoint.pt") -> the file written
EvaluateFn = Callable[[TrajectoryGPT], tuple[float, dict]]
"""Plays the planner with the model; returns (score to select `best.pt` by, metrics to log)."""


class NonFiniteLossError(RuntimeError):
    """A step's loss or gradients were NaN or infinite: training stopped before applying it."""


COOLDOWN_LINE = "cooling the learning rate down before stopping (Ctrl-C again: stop now)"
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


FLOAT32_MAX = float(torch.finfo(torch.float32).max)


@dataclass
class TrainerConfig:
    batch_size: int = 256
    """Windows per optimisation step."""
    learning_rate: float = 6e-4
    """Peak learning rate after warm-up."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    weight_decay: float = 0.1
    """AdamW decay, applied to weight matrices only (not biases, norms, embeddings)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    schedule: str = "cosine"
    """The learning rate's course (see `schedule.py`): `cosine` decays over the planned
    length; `wsd` holds the peak, then cools down whenever the run decides to end (step cap,
    time budget, stopping rule, or a first Ctrl-C with `cooldown_on_interrupt`);
    `schedule_free` is the `schedulefree` package's AdamW, whose checkpoints are a finished
    model at any step."""
    warmup_fraction: float = 0.05
    """Fraction of the planned training tokens spent warming the learning rate up."""
    min_lr_fraction: float = 0.1
    """Floor of the cosine decay and of WSD's cooldown, as a fraction of the peak."""
    cooldown_fraction: float = 0.2
    """WSD: the cooldown lasts this fraction of the steps taken before it."""
    cooldown_on_interrupt: bool = False
    """WSD: a first Ctrl-C starts the cooldown (the run then ends annealed) instead of
    stopping; a second stops at once."""
    time_budget: str | None = None
    """Wall-clock training time, e.g. `30m` or `2h` (over all resumes of a run): the run plans
    its length to end within it, re-planning as its pace changes, cooldown included, and stops
    there unless the step cap or the stopping rule ends it first."""
    reference_epochs: float = 50.0
    """Epochs per one million transitions (the paper's rule): epochs = ref * 1e6 / windows."""
    epochs: int | None = None
    """Explicit epoch count; overrides `reference_epochs`."""
    max_steps: int | None = None
    """Train exactly this many optimisation steps (caps the epoch-derived length). Without it
    or `epochs`, and with a validation split, training runs to the stopping rule."""
    patience: int = 8
    """Stopping rule: stop once this many validations in a row have not lowered the best
    validation loss by `min_delta`; the budget from `reference_epochs` caps the run."""
    min_delta: float = 1e-3
    """Stopping rule: the smallest drop of the validation loss that counts as progress."""
    schedule_epochs: float = 20.0
    """Stopping rule: the warm-up and cosine decay span this many epochs (the original code's
    20), then the learning rate stays at its floor; a fixed length schedules over all of it."""
    validate_every: int = 250
    """Steps between validation losses, when the dataset has a validation split."""
    validation_windows: int | None = 4096
    """Validation windows scored each time: a fixed sample (None: all of them)."""
    eval_every: int | None = None
    """Steps between planner evaluations in the environment (None: none); the best-scoring
    step is kept as `best.pt`."""
    eval_episodes: int = 10
    """Episodes per evaluation during training."""
    precision: str = "fp32"
    """`fp32`, or `bf16`: autocast of the forward pass on CUDA and CPU; the loss, weights and
    optimiser state stay float32."""
    compile: bool = False
    """`torch.compile` the model's training forward (the planner does not use it)."""
    observation_weight: float = 1.0
    """Loss weight of observation tokens."""
    action_weight: float = 5.0
    """Loss weight of action tokens."""
    reward_weight: float = 1.0
    """Loss weight of reward tokens."""
    value_weight: float = 1.0
    """Loss weight of value tokens."""
    target_sigma: float = 0.0
    """0: each token's target is the token itself (the paper's). Above 0: a Gaussian of this
    standard deviation, in bins, over the bins around the token's real value (HL-Gauss), so
    that the loss knows the bins' order (see `loss.GaussianTargets`)."""
    checkpoint_every: int = 1000
    """Write `checkpoint.pt` every this many steps (and always at the end and on Ctrl-C)."""
    log_every: int = 50
    """Steps between progress-bar and wandb updates."""

    def __post_init__(self) -> None:
        def require(name: str, ok: Callable[[object], bool], allowed: str) -> None:
            value = getattr(self, name)
            if not ok(value):
                raise ValueError(f"trainer.{name} must be {allowed}, got {value!r}")

        finite = lambda x: isinstance(x, int | float) and math.isfinite(x)  # noqa: E731
        # The optimiser and the loss hold these as float32 tensors: a larger number overflows.
        float32 = lambda x: finite(x) and abs(x) <= FLOAT32_MAX  # noqa: E731
        in_range = "a number >= 0 within float32's range"
        counts = ("batch_size", "patience", "validate_every", "eval_episodes")
        for name in (*counts, "checkpoint_every", "log_every"):
            require(name, lambda x: x >= 1, "at least 1")
        for name in ("max_steps", "epochs", "eval_every", "validation_windows"):
            require(name, lambda x: x is None or x >= 1, "at least 1, or null")
        require("learning_rate", lambda x: float32(x) and x >= 0, in_range)
        require("weight_decay", lambda x: float32(x) and x >= 0, in_range)
        require("grad_clip", lambda x: float32(x) and x > 0, "a number > 0 within float32's range")
        in_unit = lambda x: finite(x) and 0 <= x < 1  # noqa: E731
        require("betas", lambda x: len(x) == 2 and all(map(in_unit, x)), "two numbers in [0, 1)")
        require("warmup_fraction", in_unit, "in [0, 1)")
        require("min_lr_fraction", lambda x: finite(x) and 0 <= x <= 1, "in [0, 1]")
        require("cooldown_fraction", lambda x: finite(x) and 0 < x <= 1, "in (0, 1]")
        for name in ("reference_epochs", "schedule_epochs"):
            require(name, lambda x: finite(x) and x > 0, "a finite number > 0")
        require("min_delta", lambda x: finite(x) and x >= 0, "a finite number >= 0")
        require("target_sigma", lambda x: finite(x) and 0 <= x <= 1e6, "a number in [0, 1e6]")
        weights = ("observation_weight", "action_weight", "reward_weight", "value_weight")
        for name in weights:
            require(name, lambda x: float32(x) and x >= 0, in_range)
        if not any(getattr(self, name) > 0 for name in weights):
            raise ValueError(
                "the loss weights (trainer.observation_weight, action_weight, reward_weight, "
                "value_weight) are all 0: nothing would be learnt; give one a positive weight"
            )
        require("schedule", lambda x: x in SCHEDULES, f"one of {', '.join(SCHEDULES)}")
        require("precision", lambda x: x in PRECISIONS, f"one of {', '.join(PRECISIONS)}")
        if self.cooldown_on_interrupt and self.schedule != "wsd":
            raise ValueError(
                "trainer.cooldown_on_interrupt needs trainer.schedule=wsd, the schedule with a "
                f"cooldown; got trainer.schedule={self.schedule}"
            )
        if self.time_budget is not None:
            parse_duration(self.time_budget)


@dataclass
class TrainSummary:
    steps: int
    epochs: float  # passes over the windows, fractional
    windows: int
    final_loss: float
    seconds: float
    tokens_per_second: float
    checkpoint: Path | None  # None on ranks other than 0, which write nothing
    stop_reason: str
    best_validation: tuple[float, int] | None = None  # (loss, step)
    best_score: tuple[float, int] | None = None  # (score, step)

    def line(self) -> str:
        text = (
            f"trained {self.steps} steps ({self.epochs:.2f} epochs over {self.windows} "
            f"windows) in {self.seconds:.1f} s | final loss {self.final_loss:.4f} | "
            f"{self.tokens_per_second:,.0f} tokens/s | checkpoint {self.checkpoint}\n"
            f"stopped: {self.stop_reason}"
        )
        if self.best_validation is not None:
            loss, step = self.best_validation
            text += f"\nbest validation loss {loss:.4f} at step {step}: best_validation.pt"
        if self.best_score is not None:
            score, step = self.best_score
            text += f"\nbest planner score {score:.1f} at step {step}: best.pt"
        return text


class Trainer(ScheduleState, ResumableState, Validation):
    """Trains `model` on `windows`; `save(training_state, name)` persists a checkpoint; `seed`
    seeds the order of the batches.

    `validation` (windows of held-out episodes) adds a validation loss every
    `validate_every` steps, `best_validation.pt`, and, without a fixed length, the stopping
    rule. `evaluate` (called on rank 0 only) adds planner scores every `eval_every` steps and
    `best.pt`. `dist` describes the ranks when torchrun started several.

    Ctrl-C is safe at any moment. The first one stops the run after the step in progress and
    writes a checkpoint. A second one stops at once: a step whose update has not begun is
    dropped (resume redoes it), one being applied is finished first, so a checkpoint never
    holds half a step. A Ctrl-C during a save aborts that save only; the file written before
    it stays as it was (saves are atomic). Under torchrun, a stop requested on any rank stops
    every rank after the same step.
    """

    def __init__(
        self,
        model: TrajectoryGPT,
        windows: TokenWindows,
        cfg: TrainerConfig,
        save: SaveFn,
        seed: int = 0,
        log: LogFn | None = None,
        progress: bool = True,
        validation: TokenWindows | None = None,
        evaluate: EvaluateFn | None = None,
        dist: Distributed | None = None,
    ) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        for part in (windows, validation):
            if part is None or part.values is not None:
                continue
            if model.config.value_inputs:
                raise ValueError(
                    "the model takes real values (model.value_inputs) and the windows hold "
                    "none: build them with TokenWindows(..., real_values=True)"
                )
            if cfg.target_sigma > 0:
                raise ValueError(
                    "trainer.target_sigma centres each target on its real value and the "
                    "windows hold none: build them with TokenWindows(..., real_values=True)"
                )
        # The token windows (one byte a token) live where the batches are used.
        self.windows = windows.to(self.device)
        self.cfg = cfg
        self.save = save
        self.dist = dist or Distributed.single()
        self.log = log if self.dist.is_main else None
        self.progress = progress and self.dist.is_main
        self.validation = (
            validation.to(self.device) if validation is not None and len(validation) else None
        )
        if cfg.eval_every is not None and evaluate is None and self.dist.is_main:
            raise ValueError("trainer.eval_every needs an `evaluate` function to call")
        self.evaluate = evaluate  # rank 0's; the other ranks wait while it plays
        self.forward = self._training_forward(model)
        self.weights = loss_weights(model, cfg).to(self.device)
        self.kinds = token_kinds(model).to(self.device)
        self.target_dims = target_dims(model).to(self.device)
        self.gaussian_targets = None
        if cfg.target_sigma > 0:
            self.gaussian_targets = GaussianTargets(
                windows.discretizer, cfg.target_sigma, self.device
            )
        self.epochs, self.total_steps = planned_steps(cfg, len(windows))
        self.steps_per_epoch = math.ceil(len(windows) / cfg.batch_size)
        self.tokens_per_window = model.config.block_size - 1
        self.tokens_per_step = cfg.batch_size * self.tokens_per_window
        self.stopping_rule = (
            cfg.max_steps is None and cfg.epochs is None and self.validation is not None
        )
        self.scheduled_steps = self.total_steps
        if self.stopping_rule:
            schedule = math.ceil(cfg.schedule_epochs * self.steps_per_epoch)
            self.scheduled_steps = min(self.scheduled_steps, schedule)
        self.planned_tokens = float(self.scheduled_steps * self.tokens_per_step)
        self.optimizer = model.configure_optimizer(
            cfg.learning_rate, cfg.weight_decay, cfg.betas, fused=self.device.type == "cuda"
        )
        if cfg.schedule == "schedule_free":
            self.optimizer = schedule_free_optimizer(
                self.optimizer, round(cfg.warmup_fraction * self.scheduled_steps)
            )
        self.clock = RunClock(None if cfg.time_budget is None else parse_duration(cfg.time_budget))
        self.cooldown: Cooldown | None = None  # WSD's, once it has started
        # Batch order comes from its own generator. Its state at the start of the current epoch
        # is kept and saved, so a resumed run draws the same permutation and skips the batches
        # already done. Dropout draws from torch's global generator, which the caller seeded
        # before building the model. Every rank draws the same global order.
        self.order_generator = torch.Generator().manual_seed(seed)
        self.step = 0
        self.epoch = 0
        self.step_in_epoch = 0
        self.tokens_seen = 0.0
        self.last_loss = float("nan")
        self.best_validation: tuple[float, int] | None = None
        self.validations_since_best = 0
        self.best_score: tuple[float, int] | None = None
        self.saved_step: int | None = None  # step of the last checkpoint written by `train`
        self._epoch_generator_state = self.order_generator.get_state()
        self._order: torch.Tensor | None = None
        self._order_epoch = -1
        self._validation_ids = self._validation_sample()
        self._rng_at_step_start: dict | None = None  # set while a step is in progress
        # Under cooldown_on_interrupt a first Ctrl-C asks for a cooldown (`stops.diverted`).
        cooldown = COOLDOWN_LINE if cfg.cooldown_on_interrupt else None
        self.stops = StopRequests(cooldown, announce=self.dist.is_main)
        self._cooldown_reason = ""
        self._before_cooldown: dict | None = None  # WSD: the state a longer run resumes from
        self._work_seconds: dict[str, float] = {}  # the last validation, evaluation, save
        self._work_total = 0.0  # seconds of work between steps in this process
        self.extended_from: int | None = None  # the step a longer run went on from

    def _training_forward(self, model: TrajectoryGPT) -> torch.nn.Module:
        """The module that training calls: DDP around the model across ranks, compiled if
        asked. The model itself stays as it is, for saving and for the planner."""
        forward: torch.nn.Module = model
        if self.dist.active:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device] if self.device.type == "cuda" else None
            forward = DistributedDataParallel(model, device_ids=ids)
        if self.cfg.compile:
            forward = torch.compile(forward)
        return forward

    def _autocast(self) -> contextlib.AbstractContextManager:
        dtype = PRECISIONS[self.cfg.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def _epoch_order(self) -> torch.Tensor:
        """The current epoch's permutation of the windows, drawn once per epoch."""
        if self._order is None or self._order_epoch != self.epoch:
            self.order_generator.set_state(self._epoch_generator_state)
            self._order = torch.randperm(len(self.windows), generator=self.order_generator)
            self._order_epoch = self.epoch
        return self._order

    def target_probabilities(
        self, tokens: torch.Tensor, values: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The targets (B, S - 1, N) of a batch's windows (tokens and real values (B, S)) with
        `target_sigma`; None where the targets are the tokens themselves."""
        if self.gaussian_targets is None:
            return None
        assert values is not None  # checked when the windows were given
        S = tokens.shape[1] - 1
        return self.gaussian_targets(tokens[:, 1:], values[:, 1:], self.target_dims[:S])

    def train_step(self, window_ids: torch.Tensor) -> torch.Tensor:
        """One optimisation step on the given (global) batch of windows; returns this rank's
        share of the loss (on the device; the ranks' shares sum to the batch's loss)."""
        self._rng_at_step_start = self._rng_state()
        tokens, mask, values = self.windows.batch(self.dist.share(window_ids))  # on self.device
        token_count = self.dist.sum_(mask[:, 1:].sum(dtype=torch.float32))
        with self._autocast():
            logits = self.forward(tokens[:, :-1], input_values(values))  # (B, S - 1, N)
        targets = self.target_probabilities(tokens, values)
        loss = weighted_loss(logits, tokens[:, 1:], mask[:, 1:], self.weights, token_count, targets)
        self.optimizer.zero_grad(set_to_none=True)
        # DDP averages the ranks' gradients; each share is already over the global count.
        (loss * self.dist.world_size if self.dist.active else loss).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        # The norm is of the gradients summed over the ranks, so every rank stops together. A
        # host sync per step, which the CPU does not notice; it keeps NaNs out of the weights.
        if not torch.isfinite(norm):
            raise NonFiniteLossError(self._non_finite_message(loss))
        # Until here nothing of the run's state has changed; from here it changes as a whole.
        with self.stops.applying():
            lr = self.learning_rate()
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.tokens_seen += len(window_ids) * self.tokens_per_window
            self.step += 1
            self.step_in_epoch += 1
            if self.step_in_epoch == self.steps_per_epoch:
                # Having drawn this epoch's permutation, the generator stands at the next's.
                self._epoch_generator_state = self.order_generator.get_state()
                self.epoch += 1
                self.step_in_epoch = 0
            self._rng_at_step_start = None
        return loss.detach()

    def _non_finite_message(self, loss: torch.Tensor) -> str:
        what = "loss is" if not torch.isfinite(loss) else "gradients are"
        return (
            f"the {what} not finite (NaN or inf) at step {self.step + 1}, so training stopped "
            "before applying it and the last checkpoint written is untouched. Likely causes: "
            "a learning rate too high for this model "
            f"(trainer.learning_rate={self.cfg.learning_rate}), bf16 overflow "
            f"(trainer.precision={self.cfg.precision}), or NaN or inf values in the dataset"
        )

    def request_stop(self) -> None:
        """Stop at the next step boundary: write a checkpoint, then raise KeyboardInterrupt."""
        self.stops.request()

    def _catch_interrupt(self):
        """First Ctrl-C or SIGTERM: stop after this step. Second: stop now, never inside an
        update. Returns the handlers it replaced."""
        return self.stops.install()

    def _save(self, finished: bool = False, name: str = "checkpoint.pt") -> Path | None:
        """Every rank calls this together; rank 0 writes."""
        state = self.state(finished=finished)
        path = None
        if self.dist.is_main:
            with self._timed("save"), self._evaluation_weights():
                path = self.save(state) if name == "checkpoint.pt" else self.save(state, name)
        if name == "checkpoint.pt":
            self.saved_step = self.step
        return path

    def _after_step(
        self, loss: torch.Tensor, start_time: float, start_tokens: float, bar, final: bool
    ) -> str | None:
        """Logging, validation, evaluation and checkpoints after a step (`final`: the run's
        last); returns why training stops now, or None."""
        cfg, metrics = self.cfg, {}
        if self.step % cfg.log_every == 0 or final:
            # The only host sync, every log_every steps.
            self.last_loss = float(self.dist.sum_(loss.clone()))
            rate = (self.tokens_seen - start_tokens) / (time.perf_counter() - start_time)
            bar.set_postfix(self._progress(loss=f"{self.last_loss:.4f}", tok_s=f"{rate:,.0f}"))
            lr = self.optimizer.param_groups[0]["lr"]
            metrics |= {"train/loss": self.last_loss, "train/lr": lr}
            metrics |= {"train/tokens_per_s": rate, "train/epoch": self.epoch}
        stop = None
        if self.validation is not None and (self.step % cfg.validate_every == 0 or final):
            with self._timed("validate"):
                validation = self.validate()
            metrics |= validation
            stop = self._after_validation(validation["val/loss"])
            bar.set_postfix(
                self._progress(loss=f"{self.last_loss:.4f}", val=f"{validation['val/loss']:.4f}")
            )
        if cfg.eval_every is not None and (self.step % cfg.eval_every == 0 or final or stop):
            with self._timed("evaluate"):
                score, scores = self._evaluate_planner()
            metrics |= scores
            if self.best_score is None or score > self.best_score[0]:
                self.best_score = (score, self.step)
                self._save(name="best.pt")
        if metrics and self.log is not None:
            self.log(metrics, self.step)
        if stop is None and self.step % cfg.checkpoint_every == 0 and not final:
            self._save()
        return stop

    def train(self) -> TrainSummary:
        self.model.train()
        if self.cfg.schedule == "schedule_free":
            self.optimizer.train()  # a checkpoint holds the averaged weights: back to steps'
        start_time, start_tokens = time.perf_counter(), self.tokens_seen
        self.clock.started(self.step)
        bar = progress_bar(self._bar_total(), "train", self.step, disable=not self.progress)
        loss = None
        stop_reason = None
        previous_handler = self._catch_interrupt()
        try:
            while self.step < self.last_step():
                if self.dist.any(self.stops.requested):
                    raise KeyboardInterrupt
                asked = self.cfg.cooldown_on_interrupt and self.cooldown is None
                if asked and self.dist.any(self.stops.diverted):
                    self._start_cooldown("a Ctrl-C asked for a cooldown")
                    continue
                first = self.step_in_epoch * self.cfg.batch_size
                loss = self.train_step(self._epoch_order()[first : first + self.cfg.batch_size])
                bar.update(1)
                seconds = time.perf_counter() - start_time
                work, costs = self._work_total, dict(self._work_seconds)
                if self.clock.budget is not None:  # the ranks plan by one clock, rank 0's
                    seconds, work, costs = self.dist.from_main((seconds, work, costs))
                self.clock.tick(seconds)
                self.clock.work, self.clock.reserve = work, self._closing_seconds(costs)
                self.clock.periodic = functools.partial(self._periodic_seconds, costs)
                self._replan()
                final = self.step >= self.last_step() or self.clock.out_of_time
                if bar.total != self._bar_total():
                    bar.total = self._bar_total()
                    bar.refresh()
                stop_reason = self._after_step(loss, start_time, start_tokens, bar, final)
                if stop_reason is not None:
                    break
                if self.clock.out_of_time:
                    break
        except KeyboardInterrupt:
            if loss is not None:
                self.last_loss = float(self.dist.sum_(loss.clone()))  # the last completed step
            self._save()  # the last completed step; a further Ctrl-C aborts only this save
            raise
        finally:
            bar.close()
            self.stops.restore(previous_handler)
        if loss is not None:
            self.last_loss = float(self.dist.sum_(loss.clone()))
        if self.cfg.schedule == "schedule_free":
            self.optimizer.eval()  # the model leaves training with its averaged weights
        self.clock.tick(time.perf_counter() - start_time)  # the closing work counts too
        path = self._save(finished=True)
        seconds = time.perf_counter() - start_time
        return TrainSummary(
            steps=self.step,
            epochs=self.step / self.steps_per_epoch,
            windows=len(self.windows),
            final_loss=self.last_loss,
            seconds=seconds,
            tokens_per_second=(self.tokens_seen - start_tokens) / max(seconds, 1e-9),
            checkpoint=path,
            stop_reason=self._stop_reason(stop_reason),
            best_validation=self.best_validation,
            best_score=self.best_score,
        )
