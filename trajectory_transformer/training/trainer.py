"""Training loop: weighted cross-entropy, AdamW, a learning-rate schedule, resumable.

One process, or several under torchrun (`Distributed`): `batch_size` is always the global
batch, split across the ranks, and the loss is normalised by the global batch's token count,
so N ranks take exactly the step that one process takes on the whole batch. Optional: a
validation split (loss per token kind, a stopping rule, `best_validation.pt`) and planner
evaluation during training (`best.pt`). The schedules, and the wall-clock budget, are in
`schedule.py`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.model import TrajectoryGPT
from trajectory_transformer.progress import format_duration, progress_bar
from trajectory_transformer.training.distributed import Distributed
from trajectory_transformer.training.interrupts import StopRequests
from trajectory_transformer.training.schedule import (
    SCHEDULES,
    Cooldown,
    RunClock,
    cooldown_due,
    cooldown_from,
    cosine_learning_rate,
    parse_duration,
    wsd_learning_rate,
)

LogFn = Callable[[dict, int], None]
SaveFn = Callable[..., Path]  # save(training_state, name="checkpoint.pt") -> the file written
EvaluateFn = Callable[[TrajectoryGPT], tuple[float, dict]]
"""Plays the planner with the model; returns (score to select `best.pt` by, metrics to log)."""

TOKEN_KINDS = ("observation", "action", "reward", "value")


class NonFiniteLossError(RuntimeError):
    """A step's loss or gradients were NaN or infinite: training stopped before applying it."""


COOLDOWN_LINE = "cooling the learning rate down before stopping (Ctrl-C again: stop now)"
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


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
        counts = ("batch_size", "patience", "validate_every", "eval_episodes")
        for name in (*counts, "checkpoint_every", "log_every"):
            require(name, lambda x: x >= 1, "at least 1")
        for name in ("max_steps", "epochs", "eval_every", "validation_windows"):
            require(name, lambda x: x is None or x >= 1, "at least 1, or null")
        require("learning_rate", lambda x: finite(x) and x >= 0, "a finite number >= 0")
        require("weight_decay", lambda x: finite(x) and x >= 0, "a finite number >= 0")
        require("grad_clip", lambda x: finite(x) and x > 0, "a finite number > 0")
        in_unit = lambda x: finite(x) and 0 <= x < 1  # noqa: E731
        require("betas", lambda x: len(x) == 2 and all(map(in_unit, x)), "two numbers in [0, 1)")
        require("warmup_fraction", in_unit, "in [0, 1)")
        require("min_lr_fraction", lambda x: finite(x) and 0 <= x <= 1, "in [0, 1]")
        require("cooldown_fraction", lambda x: finite(x) and 0 < x <= 1, "in (0, 1]")
        for name in ("reference_epochs", "schedule_epochs"):
            require(name, lambda x: finite(x) and x > 0, "a finite number > 0")
        require("min_delta", lambda x: finite(x) and x >= 0, "a finite number >= 0")
        weights = ("observation_weight", "action_weight", "reward_weight", "value_weight")
        for name in weights:
            require(name, lambda x: finite(x) and x >= 0, "a finite number >= 0")
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


def loss_weights(model: TrajectoryGPT, cfg: TrainerConfig) -> torch.Tensor:
    """Weight of each target position of a block (block_size - 1,), by the target's dimension."""
    mc = model.config
    per_dim = torch.tensor(
        [cfg.observation_weight] * mc.observation_dim
        + [cfg.action_weight] * mc.action_dim
        + [cfg.reward_weight, cfg.value_weight]
    )
    target_dims = torch.arange(1, mc.block_size) % mc.transition_dim
    return per_dim[target_dims]


def token_kinds(model: TrajectoryGPT) -> torch.Tensor:
    """Kind of each target position of a block (block_size - 1,): an index into TOKEN_KINDS."""
    mc = model.config
    per_dim = torch.tensor([0] * mc.observation_dim + [1] * mc.action_dim + [2, 3])
    return per_dim[torch.arange(1, mc.block_size) % mc.transition_dim]


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every target token (B, S), in float32 whatever the logits' dtype."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    return ce.view_as(targets)


def weighted_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    token_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy per token, times its dimension's weight, averaged over unpadded tokens:
    this batch's, or `token_count` of them (the global batch's, when ranks share one)."""
    ce = token_cross_entropy(logits, targets)  # (B, S)
    mask = mask.to(ce.dtype)
    count = mask.sum() if token_count is None else token_count
    return (ce * weights[: ce.shape[1]] * mask).sum() / count.clamp_min(1.0)


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


def _inputs(values: torch.Tensor | None) -> torch.Tensor | None:
    """A batch's real values (B, S) as the inputs of positions [0, S - 1)."""
    return None if values is None else values[:, :-1]


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


class Trainer:
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
            if model.config.value_inputs and part is not None and part.values is None:
                raise ValueError(
                    "the model takes real values (model.value_inputs) and the windows hold "
                    "none: build them with TokenWindows(..., real_values=True)"
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

    def _validation_sample(self) -> torch.Tensor | None:
        """The validation windows scored each time: the same fixed sample throughout a run."""
        if self.validation is None:
            return None
        ids = torch.arange(len(self.validation))
        limit = self.cfg.validation_windows
        if limit is not None and limit < len(ids):
            chosen = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))
            ids = chosen[:limit].sort().values
        return self.dist.share(ids)

    # -- schedule and length ---------------------------------------------------------------
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
            level = self.learning_rate() / self.cfg.learning_rate if self.cfg.learning_rate else 1.0
            cooldown = cooldown_due(self.step, self.cfg.cooldown_fraction, last, level)
            if cooldown is not None:
                self._keep_state_before_cooldown()
                self.cooldown = cooldown
                self._cooldown_reason = (
                    f"the time budget of {self.cfg.time_budget} drew near"
                    if last < self.total_steps
                    else f"the run neared its {self.total_steps} planned steps"
                )

    def _start_cooldown(self, reason: str) -> None:
        """WSD: cool down from now over `cooldown_fraction` of the steps so far."""
        level = self.learning_rate() / self.cfg.learning_rate if self.cfg.learning_rate else 1.0
        self._keep_state_before_cooldown()
        self.cooldown = cooldown_from(
            self.step, self.cfg.cooldown_fraction, self.last_step(), level
        )
        self._cooldown_reason = reason

    def _keep_state_before_cooldown(self) -> None:
        """WSD: the run as it stands when its cooldown begins (weights, optimiser, position),
        kept in every later checkpoint: a resume that plans a longer run goes on from here,
        at the peak, and cools down again at its new end."""
        state = copy.deepcopy(self.state())
        state["model"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self._before_cooldown = state

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

    # -- state ---------------------------------------------------------------------------
    def _rng_state(self) -> dict:
        """The generators this rank draws from: the CPU's, and its own CUDA device's only, so
        that a checkpoint resumes on a machine with fewer devices, or none."""
        state = {"torch_rng_state": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda_rng_state"] = torch.cuda.get_rng_state(self.device)
        return state

    def _set_rng_state(self, state: dict) -> None:
        torch.set_rng_state(state["torch_rng_state"])
        cuda = state.get("cuda_rng_state")
        if isinstance(cuda, list | tuple):  # written with every device's state
            index = (self.device.index or 0) if self.device.type == "cuda" else None
            cuda = cuda[index] if index is not None and index < len(cuda) else None
        if cuda is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(cuda, self.device)

    def state(self, finished: bool = False) -> dict:
        """Everything needed to resume, as of the last completed step. Under torchrun every
        rank calls it together: it gathers each rank's dropout generator."""
        # A step that was dropped half-way has drawn dropout masks; resume redraws them.
        rng = self._rng_at_step_start or self._rng_state()
        state = {
            "step": self.step,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "tokens_seen": self.tokens_seen,
            "total_steps": self.total_steps,
            "last_loss": self.last_loss,
            "finished": finished,
            "optimizer": self.optimizer.state_dict(),
            "epoch_generator_state": self._epoch_generator_state,
            "best_validation": self.best_validation,
            "validations_since_best": self.validations_since_best,
            "best_score": self.best_score,
            "schedule": self.cfg.schedule,
            "cooldown": None if self.cooldown is None else asdict(self.cooldown),
            "cooldown_reason": self._cooldown_reason,
            "elapsed_seconds": self.clock.elapsed,
            "time_budget_seconds": self.clock.budget,
            **rng,
        }
        if self._before_cooldown is not None:
            state["before_cooldown"] = self._before_cooldown
        if self._in_schedule_free_steps():  # checkpoints hold the average; resume needs both
            state["steps_weights"] = {
                name: p.detach().clone() for name, p in self.model.named_parameters()
            }
        if self.dist.active:
            state["rank_rng_states"] = self.dist.gather(rng)
        return state

    def load_state(self, state: dict) -> None:
        """Go on with the run that `state` describes: the same plan, or a longer one (a larger
        step cap or time budget) under `wsd` or `schedule_free`, which extends it. The model's
        weights are the checkpoint's, loaded by the caller; an extended WSD run replaces them
        with those from before its cooldown."""
        schedule = state.get("schedule", "cosine")
        if schedule != self.cfg.schedule:
            raise ValueError(
                f"the checkpoint was trained with trainer.schedule={schedule}, this config has "
                f"{self.cfg.schedule}; resume with trainer.schedule={schedule}"
            )
        if self._extends(state):
            state = self._extension_start(state)
        self.optimizer.load_state_dict(state["optimizer"])
        if "steps_weights" in state:  # the model was loaded with the averaged weights
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    p.copy_(state["steps_weights"][name])
        cooldown = state.get("cooldown")
        self.cooldown = None if cooldown is None else Cooldown(**cooldown)
        self._cooldown_reason = state.get("cooldown_reason", "")
        self._before_cooldown = state.get("before_cooldown")
        self.clock = RunClock(self.clock.budget, float(state.get("elapsed_seconds", 0.0)))
        self.step = state["step"]
        self.epoch = state["epoch"]
        self.step_in_epoch = state["step_in_epoch"]
        self.tokens_seen = state["tokens_seen"]
        self.last_loss = state["last_loss"]
        self._epoch_generator_state = state["epoch_generator_state"]
        self._order = None
        best = state.get("best_validation")
        self.best_validation = None if best is None else (float(best[0]), int(best[1]))
        self.validations_since_best = state.get("validations_since_best", 0)
        best = state.get("best_score")
        self.best_score = None if best is None else (float(best[0]), int(best[1]))
        ranks = state.get("rank_rng_states") or [state]
        if len(ranks) != self.dist.world_size and self.dist.is_main:
            print(
                f"note: the checkpoint was written by {len(ranks)} rank(s), this run has "
                f"{self.dist.world_size}: the batches and the updates continue as they were, "
                "the dropout masks of the new ranks are drawn afresh",
                file=sys.stderr,
            )
        if self.dist.rank < len(ranks):
            self._set_rng_state(ranks[self.dist.rank])

    def _extends(self, state: dict) -> bool:
        """Whether this config plans the checkpoint's run (False) or a longer one (True); a
        shorter or different plan is refused."""
        planned, budget = state["total_steps"], state.get("time_budget_seconds", self.clock.budget)
        if planned == self.total_steps and budget == self.clock.budget:
            return False

        def unlimited(seconds: float | None) -> float:
            return math.inf if seconds is None else seconds

        longer = self.total_steps >= planned and unlimited(self.clock.budget) >= unlimited(budget)
        old = f"{planned} steps" + ("" if budget is None else f" within {budget:g} s")
        new = f"{self.total_steps} steps" + (
            "" if self.clock.budget is None else f" within {self.clock.budget:g} s"
        )
        if not longer:
            raise ValueError(
                f"the checkpoint planned {old}, this config plans {new}; resume with the same "
                "trainer settings, or a larger trainer.max_steps or trainer.time_budget to "
                "extend the run."
            )
        if self.cfg.schedule == "cosine":
            raise ValueError(
                f"the checkpoint planned {old}, this config plans {new}: a cosine run cannot be "
                "extended: its learning rate decays over the length planned at its start, so a "
                "longer plan would change the rates of the steps already taken. Resume with the "
                "same trainer settings; for runs you can extend, train with "
                "trainer.schedule=wsd or schedule_free."
            )
        return True

    def _extension_start(self, state: dict) -> dict:
        """The state a longer run goes on from: WSD's from before its cooldown (its weights
        put into the model), schedule-free's as it is (its average is a finished model at
        every step, and its steps go on from where they were)."""
        self.extended_from = state["step"]
        if self.cfg.schedule != "wsd" or state.get("cooldown") is None:
            return state
        before = state.get("before_cooldown")
        if before is None:
            raise ValueError(
                "the checkpoint's cooldown has begun and it keeps no state from before it, so "
                "the run cannot be extended; resume with the same trainer settings."
            )
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                tensor.copy_(before["model"][name])
        self.extended_from = before["step"]
        return before

    # -- loop ----------------------------------------------------------------------------
    def _epoch_order(self) -> torch.Tensor:
        """The current epoch's permutation of the windows, drawn once per epoch."""
        if self._order is None or self._order_epoch != self.epoch:
            self.order_generator.set_state(self._epoch_generator_state)
            self._order = torch.randperm(len(self.windows), generator=self.order_generator)
            self._order_epoch = self.epoch
        return self._order

    def train_step(self, window_ids: torch.Tensor) -> torch.Tensor:
        """One optimisation step on the given (global) batch of windows; returns this rank's
        share of the loss (on the device; the ranks' shares sum to the batch's loss)."""
        self._rng_at_step_start = self._rng_state()
        tokens, mask, values = self.windows.batch(self.dist.share(window_ids))  # on self.device
        token_count = self.dist.sum_(mask[:, 1:].sum(dtype=torch.float32))
        with self._autocast():
            logits = self.forward(tokens[:, :-1], _inputs(values))  # (B, S - 1, N)
        loss = weighted_loss(logits, tokens[:, 1:], mask[:, 1:], self.weights, token_count)
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

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Validation loss (weighted as in training) and mean cross-entropy per token kind,
        over the fixed validation sample, summed over the ranks' parts. Draws no random
        numbers (dropout is off), so it leaves a run's course unchanged."""
        assert self.validation is not None and self._validation_ids is not None
        with self._evaluation_weights():
            return self._validate()

    def _validate(self) -> dict[str, float]:
        self.model.eval()
        kinds = len(TOKEN_KINDS)
        # Per kind: summed cross-entropy, token count; then the weighted sum.
        sums = torch.zeros(2 * kinds + 1, dtype=torch.float64, device=self.device)
        try:
            for ids in self._validation_ids.split(self.cfg.batch_size):
                tokens, mask, values = self.validation.batch(ids)
                with self._autocast():
                    logits = self.model(tokens[:, :-1], _inputs(values))
                ce = token_cross_entropy(logits, tokens[:, 1:])  # (B, S)
                mask = mask[:, 1:].to(ce.dtype)
                kind = self.kinds[: ce.shape[1]].expand_as(ce)
                sums[:kinds] += torch.zeros(kinds, device=self.device).index_add_(
                    0, kind.flatten(), (ce * mask).flatten()
                )
                sums[kinds : 2 * kinds] += torch.bincount(
                    kind.flatten(), weights=mask.flatten(), minlength=kinds
                )
                sums[-1] += (ce * self.weights[: ce.shape[1]] * mask).sum()
        finally:
            self.model.train()
        sums = self.dist.sum_(sums).cpu()
        counts = sums[kinds : 2 * kinds]
        metrics = {"val/loss": float(sums[-1] / counts.sum().clamp_min(1.0))}
        for i, name in enumerate(TOKEN_KINDS):
            metrics[f"val/{name}_ce"] = float(sums[i] / counts[i].clamp_min(1.0))
        return metrics

    def _evaluate_planner(self) -> tuple[float, dict] | None:
        """Rank 0 plays the planner; the others wait for it however long it takes."""
        result = None
        if self.dist.is_main:
            rng = self._rng_state()  # the planner's sampling must not move training's dropout
            try:
                with self._evaluation_weights():
                    result = self.evaluate(self.model.eval())
            finally:
                self._set_rng_state(rng)
                self.model.train()
        self.dist.wait_for_main()
        return self.dist.from_main(result)

    def request_stop(self) -> None:
        """Stop at the next step boundary: write a checkpoint, then raise KeyboardInterrupt."""
        self.stops.request()

    def _catch_interrupt(self):
        """First Ctrl-C: stop after this step. Second: stop now, never inside an update.
        Returns the handler it replaced."""
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
            best = self.best_validation
            if best is None or validation["val/loss"] < best[0] - cfg.min_delta:
                self.best_validation = (validation["val/loss"], self.step)
                self.validations_since_best = 0
                self._save(name="best_validation.pt")
            else:
                self.validations_since_best += 1
                stalled = self.stopping_rule and self.validations_since_best >= cfg.patience
                if stalled and self.cooldown is None:
                    stop = (
                        f"the validation loss has not improved by {cfg.min_delta} for "
                        f"{cfg.patience} validations ({cfg.patience * cfg.validate_every} steps)"
                    )
                    if cfg.schedule == "wsd":  # not yet: the cooldown ends the run
                        self._start_cooldown(stop)
                        stop = None
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
