import os
import signal
import time
from dataclasses import replace

import pytest
import torch
from conftest import tiny_training, tiny_training_info, tolerance

from trajectory_transformer.checkpoint import build_payload, load_checkpoint, save_atomic
from trajectory_transformer.training.loss import loss_weights
from trajectory_transformer.training.schedule_state import learning_rate, planned_steps
from trajectory_transformer.training.trainer import Trainer, TrainerConfig


def losses_of_80_steps(model, windows, cfg, tmp_path) -> list[float]:
    """Train for 80 steps, returning the logged training losses."""
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
    return losses


def test_a_short_run_lowers_the_loss(tmp_path, device):
    model, windows, _, cfg = tiny_training(device=device)
    losses = losses_of_80_steps(model, windows, cfg, tmp_path)
    assert losses[-1] < 0.6 * losses[0]


def test_a_model_with_value_inputs_learns_from_the_windows_real_values(tmp_path):
    model, windows, _, cfg = tiny_training(value_inputs=True)
    given = []
    forward = model.forward

    def recording_forward(tokens, values=None):
        given.append(values)
        return forward(tokens, values)

    model.forward = recording_forward
    losses = losses_of_80_steps(model, windows, cfg, tmp_path)
    assert losses[-1] < 0.6 * losses[0]
    # Every step saw the values beside its tokens: the windows' own, as inputs.
    assert len(given) == 80 and all(v is not None for v in given)
    T = windows.transition_dim
    assert given[0].shape == (cfg.batch_size, windows.sequence_transitions * T - 1)
    first = given[0][:, :T]  # each window's first transition: a row of the data, exactly
    assert (first[:, None] == windows.values[None]).all(-1).any(-1).all()


def test_a_model_with_value_inputs_refuses_windows_without_values(tmp_path):
    model, _, _, cfg = tiny_training(value_inputs=True)
    _, windows, _, _ = tiny_training()
    with pytest.raises(ValueError, match="real_values=True"):
        Trainer(model, windows, cfg, lambda s: tmp_path / "x", progress=False)


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


def test_save_then_load_gives_identical_outputs(tmp_path, device):
    model, windows, discretizer, cfg = tiny_training(device=device)
    Trainer(
        model, windows, replace(cfg, max_steps=5), lambda s: tmp_path / "x", progress=False
    ).train()
    path = save_atomic(
        build_payload(model, discretizer, tiny_training_info(), {"seed": 0}, None),
        tmp_path / "checkpoint.pt",
    )
    raw = torch.load(path, weights_only=True)
    assert set(raw) >= {"model", "discretizer", "dataset", "config", "model_config"}
    loaded = load_checkpoint(path)  # on the CPU, wherever it was trained
    model.eval()
    tokens = windows.batch(torch.arange(8))[0].cpu()
    exact = dict(rtol=0, atol=0) if device.type == "cpu" else tolerance(device)
    torch.testing.assert_close(loaded.model(tokens), model(tokens.to(device)).cpu(), **exact)
    assert torch.equal(loaded.discretizer.edges, discretizer.edges)
    assert loaded.dataset == tiny_training_info() and loaded.config == {"seed": 0}


def run_to_end(
    tmp_path, stop_at=None, resume_from=None, prepare=None, device="cpu", **trainer_overrides
):
    """Train the tiny model on `device` to its 40th step, writing `tmp_path/checkpoint.pt`;
    `stop_at` requests a stop (a first Ctrl-C) after that step; `prepare(trainer)` runs before
    training."""
    model, windows, discretizer, cfg = tiny_training(device=device, **trainer_overrides)
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
    if prepare is not None:
        prepare(trainer)
    trainer.train()
    return model, trainer


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, **tolerances) -> None:
    """Bit for bit unless `tolerances` say otherwise."""
    tolerances = tolerances or dict(rtol=0, atol=0)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(x, y, msg=name, **tolerances)


@pytest.mark.parametrize("stop_at", [10, 19])  # 19 ends an epoch: 300 windows / 16
def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, stop_at, device):
    reference, _ = run_to_end(tmp_path / "a", device=device)
    with pytest.raises(KeyboardInterrupt):
        run_to_end(tmp_path / "b", stop_at=stop_at, device=device)
    state = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["training"]
    assert state["step"] == stop_at and not state["finished"]
    checkpoint = tmp_path / "b" / "checkpoint.pt"
    resumed, trainer = run_to_end(tmp_path / "c", resume_from=checkpoint, device=device)
    assert trainer.step == 40
    # The same draws and batches; on a GPU, atomic adds in the backward pass may round apart.
    assert_same_weights(reference, resumed, **({} if device.type == "cpu" else tolerance(device)))


def ctrl_c() -> None:
    """A Ctrl-C as the terminal sends it; its handler runs before the next Python call ends."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0)


def checkpoint_model(path):
    model = tiny_training()[0]
    payload = torch.load(path, weights_only=True)
    model.load_state_dict(payload["model"])
    return model, payload["training"]


def assert_interrupted_at_a_whole_step(tmp_path, prepare, step: int) -> None:
    """The run that `prepare` interrupts leaves the checkpoint that a clean stop after `step`
    steps leaves, and resuming from it ends where an uninterrupted run ends."""
    with pytest.raises(KeyboardInterrupt):
        run_to_end(tmp_path / "interrupted", prepare=prepare)
    interrupted, state = checkpoint_model(tmp_path / "interrupted" / "checkpoint.pt")
    assert state["step"] == step and not state["finished"]
    with pytest.raises(KeyboardInterrupt):
        run_to_end(tmp_path / "stopped", stop_at=step)
    assert_same_weights(checkpoint_model(tmp_path / "stopped" / "checkpoint.pt")[0], interrupted)

    reference, _ = run_to_end(tmp_path / "reference")
    checkpoint = tmp_path / "interrupted" / "checkpoint.pt"
    resumed, trainer = run_to_end(tmp_path / "resumed", resume_from=checkpoint)
    assert trainer.step == 40
    assert_same_weights(reference, resumed)


def test_a_second_ctrl_c_during_an_update_never_saves_half_a_step(tmp_path):
    """The update is applied parameter group by parameter group (as optimisers do, tensor by
    tensor); a second Ctrl-C arrives after the first group."""

    def interrupt_update_of_step_13(trainer):
        apply, groups = trainer.optimizer.step, trainer.optimizer.param_groups

        def step_in_parts():
            if trainer.step != 12:  # the counter moves once the update is applied
                return apply()
            ctrl_c()  # the first: stop after this step
            for part in ([groups[0]], groups[1:]):
                trainer.optimizer.param_groups = part
                apply()
                ctrl_c()  # the second: stop at once
            trainer.optimizer.param_groups = groups

        trainer.optimizer.step = step_in_parts

    # The update was finished first: the checkpoint holds step 13 whole.
    assert_interrupted_at_a_whole_step(tmp_path, interrupt_update_of_step_13, 13)


def test_a_second_ctrl_c_before_the_update_drops_the_step_and_resumes_exactly(tmp_path):
    """Ctrl-C twice in the middle of step 13's forward pass, after dropout drew random numbers:
    the checkpoint holds 12 steps and the random state they left, so nothing is skipped."""

    def interrupt_forward_of_step_13(trainer):
        def hook(module, inputs, output):
            if trainer.step == 12 and module.training:
                ctrl_c()
                ctrl_c()

        trainer.model.blocks[-1].register_forward_hook(hook)

    assert_interrupted_at_a_whole_step(tmp_path, interrupt_forward_of_step_13, 12)


def test_a_ctrl_c_during_the_save_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    torch_save = torch.save

    def save_then_interrupt(payload, file):
        if payload["training"]["step"] == 8:  # the save that the stop at step 8 asked for
            file.write(b"half a checkpoint")
            raise KeyboardInterrupt
        torch_save(payload, file)

    monkeypatch.setattr(torch, "save", save_then_interrupt)
    trainers = []
    with pytest.raises(KeyboardInterrupt):
        run_to_end(tmp_path / "b", stop_at=8, prepare=trainers.append, checkpoint_every=5)
    monkeypatch.setattr(torch, "save", torch_save)
    assert trainers[0].step == 8 and trainers[0].saved_step == 5
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["checkpoint.pt"]  # no temporary
    assert checkpoint_model(tmp_path / "b" / "checkpoint.pt")[1]["step"] == 5

    reference, _ = run_to_end(tmp_path / "ref", checkpoint_every=5)
    resumed, trainer = run_to_end(
        tmp_path / "c", resume_from=tmp_path / "b" / "checkpoint.pt", checkpoint_every=5
    )
    assert trainer.step == 40
    assert_same_weights(reference, resumed)


def test_a_non_finite_loss_stops_training_before_it_reaches_the_weights(tmp_path, monkeypatch):
    from trajectory_transformer.training import trainer as trainer_module

    weighted = trainer_module.weighted_loss
    calls = []

    def poisoned(*args, **kwargs):  # step 15's loss is infinite
        calls.append(None)
        loss = weighted(*args, **kwargs)
        return loss * float("inf") if len(calls) == 15 else loss

    monkeypatch.setattr(trainer_module, "weighted_loss", poisoned)
    with pytest.raises(trainer_module.NonFiniteLossError, match=r"not finite .* at step 15"):
        run_to_end(tmp_path, checkpoint_every=10)
    model, state = checkpoint_model(tmp_path / "checkpoint.pt")
    assert state["step"] == 10  # the last good checkpoint, not overwritten
    assert all(torch.isfinite(p).all() for p in model.parameters())
    monkeypatch.setattr(trainer_module, "weighted_loss", weighted)
    reference, _ = run_to_end(tmp_path / "reference")
    resumed, _ = run_to_end(tmp_path / "resumed", resume_from=tmp_path / "checkpoint.pt")
    assert_same_weights(reference, resumed)


def test_a_checkpoint_with_cuda_generator_states_resumes_on_a_machine_without_cuda(tmp_path):
    """A checkpoint of a CUDA run holds its device's generator state (an older one, every
    device's); on the CPU only the CPU generator is restored."""
    model, windows, _, cfg = tiny_training()
    trainer = Trainer(model, windows, cfg, lambda s: tmp_path, progress=False)
    device_state = torch.zeros(16, dtype=torch.uint8)
    for cuda_state in (device_state, [device_state] * 4):
        state = trainer.state() | {"cuda_rng_state": cuda_state}
        torch.manual_seed(123)
        expected = torch.rand(3)
        torch.manual_seed(123)
        state["torch_rng_state"] = torch.get_rng_state()
        torch.manual_seed(0)
        trainer.load_state(state)
        assert torch.equal(torch.rand(3), expected)
