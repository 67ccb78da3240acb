import numpy as np
import pytest
import torch

from trajectory_transformer.data.discretizer import Discretizer


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_round_trip_error_is_within_a_bin(strategy):
    rng = np.random.default_rng(0)
    data = np.stack(
        [rng.normal(size=5000), rng.uniform(-3, 7, 5000), rng.exponential(size=5000)], 1
    )
    discretizer = Discretizer.fit(data, n_bins=50, strategy=strategy)
    x = torch.as_tensor(data, dtype=torch.float32)
    tokens = discretizer.encode(x)
    assert tokens.dtype == torch.long and tokens.min() >= 0 and tokens.max() < 50
    decoded = discretizer.decode(tokens)
    # Every value decodes to the centre of the bin that contains it.
    width = discretizer.edges[:, 1:] - discretizer.edges[:, :-1]  # (D, N)
    half_width = torch.gather(width, 1, tokens.T).T / 2
    assert torch.all((decoded - x).abs() <= half_width + 1e-5)
    error = discretizer.reconstruction_error(data)
    assert error.shape == (3,) and np.all(error < 0.02)


def test_uniform_bins_are_equal_width_and_quantile_bins_equal_mass():
    data = np.random.default_rng(1).exponential(size=(10000, 1))
    uniform = Discretizer.fit(data, 10, "uniform")
    widths = uniform.edges[0, 1:] - uniform.edges[0, :-1]
    assert torch.allclose(widths, widths[0].expand_as(widths), rtol=1e-4)
    quantile = Discretizer.fit(data, 10, "quantile")
    counts = torch.bincount(quantile.encode(torch.as_tensor(data)).flatten(), minlength=10)
    assert counts.min() >= 950 and counts.max() <= 1050


def test_out_of_range_values_clip_to_edge_bins():
    data = np.linspace(0, 1, 101)[:, None]
    discretizer = Discretizer.fit(data, 10, "uniform")
    tokens = discretizer.encode(torch.tensor([[-5.0], [0.0], [1.0], [42.0]]))
    assert tokens.flatten().tolist() == [0, 0, 9, 9]


def test_encode_a_subset_of_dimensions():
    data = np.random.default_rng(2).normal(size=(1000, 4))
    discretizer = Discretizer.fit(data, 20)
    x = torch.as_tensor(data[:5], dtype=torch.float32)
    full = discretizer.encode(x)
    assert torch.equal(discretizer.encode(x[:, 1:3], slice(1, 3)), full[:, 1:3])
    assert torch.equal(
        discretizer.decode(full[:, 3:], slice(3, 4)), discretizer.decode(full)[:, 3:]
    )


def test_expectation_and_percentile():
    data = np.linspace(0, 10, 1001)[:, None]
    discretizer = Discretizer.fit(data, 10, "uniform")
    probs = torch.zeros(2, 10)
    probs[0, 2] = 1.0
    probs[1, [1, 8]] = 0.5
    mean = discretizer.expectation(probs, 0)
    torch.testing.assert_close(mean, torch.tensor([2.5, 5.0]))
    low = discretizer.expectation(probs, 0, percentile=0.25)
    torch.testing.assert_close(low, torch.tensor([2.5, 1.5]))


def test_state_dict_round_trip():
    discretizer = Discretizer.fit(np.random.default_rng(3).normal(size=(100, 2)), 8, "uniform")
    clone = Discretizer.from_state_dict(discretizer.state_dict())
    x = torch.randn(7, 2)
    assert torch.equal(clone.encode(x), discretizer.encode(x)) and clone.strategy == "uniform"


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="uniform"):
        Discretizer.fit(np.zeros((3, 1)), 4, "kmeans")
