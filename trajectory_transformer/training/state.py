"""What a checkpoint holds to resume a `Trainer`'s run bit for bit (the optimiser, the
position in the batch order, the schedule, the clock, every rank's random generators), and
the longer run that a larger step cap or time budget extends it to."""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

from trajectory_transformer.training.schedule import Cooldown, RunClock

if TYPE_CHECKING:
    from trajectory_transformer.training.distributed import Distributed
    from trajectory_transformer.training.trainer import TrainerConfig


class ResumableState:
    """A `Trainer`'s state as of its last completed step: `state()` to write, `load_state` to
    go on. A part of `Trainer`, whose `__init__` sets the attributes it reads."""

    cfg: TrainerConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    dist: Distributed
    clock: RunClock
    cooldown: Cooldown | None
    total_steps: int
    extended_from: int | None

    def _keep_state_before_cooldown(self) -> None:
        """WSD: the run as it stands when its cooldown begins (weights, optimiser, position),
        kept in every later checkpoint: a resume that plans a longer run goes on from here,
        at the peak, and cools down again at its new end."""
        state = copy.deepcopy(self.state())
        state["model"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self._before_cooldown = state

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
        self.model.load_state_dict(before["model"])
        self.extended_from = before["step"]
        return before
