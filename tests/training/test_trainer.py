from dataclasses import replace

import pytest
import torch
from conftest import tiny_training, tiny_training_info

from trajectory_transformer.checkpoint import build_payload, load_checkpoint, save_atomic
from trajectory_transformer.config import TrainerConfig
from trajectory_transformer.training.trainer import (
    Trainer,
    learning_rate,
    loss_weights,
    planned_steps,
)


def test_a_short_run_lowers_the_loss(tmp_path):
    model, windows, _, cfg = tiny_training()
    losses = []
    trainer = Trainer(
        model,
        windows,
        replace(cfg, max_steps=80),
        lambda s: tmp_path / "x",
        log=lambda m, step: losses.append(m["train/loss"]),
        progress=False,
    )
    trainer.train()
    assert losses[-1] < 0.6 * losses[0]


def test_loss_weights_follow_the_target_dimension():
    model, _, _, cfg = tiny_training()
    weights = loss_weights(model, cfg)
    # Targets are positions 1..block-1; a transition is obs0 obs1 act rew val.
    assert weights[:6].tolist() == [1.0, 5.0, 1.0, 1.0, 1.0, 1.0]
    assert len(weights) == model.config.block_size - 1


def test_learning_rate_warms_up_then_decays_to_the_floor():
    cfg = TrainerConfig(learning_rate=1.0, warmup_fraction=0.1, min_lr_fraction=0.1)
    assert learning_rate(cfg, 0, 100) == 0
    assert learning_rate(cfg, 5, 100) == pytest.approx(0.5)
    assert learning_rate(cfg, 10, 100) == pytest.approx(1.0)
    assert learning_rate(cfg, 55, 100) == pytest.approx(0.5)
    assert learning_rate(cfg, 100, 100) == pytest.approx(0.1)


def test_epochs_scale_with_dataset_size():
    cfg = TrainerConfig(batch_size=100, reference_epochs=50)
    assert planned_steps(cfg, 1_000_000) == (50, 500_000)
    assert planned_steps(cfg, 100_000) == (500, 500_000)
    assert planned_steps(replace(cfg, epochs=2), 1000) == (2, 20)
    assert planned_steps(replace(cfg, max_steps=15), 1000) == (2, 15)


def test_save_then_load_gives_identical_outputs(tmp_path):
    model, windows, discretizer, cfg = tiny_training()
    Trainer(
        model, windows, replace(cfg, max_steps=5), lambda s: tmp_path / "x", progress=False
    ).train()
    path = save_atomic(
        build_payload(model, discretizer, tiny_training_info(), {"seed": 0}, None),
        tmp_path / "checkpoint.pt",
    )
    raw = torch.load(path, weights_only=True)
    assert set(raw) >= {"model", "discretizer", "dataset", "config", "model_config"}
    loaded = load_checkpoint(path)
    model.eval()
    tokens, _ = windows.batch(torch.arange(8))
    torch.testing.assert_close(loaded.model(tokens), model(tokens), rtol=0, atol=0)
    assert torch.equal(loaded.discretizer.edges, discretizer.edges)
    assert loaded.dataset == tiny_training_info() and loaded.config == {"seed": 0}


def run_to_end(tmp_path, stop_at=None, resume_from=None):
    model, windows, discretizer, cfg = tiny_training()
    saved = {}

    def save(state):
        saved["payload"] = build_payload(model, discretizer, tiny_training_info(), {}, state)
        return save_atomic(saved["payload"], tmp_path / "checkpoint.pt")

    trainer = Trainer(model, windows, cfg, save, seed=0, progress=False)
    if stop_at is not None:
        trainer.log = lambda metrics, step: trainer.request_stop() if step == stop_at else None
    if resume_from is not None:
        payload = torch.load(resume_from, weights_only=True)
        model.load_state_dict(payload["model"])
        trainer.load_state(payload["training"])
    trainer.train()
    return model, trainer


@pytest.mark.parametrize("stop_at", [10, 19])  # 19 ends an epoch: 300 windows / 16
def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, stop_at):
    reference, _ = run_to_end(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        run_to_end(tmp_path / "b", stop_at=stop_at)
    state = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["training"]
    assert state["step"] == stop_at and not state["finished"]
    resumed, trainer = run_to_end(tmp_path / "c", resume_from=tmp_path / "b" / "checkpoint.pt")
    assert trainer.step == 40
    for (name, a), (_, b) in zip(
        reference.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
