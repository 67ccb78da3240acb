"""Activation checkpointing trades memory for time and changes nothing else: the same loss and
gradients with dropout on, and no effect outside training."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trajectory_transformer.model import GPTConfig, TrajectoryGPT

BASE = GPTConfig(
    3, 2, 11, sequence_transitions=3, n_layer=3, n_head=2, embedding_dim=16, dropout=0.2
)


def model_with(mode: str, every: int = 1) -> TrajectoryGPT:
    torch.manual_seed(0)  # the same parameters in every mode
    config = dataclasses.replace(
        BASE, activation_checkpointing=mode, checkpoint_every_n_layers=every
    )
    return TrajectoryGPT(config)


def loss_and_grads(model: TrajectoryGPT) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.train()
    tokens = torch.randint(
        BASE.n_bins, (4, BASE.block_size - 1), generator=torch.Generator().manual_seed(1)
    )
    torch.manual_seed(2)  # the same dropout masks in every mode
    logits = model(tokens)
    targets = torch.randint(
        BASE.n_bins, logits.shape[:2], generator=torch.Generator().manual_seed(3)
    )
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_loss_and_gradients_match_without_checkpointing(mode: str, every: int) -> None:
    reference_loss, reference_grads = loss_and_grads(model_with("none"))
    loss, grads = loss_and_grads(model_with(mode, every))
    # float32 sums may be reordered between the first run and the rerun: close, not equal.
    torch.testing.assert_close(loss, reference_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == reference_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_dropout_is_on_in_the_comparison() -> None:
    # Otherwise the test above would not show that the rerun draws the same masks.
    model = model_with("none")
    model.train()
    tokens = torch.randint(BASE.n_bins, (4, BASE.block_size - 1))
    torch.manual_seed(5)
    a = model(tokens)
    torch.manual_seed(6)
    b = model(tokens)
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_eval_and_no_grad_ignore_the_setting(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, reference = model_with(mode), model_with("none")
    tokens = torch.randint(BASE.n_bins, (2, BASE.block_size))
    calls = []
    monkeypatch.setattr(
        "trajectory_transformer.model.checkpointing.checkpoint",
        lambda *args, **kwargs: calls.append(1) or pytest.fail("checkpointed outside training"),
    )
    model.eval()
    reference.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference(tokens), rtol=0, atol=0)
    model.train()
    with torch.no_grad():
        model(tokens)
    assert not calls


def test_training_calls_checkpoint_on_the_chosen_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    from trajectory_transformer.model import checkpointing

    calls = []
    real = checkpointing.checkpoint

    def counting(block, *args, **kwargs):
        calls.append(block)
        return real(block, *args, **kwargs)

    monkeypatch.setattr(checkpointing, "checkpoint", counting)
    model = model_with("full", every=2)
    loss_and_grads(model)
    assert calls == [model.blocks[0], model.blocks[2]]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"activation_checkpointing": "partial"}, "none, full, selective"),
        ({"activation_checkpointing": "Full"}, "none, full, selective"),
        ({"checkpoint_every_n_layers": 0}, "checkpoint_every_n_layers must be positive"),
    ],
)
def test_bad_settings_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(BASE, **changes)
