"""Validation split, validation loss, in-training evaluation, best checkpoints, stopping rule."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import structured_transitions, tiny_training

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.episodes import Episodes
from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.training.loss import TOKEN_KINDS
from trajectory_transformer.training.trainer import Trainer


def numbered_episodes(count: int = 20, length: int = 6) -> Episodes:
    """Episodes whose every observation holds its episode's number."""
    n = count * length
    episode = np.repeat(np.arange(count), length).astype(np.float32)
    return Episodes(
        observations=np.stack([episode, np.zeros(n, np.float32)], 1),
        actions=np.zeros((n, 1), np.float32),
        rewards=np.zeros(n, np.float32),
        terminated=np.zeros(n, bool),
        truncated=np.zeros(n, bool),
        lengths=np.full(count, length),
    )


def test_validation_episodes_are_whole_and_never_in_training():
    episodes = numbered_episodes()
    training, validation, held_out = episodes.split(0.25, seed=3)
    assert len(held_out) == 5 and validation.num_episodes == 5
    trained_on = set(training.observations[:, 0].tolist())
    validated_on = set(validation.observations[:, 0].tolist())
    assert validated_on == set(held_out.tolist()) and not trained_on & validated_on
    assert trained_on | validated_on == set(range(20))
    assert (validation.lengths == 6).all() and training.num_transitions == 15 * 6
    # The choice depends on the seed only, so every training seed validates on the same ones.
    assert np.array_equal(episodes.split(0.25, seed=3)[2], held_out)
    assert not np.array_equal(episodes.split(0.25, seed=4)[2], held_out)
    # At least one episode on each side.
    assert len(episodes.split(0.001, seed=0)[2]) == 1
    assert len(episodes.split(0.99, seed=0)[2]) == 19
    with pytest.raises(ValueError, match="validation fraction"):
        episodes.split(1.0, seed=0)


def held_out_windows(discretizer: Discretizer) -> TokenWindows:
    transitions, lengths = structured_transitions(episodes=4, seed=1)
    return TokenWindows(transitions, lengths, discretizer, sequence_transitions=4)


def test_validation_loss_per_token_kind_is_logged(tmp_path):
    model, windows, discretizer, cfg = tiny_training(max_steps=12, validate_every=5)
    logged = {}
    trainer = Trainer(
        model,
        windows,
        cfg,
        lambda state, name="checkpoint.pt": tmp_path / name,
        progress=False,
        validation=held_out_windows(discretizer),
        log=lambda metrics, step: logged.setdefault(step, metrics),
    )
    rng = torch.get_rng_state()
    first = trainer.validate()
    assert torch.equal(torch.get_rng_state(), rng), "validation drew random numbers"
    assert model.training
    assert set(first) == {"val/loss"} | {f"val/{kind}_ce" for kind in TOKEN_KINDS}
    assert all(np.isfinite(v) and v > 0 for v in first.values())
    summary = trainer.train()
    assert [s for s in logged if "val/loss" in logged[s]] == [5, 10, 12]
    assert logged[12]["val/loss"] < first["val/loss"]
    assert summary.best_validation[1] == 12


def test_best_checkpoint_holds_the_best_scoring_step(tmp_path):
    model, windows, _, cfg = tiny_training(max_steps=12, eval_every=3)
    scores = iter([1.0, 5.0, 3.0, 4.0])
    weights_at = {}
    saved = {}

    def evaluate(evaluated):
        assert evaluated is model and not model.training
        weights_at[trainer.step] = {k: v.clone() for k, v in model.state_dict().items()}
        score = next(scores)
        return score, {"eval/normalized_score": score}

    def save(state, name="checkpoint.pt"):
        saved[name] = (state["step"], {k: v.clone() for k, v in model.state_dict().items()})
        return tmp_path / name

    logged = {}
    trainer = Trainer(
        model,
        windows,
        cfg,
        save,
        progress=False,
        evaluate=evaluate,
        log=lambda metrics, step: logged.setdefault(step, metrics),
    )
    summary = trainer.train()
    assert [s for s in logged if "eval/normalized_score" in logged[s]] == [3, 6, 9, 12]
    assert summary.best_score == (5.0, 6)
    step, weights = saved["best.pt"]
    assert step == 6
    for name, value in weights.items():
        assert torch.equal(value, weights_at[6][name])
    assert saved["checkpoint.pt"][0] == 12


def test_evaluation_during_training_leaves_the_run_unchanged(tmp_path):
    def train(evaluate):
        model, windows, _, cfg = tiny_training(max_steps=10)
        if evaluate:
            cfg = replace(cfg, eval_every=2)

        def play(model):
            torch.rand(5)  # a planner draws random numbers; training must not feel it
            return 0.0, {}

        trainer = Trainer(model, windows, cfg, lambda *a: tmp_path, progress=False, evaluate=play)
        trainer.train()
        return model

    for (name, a), (_, b) in zip(
        train(False).state_dict().items(), train(True).state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_the_stopping_rule_stops_a_run_whose_validation_loss_has_stalled(tmp_path):
    # No fixed length: the budget is the paper's (thousands of steps here); a learning rate
    # of zero leaves the validation loss where it is, so the rule stops after the patience.
    model, windows, discretizer, cfg = tiny_training(
        max_steps=None, learning_rate=0.0, validate_every=2, patience=3
    )
    saved = []
    trainer = Trainer(
        model,
        windows,
        cfg,
        lambda state, name="checkpoint.pt": saved.append((name, state["step"])) or tmp_path,
        progress=False,
        validation=held_out_windows(discretizer),
    )
    assert trainer.stopping_rule and trainer.total_steps > 1000
    summary = trainer.train()
    assert summary.steps == 8  # best at 2, then 4, 6 and 8 without progress
    assert "has not improved" in summary.stop_reason and "3 validations" in summary.stop_reason
    assert summary.best_validation[1] == 2
    assert ("best_validation.pt", 2) in saved and saved[-1] == ("checkpoint.pt", 8)
    assert "stopped: the validation loss has not improved" in summary.line()


def test_a_fixed_length_ignores_the_stopping_rule(tmp_path):
    model, windows, discretizer, cfg = tiny_training(
        max_steps=12, learning_rate=0.0, validate_every=2, patience=1
    )
    trainer = Trainer(
        model,
        windows,
        cfg,
        lambda *a: tmp_path,
        progress=False,
        validation=held_out_windows(discretizer),
    )
    summary = trainer.train()
    assert not trainer.stopping_rule and summary.steps == 12
    assert summary.stop_reason == "all 12 planned steps were taken"
