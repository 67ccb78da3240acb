"""A `Trainer`'s measures on what it does not train on: the validation loss per token kind
over a fixed sample of held-out windows, the stopping rule it drives, and the planner's
score in the environment."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from trajectory_transformer.training.loss import TOKEN_KINDS, input_values, token_cross_entropy

if TYPE_CHECKING:
    from trajectory_transformer.data.windows import TokenWindows
    from trajectory_transformer.training.distributed import Distributed
    from trajectory_transformer.training.schedule import Cooldown
    from trajectory_transformer.training.trainer import TrainerConfig


class Validation:
    """Validation, the stopping rule and planner evaluations of a `Trainer`. A part of
    `Trainer`, whose `__init__` sets the attributes it reads."""

    cfg: TrainerConfig
    model: torch.nn.Module
    device: torch.device
    dist: Distributed
    validation: TokenWindows | None
    weights: torch.Tensor
    kinds: torch.Tensor
    step: int
    stopping_rule: bool
    cooldown: Cooldown | None
    best_validation: tuple[float, int] | None
    validations_since_best: int
    _validation_ids: torch.Tensor | None
    target_probabilities: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor | None]

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

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Validation loss (the training loss, its targets and weights) and mean cross-entropy
        of the tokens per token kind, over the fixed validation sample, summed over the ranks'
        parts. Draws no random numbers (dropout is off), so it leaves a run's course
        unchanged."""
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
                    logits = self.model(tokens[:, :-1], input_values(values))
                ce = token_cross_entropy(logits, tokens[:, 1:])  # (B, S)
                # The loss as trained, where its targets are not the tokens themselves.
                targets = self.target_probabilities(tokens, values)
                loss = ce
                if targets is not None:
                    loss = token_cross_entropy(logits, tokens[:, 1:], targets)
                mask = mask[:, 1:].to(ce.dtype)
                kind = self.kinds[: ce.shape[1]].expand_as(ce)
                sums[:kinds] += torch.zeros(kinds, device=self.device).index_add_(
                    0, kind.flatten(), (ce * mask).flatten()
                )
                sums[kinds : 2 * kinds] += torch.bincount(
                    kind.flatten(), weights=mask.flatten(), minlength=kinds
                )
                sums[-1] += (loss * self.weights[: ce.shape[1]] * mask).sum()
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

    def _after_validation(self, loss: float) -> str | None:
        """Keeps the best validation loss (and writes `best_validation.pt`); returns why the run
        stops when the stopping rule fires, or None. Under WSD the rule starts the cooldown
        instead, which then ends the run."""
        cfg, best = self.cfg, self.best_validation
        if best is None or loss < best[0] - cfg.min_delta:
            self.best_validation = (loss, self.step)
            self.validations_since_best = 0
            self._save(name="best_validation.pt")
            return None
        self.validations_since_best += 1
        stalled = self.stopping_rule and self.validations_since_best >= cfg.patience
        if not stalled or self.cooldown is not None:
            return None
        stop = (
            f"the validation loss has not improved by {cfg.min_delta} for "
            f"{cfg.patience} validations ({cfg.patience * cfg.validate_every} steps)"
        )
        if cfg.schedule == "wsd":  # not yet: the cooldown ends the run
            self._start_cooldown(stop)
            return None
        return stop
