"""Gaussian targets over the bins (trainer.target_sigma): each target token's distribution
against a plain reference, and the loss that the trainer and the validation compute with it."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import structured_transitions, tiny_training

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.training.loss import GaussianTargets, token_cross_entropy
from trajectory_transformer.training.trainer import Trainer, TrainerConfig

# One dimension of 5 bins of unequal widths: [0, 1), [1, 2), [2, 4), [4, 8), [8, 9].
EDGES = [0.0, 1.0, 2.0, 4.0, 8.0, 9.0]


def reference(centre: float, sigma: float, bins_in_use: int) -> list[float]:
    """A Gaussian's mass over the bins in use, [j, j + 1) on the bin-index axis, renormalised."""
    cdf = [0.5 * (1 + math.erf((j - centre) / (sigma * math.sqrt(2)))) for j in range(6)]
    mass = [cdf[j + 1] - cdf[j] for j in range(bins_in_use)] + [0.0] * (5 - bins_in_use)
    return [m / sum(mass) for m in mass]


def targets_of(values, sigma, effective=5):
    edges = torch.tensor([EDGES])
    discretizer = Discretizer(edges, "uniform", effective_bins=torch.tensor([effective]))
    values = torch.tensor([values], dtype=torch.float32)  # (1, S)
    tokens = discretizer.encode(values[..., None], slice(0, 1))[..., 0]
    dims = torch.zeros(values.shape[1], dtype=torch.long)
    return GaussianTargets(discretizer, sigma, torch.device("cpu"))(tokens, values, dims)[0]


@pytest.mark.parametrize(
    "value, centre",
    [
        (3.0, 2.5),  # halfway into the bin [2, 4): index 2 and a half
        (4.0, 3.0),  # a bin's lower edge
        (8.5, 4.5),  # the middle of the last bin
        (-5.0, 0.0),  # below the range: the first bin's lower edge, as the token clips
        (20.0, 5.0),  # above it: the last bin's upper edge
    ],
)
def test_a_target_is_a_gaussian_over_bin_indices_centred_at_its_value(value, centre):
    for sigma in (0.5, 1.0, 3.0):
        got = targets_of([value], sigma)[0]
        assert got.tolist() == pytest.approx(reference(centre, sigma, 5), abs=1e-6)


def test_bins_out_of_use_get_no_mass():
    got = targets_of([1.5], 2.0, effective=3)[0]
    assert got.tolist() == pytest.approx(reference(1.5, 2.0, 3), abs=1e-6)
    assert got[3:].tolist() == [0.0, 0.0]


def test_a_bin_of_zero_width_centres_its_value_in_its_middle():
    discretizer = Discretizer(torch.tensor([[0.0, 1.0, 1.0, 2.0]]), "uniform")
    targets = GaussianTargets(discretizer, 1.0, torch.device("cpu"))
    got = targets(torch.tensor([[1]]), torch.tensor([[1.0]]), torch.tensor([0]))[0, 0]
    cdf = [0.5 * (1 + math.erf((j - 1.5) / math.sqrt(2))) for j in range(4)]
    mass = [cdf[j + 1] - cdf[j] for j in range(3)]
    assert got.tolist() == pytest.approx([m / sum(mass) for m in mass], abs=1e-6)


def test_a_narrow_gaussian_is_the_token_itself():
    got = targets_of([0.5, 3.0, 6.0], 0.01)
    assert torch.equal(got.argmax(-1), torch.tensor([0, 2, 3]))
    assert got.max(-1).values.tolist() == pytest.approx([1.0] * 3, abs=1e-6)
    logits = torch.randn(1, 3, 5)
    plain = token_cross_entropy(logits, torch.tensor([[0, 2, 3]]))
    soft = token_cross_entropy(logits, torch.tensor([[0, 2, 3]]), got[None])
    assert torch.allclose(plain, soft, atol=1e-5)


def test_a_sigma_is_refused_unless_it_is_a_number_of_bins_at_least_0():
    for sigma in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"trainer\.target_sigma must be"):
            TrainerConfig(target_sigma=sigma)


def test_a_trainer_with_gaussian_targets_refuses_windows_without_values(tmp_path):
    model, windows, _, cfg = tiny_training()  # windows of tokens alone
    with pytest.raises(ValueError, match=r"trainer\.target_sigma.*real_values=True"):
        Trainer(model, windows, replace(cfg, target_sigma=1.0), lambda s: tmp_path / "x")


def test_training_and_validation_use_the_gaussian_targets(tmp_path):
    model, windows, discretizer, cfg = tiny_training(target_sigma=1.0, max_steps=40)
    transitions, lengths = structured_transitions(seed=1)
    held_out = TokenWindows(transitions, lengths, discretizer, 4, real_values=True)

    def trainer(sigma):
        return Trainer(
            model,
            windows,
            replace(cfg, target_sigma=sigma),
            lambda state, name="checkpoint.pt": tmp_path / name,
            progress=False,
            validation=held_out,
        )

    smooth, plain = trainer(1.0), trainer(0.0)
    before = smooth.validate()
    smooth.train()
    after, after_plain = smooth.validate(), plain.validate()
    assert after["val/loss"] < before["val/loss"]
    # The same model: each kind's cross-entropy of its tokens is one number, whatever the
    # targets; the validation loss is the loss each trainer trains on.
    for kind in ("observation", "action", "reward", "value"):
        assert after[f"val/{kind}_ce"] == pytest.approx(after_plain[f"val/{kind}_ce"])
    assert after["val/loss"] != pytest.approx(after_plain["val/loss"], rel=1e-3)
    # By hand: the first validation batch's targets, a Gaussian around each real value.
    tokens, _, values = held_out.batch(torch.arange(4))
    targets = smooth.target_probabilities(tokens, values)
    T = windows.transition_dim
    for b, s in ((0, 0), (3, 5), (2, 10)):
        dim = (s + 1) % T
        edges = discretizer.edges[dim]
        token = int(tokens[b, s + 1])
        low, high = float(edges[token]), float(edges[token + 1])
        inside = np.clip((float(values[b, s + 1]) - low) / (high - low), 0, 1)
        cdf = [0.5 * (1 + math.erf((j - token - inside) / math.sqrt(2))) for j in range(17)]
        mass = np.diff(cdf)
        assert targets[b, s].tolist() == pytest.approx((mass / mass.sum()).tolist(), abs=1e-5)
