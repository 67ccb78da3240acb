"""Training loop: weighted cross-entropy, AdamW, warm-up + cosine by tokens, resumable."""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.model import TrajectoryGPT

LogFn = Callable[[dict, int], None]


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
    warmup_fraction: float = 0.05
    """Fraction of the planned training tokens spent warming the learning rate up."""
    min_lr_fraction: float = 0.1
    """Cosine decay floor, as a fraction of the peak learning rate."""
    reference_epochs: float = 50.0
    """Epochs per one million transitions (the paper's rule): epochs = ref * 1e6 / windows."""
    epochs: int | None = None
    """Explicit epoch count; overrides `reference_epochs`."""
    max_steps: int | None = None
    """Stop after this many optimisation steps (caps the epoch-derived length)."""
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


@dataclass
class TrainSummary:
    steps: int
    epochs: float  # passes over the windows, fractional
    windows: int
    final_loss: float
    seconds: float
    tokens_per_second: float
    checkpoint: Path

    def line(self) -> str:
        return (
            f"trained {self.steps} steps ({self.epochs:.2f} epochs over {self.windows} "
            f"windows) in {self.seconds:.1f} s | final loss {self.final_loss:.4f} | "
            f"{self.tokens_per_second:,.0f} tokens/s | checkpoint {self.checkpoint}"
        )


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


def weighted_loss(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy per token, times its dimension's weight, averaged over unpadded tokens."""
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    ce = ce.view_as(targets)  # (B, S)
    mask = mask.to(ce.dtype)
    return (ce * weights[: ce.shape[1]] * mask).sum() / mask.sum().clamp_min(1.0)


def learning_rate(cfg: TrainerConfig, tokens_seen: float, planned_tokens: float) -> float:
    """Linear warm-up, then cosine decay to `min_lr_fraction` of the peak, by tokens seen."""
    warmup = cfg.warmup_fraction * planned_tokens
    if tokens_seen < warmup:
        return cfg.learning_rate * tokens_seen / max(warmup, 1.0)
    progress = min(1.0, (tokens_seen - warmup) / max(planned_tokens - warmup, 1.0))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.learning_rate * max(cfg.min_lr_fraction, cosine)


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
    """Trains `model` on `windows`; `save(training_state)` persists a checkpoint; `seed` seeds
    the order of the batches.

    Ctrl-C is safe at any moment. The first one stops the run after the step in progress and
    writes a checkpoint. A second one stops at once: a step whose update has not begun is
    dropped (resume redoes it), one being applied is finished first, so a checkpoint never
    holds half a step. A Ctrl-C during a save aborts that save only; the file written before
    it stays as it was (saves are atomic).
    """

    def __init__(
        self,
        model: TrajectoryGPT,
        windows: TokenWindows,
        cfg: TrainerConfig,
        save: Callable[[dict], Path],
        seed: int = 0,
        log: LogFn | None = None,
        progress: bool = True,
    ) -> None:
        self.model = model
        self.windows = windows
        self.cfg = cfg
        self.save = save
        self.log = log
        self.progress = progress
        self.device = next(model.parameters()).device
        self.optimizer = model.configure_optimizer(cfg.learning_rate, cfg.weight_decay, cfg.betas)
        self.weights = loss_weights(model, cfg).to(self.device)
        self.epochs, self.total_steps = planned_steps(cfg, len(windows))
        self.steps_per_epoch = math.ceil(len(windows) / cfg.batch_size)
        self.tokens_per_step = cfg.batch_size * (model.config.block_size - 1)
        self.planned_tokens = float(self.total_steps * self.tokens_per_step)
        # Batch order comes from its own generator. Its state at the start of the current epoch
        # is kept and saved, so a resumed run draws the same permutation and skips the batches
        # already done. Dropout draws from torch's global generator, which the caller seeded
        # before building the model.
        self.order_generator = torch.Generator().manual_seed(seed)
        self.step = 0
        self.epoch = 0
        self.step_in_epoch = 0
        self.tokens_seen = 0.0
        self.last_loss = float("nan")
        self.saved_step: int | None = None  # step of the last checkpoint written by `train`
        self._epoch_generator_state = self.order_generator.get_state()
        self._order: torch.Tensor | None = None
        self._order_epoch = -1
        self._rng_at_step_start: dict | None = None  # set while a step is in progress
        self._interrupted = False
        self._applying = False  # a step's update is being applied: a Ctrl-C waits for it
        self._abort_after_update = False

    # -- state ---------------------------------------------------------------------------
    def _rng_state(self) -> dict:
        state = {"torch_rng_state": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda_rng_state"] = torch.cuda.get_rng_state_all()
        return state

    def state(self, finished: bool = False) -> dict:
        """Everything needed to resume, as of the last completed step."""
        return {
            "step": self.step,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "tokens_seen": self.tokens_seen,
            "total_steps": self.total_steps,
            "last_loss": self.last_loss,
            "finished": finished,
            "optimizer": self.optimizer.state_dict(),
            "epoch_generator_state": self._epoch_generator_state,
            # A step that was dropped half-way has drawn dropout masks; resume redraws them.
            **(self._rng_at_step_start or self._rng_state()),
        }

    def load_state(self, state: dict) -> None:
        if state["total_steps"] != self.total_steps:
            raise ValueError(
                f"the checkpoint planned {state['total_steps']} steps, this config plans "
                f"{self.total_steps}; resume with the same trainer settings."
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = state["step"]
        self.epoch = state["epoch"]
        self.step_in_epoch = state["step_in_epoch"]
        self.tokens_seen = state["tokens_seen"]
        self.last_loss = state["last_loss"]
        self._epoch_generator_state = state["epoch_generator_state"]
        self._order = None
        torch.set_rng_state(state["torch_rng_state"])
        if "cuda_rng_state" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng_state"])

    # -- loop ----------------------------------------------------------------------------
    def _epoch_order(self) -> torch.Tensor:
        """The current epoch's permutation of the windows, drawn once per epoch."""
        if self._order is None or self._order_epoch != self.epoch:
            self.order_generator.set_state(self._epoch_generator_state)
            self._order = torch.randperm(len(self.windows), generator=self.order_generator)
            self._order_epoch = self.epoch
        return self._order

    @contextlib.contextmanager
    def _applied_whole(self) -> Iterator[None]:
        """Apply an update as a unit: a Ctrl-C meanwhile takes effect once it is done."""
        self._applying = True
        try:
            yield
        finally:
            self._applying = False
        if self._abort_after_update:
            self._abort_after_update = False
            raise KeyboardInterrupt

    def train_step(self, window_ids: torch.Tensor) -> torch.Tensor:
        """One optimisation step on the given windows; returns the loss (on the device)."""
        self._rng_at_step_start = self._rng_state()
        tokens, mask = self.windows.batch(window_ids)
        tokens, mask = tokens.to(self.device), mask.to(self.device)
        logits = self.model(tokens[:, :-1])  # (B, S - 1, N)
        loss = weighted_loss(logits, tokens[:, 1:], mask[:, 1:], self.weights)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        # Until here nothing of the run's state has changed; from here it changes as a whole.
        with self._applied_whole():
            lr = learning_rate(self.cfg, self.tokens_seen, self.planned_tokens)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.tokens_seen += tokens.shape[0] * (tokens.shape[1] - 1)
            self.step += 1
            self.step_in_epoch += 1
            if self.step_in_epoch == self.steps_per_epoch:
                # Having drawn this epoch's permutation, the generator stands at the next's.
                self._epoch_generator_state = self.order_generator.get_state()
                self.epoch += 1
                self.step_in_epoch = 0
            self._rng_at_step_start = None
        return loss.detach()

    def request_stop(self) -> None:
        """Stop at the next step boundary: write a checkpoint, then raise KeyboardInterrupt."""
        self._interrupted = True

    def _catch_interrupt(self):
        """First Ctrl-C: stop after this step. Second: stop now, never inside an update."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, frame):
            if not self._interrupted:
                self.request_stop()
                print(
                    "\nstopping after this step to write a checkpoint (Ctrl-C again: at once)",
                    file=sys.stderr,
                    flush=True,
                )
            elif self._applying:
                self._abort_after_update = True
            else:
                raise KeyboardInterrupt

        return signal.signal(signal.SIGINT, handler)

    def _save(self, finished: bool = False) -> Path:
        path = self.save(self.state(finished=finished))
        self.saved_step = self.step
        return path

    def train(self) -> TrainSummary:
        self.model.train()
        start_time, start_tokens = time.perf_counter(), self.tokens_seen
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc="train",
            disable=not self.progress,
            dynamic_ncols=True,
        )
        loss = None
        previous_handler = self._catch_interrupt()
        try:
            while self.step < self.total_steps:
                if self._interrupted:
                    raise KeyboardInterrupt
                first = self.step_in_epoch * self.cfg.batch_size
                loss = self.train_step(self._epoch_order()[first : first + self.cfg.batch_size])
                bar.update(1)
                if self.step % self.cfg.log_every == 0 or self.step == self.total_steps:
                    self.last_loss = float(loss)  # the only host sync, every log_every steps
                    rate = (self.tokens_seen - start_tokens) / (time.perf_counter() - start_time)
                    bar.set_postfix(loss=f"{self.last_loss:.4f}", tok_s=f"{rate:,.0f}")
                    if self.log is not None:
                        lr = self.optimizer.param_groups[0]["lr"]
                        metrics = {"train/loss": self.last_loss, "train/lr": lr}
                        metrics |= {"train/tokens_per_s": rate, "train/epoch": self.epoch}
                        self.log(metrics, self.step)
                if self.step % self.cfg.checkpoint_every == 0 and self.step < self.total_steps:
                    self._save()
        except KeyboardInterrupt:
            if loss is not None:
                self.last_loss = float(loss)  # of the last completed step
            self._save()  # the last completed step; a further Ctrl-C aborts only this save
            raise
        finally:
            bar.close()
            if previous_handler is not None:
                signal.signal(signal.SIGINT, previous_handler)
        if loss is not None:
            self.last_loss = float(loss)
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
        )
