import warnings

import numpy as np
import pytest
import torch

from trajectory_transformer.data.discretizer import Discretizer


def round_trip(discretizer: Discretizer, values, dim: int = 0) -> np.ndarray:
    x = torch.as_tensor(np.asarray(values, dtype=np.float32)[:, None])
    return discretizer.decode(discretizer.encode(x, slice(dim, dim + 1)), slice(dim, dim + 1))[
        :, 0
    ].numpy()


@pytest.mark.parametrize("bin_values", ["mean", "midpoint"])
@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_every_value_decodes_within_its_bin(strategy, bin_values):
    rng = np.random.default_rng(0)
    data = np.stack(
        [rng.normal(size=5000), rng.uniform(-3, 7, 5000), rng.exponential(size=5000)], 1
    )
    discretizer = Discretizer.fit(data, n_bins=50, strategy=strategy, bin_values=bin_values)
    x = torch.as_tensor(data, dtype=torch.float32)
    tokens = discretizer.encode(x)
    assert tokens.dtype == torch.long and tokens.min() >= 0 and tokens.max() < 50
    decoded = discretizer.decode(tokens)
    low = torch.gather(discretizer.edges, 1, tokens.T).T
    high = torch.gather(discretizer.edges, 1, tokens.T + 1).T
    assert torch.all((low <= decoded) & (decoded <= high))
    assert torch.all((low <= x) & (x <= high))
    if bin_values == "midpoint":  # the original scheme: the bin's centre
        torch.testing.assert_close(decoded, (low + high) / 2)
    error = discretizer.reconstruction_error(data)  # in standard deviations
    assert error.shape == (3,) and np.all(error < 0.05)


def test_tokens_decode_to_the_mean_of_their_training_values():
    data = np.random.default_rng(4).normal(size=(3000, 2))
    discretizer = Discretizer.fit(data, n_bins=20)
    tokens = discretizer.encode(torch.as_tensor(data, dtype=torch.float32)).numpy()
    for dim in range(2):
        for token in range(20):
            inside = data[tokens[:, dim] == token, dim]
            assert len(inside) > 0  # quantile bins: none is empty
            np.testing.assert_allclose(discretizer.values[dim, token], inside.mean(), atol=1e-5)


def test_saturated_actions_decode_to_their_bounds():
    """SAC-like actions pressing against both bounds (35% at +1, a few % at -1)."""
    rng = np.random.default_rng(0)
    actions = np.clip(rng.normal(0.8, 0.5, 10_000), -1, 1)
    assert (actions == 1).mean() > 0.3 and 0.0 < (actions == -1).mean() < 0.05
    fitted = Discretizer.fit(actions[:, None], 100, "quantile")
    np.testing.assert_allclose(round_trip(fitted, [-1.0, 1.0]), [-1.0, 1.0], atol=1e-6)
    # The midpoint scheme carries a full-left action out at two thirds of its strength.
    midpoint = Discretizer.fit(actions[:, None], 100, "quantile", bin_values="midpoint")
    assert round_trip(midpoint, [-1.0])[0] > -0.75
    # Away from the bounds, the round trip stays within the data's spread.
    inner = actions[(actions > -1) & (actions < 1)]
    assert np.abs(round_trip(fitted, inner) - inner).mean() < 0.02 * actions.std()


def test_a_sparse_zero_one_reward_decodes_to_zero_and_one():
    rewards = np.zeros(10_000)
    rewards[np.random.default_rng(1).permutation(10_000)[:1000]] = 1.0
    fitted = Discretizer.fit(rewards[:, None], 100, "quantile")
    np.testing.assert_array_equal(round_trip(fitted, [0.0, 1.0]), [0.0, 1.0])
    assert fitted.effective_bins.tolist() == [2]
    assert fitted.encode(torch.tensor([[0.0], [1.0]])).flatten().tolist() == [0, 1]
    # A prediction that is certainly the zero token expects exactly zero reward.
    certain = torch.zeros(100)
    certain[0] = 1.0
    assert float(fitted.expectation(certain, 0)) == 0.0
    midpoint = Discretizer.fit(rewards[:, None], 100, "quantile", bin_values="midpoint")
    assert round_trip(midpoint, [0.0])[0] > 0.04  # the original scheme: not zero


@pytest.mark.parametrize("strategy", ["quantile", "uniform"])
def test_a_constant_dimension_decodes_exactly(strategy):
    data = np.stack([np.full(500, 3.25), np.random.default_rng(2).normal(size=500)], 1)
    fitted = Discretizer.fit(data, 16, strategy)
    np.testing.assert_array_equal(round_trip(fitted, [3.25]), [3.25])
    assert fitted.reconstruction_error(data)[0] == 0.0
    if strategy == "quantile":
        assert fitted.effective_bins.tolist() == [1, 16]


def test_a_dimension_of_five_values_decodes_each_to_itself():
    levels = np.array([-2.0, 0.0, 0.5, 1.0, 7.0])
    data = np.random.default_rng(3).choice(levels, size=(5000, 1), p=[0.1, 0.6, 0.1, 0.1, 0.1])
    fitted = Discretizer.fit(data, 100, "quantile")
    np.testing.assert_array_equal(round_trip(fitted, levels), levels)
    assert fitted.effective_bins.tolist() == [5]
    assert fitted.reconstruction_error(data)[0] == 0.0
    # Midpoints miss by a good part of a standard deviation: what the summary warns about.
    midpoint = Discretizer.fit(data, 100, "quantile", bin_values="midpoint")
    assert midpoint.reconstruction_error(data)[0] > 0.2


def test_a_uniform_bin_the_data_never_reached_decodes_to_its_midpoint():
    data = np.concatenate([np.linspace(0, 1, 500), np.linspace(9, 10, 500)])[:, None]
    fitted = Discretizer.fit(data, 10, "uniform")
    assert fitted.effective_bins.tolist() == [10]  # uniform bins keep their widths
    for token in range(10):
        inside = data[(fitted.encode(torch.as_tensor(data, dtype=torch.float32)) == token)[:, 0]]
        expected = inside.mean() if len(inside) else 0.5 + token  # [1, 9) hold nothing
        assert float(fitted.values[0, token]) == pytest.approx(expected, abs=1e-5), token


def test_unused_tokens_are_unreachable_and_decode_within_the_data():
    data = np.repeat([[0.0], [1.0], [2.0]], 100, axis=0)
    fitted = Discretizer.fit(data, 8, "quantile")
    assert fitted.effective_bins.tolist() == [3]
    tokens = fitted.encode(torch.tensor([[-100.0], [0.5], [1e9]]))
    assert tokens.max() < 3
    assert torch.isfinite(fitted.values).all() and fitted.values.max() <= 2.0 + 1e-6


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
    values = discretizer.values[0]  # the mean of the data in each bin: 2.495 for [2, 3) ...
    torch.testing.assert_close(values[[1, 2, 8]], torch.tensor([1.495, 2.495, 8.495]))
    mean = discretizer.expectation(probs, 0)
    torch.testing.assert_close(mean, torch.stack([values[2], (values[1] + values[8]) / 2]))
    low = discretizer.expectation(probs, 0, percentile=0.25)
    torch.testing.assert_close(low, values[[2, 1]])


def test_state_dict_round_trip():
    data = np.random.default_rng(3).normal(size=(100, 2)).round(1)  # ties: merged bins
    for discretizer in (Discretizer.fit(data, 8, "uniform"), Discretizer.fit(data, 40)):
        clone = Discretizer.from_state_dict(discretizer.state_dict())
        x = torch.randn(7, 2)
        assert torch.equal(clone.encode(x), discretizer.encode(x))
        assert torch.equal(clone.decode(clone.encode(x)), discretizer.decode(discretizer.encode(x)))
        assert clone.strategy == discretizer.strategy and clone.bin_values == "mean"


def test_an_edges_only_state_decodes_to_midpoints_as_before():
    """The discretizer state of format-1 checkpoints: edges and strategy alone."""
    edges = torch.tensor([[0.0, 1.0, 1.0, 1.0, 4.0]])
    old = Discretizer.from_state_dict({"edges": edges, "strategy": "quantile"})
    assert old.bin_values == "midpoint" and old.effective_bins.tolist() == [4]
    x = torch.tensor([[-1.0], [0.5], [1.0], [3.0], [9.0]])
    # As the earlier code did: searchsorted over the inner edges, then bin centres.
    tokens = torch.searchsorted(edges[:, 1:-1], x.T.contiguous(), right=True).T
    assert torch.equal(old.encode(x), tokens)
    centres = 0.5 * (edges[0, 1:] + edges[0, :-1])
    assert torch.equal(old.decode(old.encode(x))[:, 0], centres[tokens[:, 0]])


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="uniform"):
        Discretizer.fit(np.zeros((3, 1)), 4, "kmeans")


# --- rare modes far from the bulk keep bins of their own ---------------------------------


def falls(count: int, seed: int = 0) -> np.ndarray:
    """100,000 rewards near 3 (a hopper's gait) and `count` falls near -97 (reward - 100)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(3.0, 0.7, 100_000), rng.normal(-97.0, 1.0, count)])


def one_hot(token: int, n_bins: int = 100) -> torch.Tensor:
    probs = torch.zeros(n_bins)
    probs[token] = 1.0
    return probs


@pytest.mark.parametrize("count", [192, 20, 2])
def test_rare_falls_decode_to_their_own_mean(count):
    rewards = falls(count)
    fitted = Discretizer.fit(rewards[:, None], 100, "quantile")
    assert abs(round_trip(fitted, [-97.0])[0] - (-97.0)) < 1.0
    token = int(fitted.encode(torch.tensor([[-97.0]]))[0, 0])
    assert abs(float(fitted.expectation(one_hot(token), 0)) - (-97.0)) < 1.0
    (mode,) = fitted.rare_modes(rewards[:, None], 0)
    assert mode.count == count and -103 < mode.low <= mode.high < -90
    np.testing.assert_allclose(mode.decoded_mean, mode.mean, rtol=1e-5)
    np.testing.assert_allclose(mode.mean, rewards[100_000:].mean(), rtol=1e-6)
    # The bulk loses one bin at most: its round trip stays as fine as before.
    bulk = rewards[:100_000]
    assert np.abs(round_trip(fitted, bulk) - bulk).mean() < 0.02 * bulk.std()


def test_without_the_rare_bin_a_fall_decodes_to_a_fraction_of_itself():
    """What the rare bin prevents: the original's bin midpoints average the fall with the
    bulk's lowest rewards."""
    rewards = falls(20)
    midpoint = Discretizer.fit(rewards[:, None], 100, "quantile", bin_values="midpoint")
    assert round_trip(midpoint, [-97.0])[0] > -60


def test_a_sparse_reward_with_one_in_a_thousand_ones():
    rewards = np.zeros(100_000)
    rewards[np.random.default_rng(5).permutation(100_000)[:100]] = 1.0
    fitted = Discretizer.fit(rewards[:, None], 100, "quantile")
    np.testing.assert_array_equal(round_trip(fitted, [0.0, 1.0]), [0.0, 1.0])
    token = int(fitted.encode(torch.tensor([[1.0]]))[0, 0])
    assert float(fitted.expectation(one_hot(token), 0)) == 1.0
    (mode,) = fitted.rare_modes(rewards[:, None], 0)
    assert (mode.count, mode.mean, mode.decoded_mean) == (100, 1.0, 1.0)


def test_a_rare_spread_goal_bonus_among_small_dense_rewards():
    rng = np.random.default_rng(6)
    rewards = np.concatenate([rng.uniform(-0.1, 0.0, 50_000), 10.0 + rng.uniform(0, 0.5, 30)])
    fitted = Discretizer.fit(rewards[:, None], 100, "quantile")
    (mode,) = fitted.rare_modes(rewards[:, None], 0)
    assert mode.count == 30 and abs(mode.decoded_mean - mode.mean) < 1e-5
    assert abs(round_trip(fitted, [10.2])[0] - mode.mean) < 0.5


def test_no_bin_spans_the_gap_of_a_bimodal_column():
    rng = np.random.default_rng(7)
    column = np.concatenate([rng.normal(-5, 0.5, 50_000), rng.normal(5, 0.5, 50_000)])
    fitted = Discretizer.fit(column[:, None], 100, "quantile")
    values = fitted.values[0, : int(fitted.effective_bins[0])]
    assert not ((values > -2.5) & (values < 2.5)).any()  # nothing decodes into the gap
    decoded = round_trip(fitted, column)
    assert (np.sign(decoded) == np.sign(column)).all()  # every value stays in its mode
    assert np.abs(decoded - column).mean() < 0.02  # 4% of a mode's spread
    assert fitted.rare_modes(column[:, None], 0) == []  # both modes are common


def test_columns_without_far_gaps_keep_their_plain_quantile_edges():
    rng = np.random.default_rng(8)
    for column in (rng.normal(size=20_000), rng.exponential(size=20_000)):
        fitted = Discretizer.fit(column[:, None], 50, "quantile")
        plain = np.quantile(column.astype(np.float32).astype(np.float64), np.linspace(0, 1, 51))
        np.testing.assert_allclose(fitted.edges[0].numpy(), plain.astype(np.float32), rtol=1e-6)
        assert fitted.rare_modes(column[:, None], 0) == []


def ladder(levels: range, count: int = 20, seed: int = 9) -> np.ndarray:
    """100,000 small rewards `0.3 |N(0, 1)|` and `count` values at each of `levels`: a bonus
    ladder, the levels far from the bulk and from each other."""
    bulk = 0.3 * np.abs(np.random.default_rng(seed).normal(size=100_000))
    return np.concatenate([bulk, *(np.full(count, float(level)) for level in levels)])


def test_a_ladder_of_rare_levels_keeps_every_level_apart():
    rewards = ladder(range(10, 160, 10))
    fitted = Discretizer.fit(rewards[:, None], 100, "quantile")
    for level in range(10, 160, 10):
        assert abs(round_trip(fitted, [float(level)])[0] - level) < 1.0
    top = np.quantile(rewards[:100_000], 0.995)  # the bulk's own tail stays with the bulk
    assert abs(round_trip(fitted, [top])[0] - top) < 0.1
    modes = fitted.rare_modes(rewards[:, None], 0)
    assert [mode.mean for mode in modes] == [float(level) for level in range(10, 160, 10)]
    assert all(mode.count == 20 and mode.decoded_mean == mode.mean for mode in modes)


def test_two_rare_clusters_on_one_side_keep_their_own_bins():
    rng = np.random.default_rng(10)
    rewards = np.concatenate(
        [rng.normal(3.0, 0.7, 100_000), rng.normal(-97.0, 1.0, 20), rng.normal(-197.0, 1.0, 20)]
    )
    fitted = Discretizer.fit(rewards[:, None], 100, "quantile")
    for cluster in (-97.0, -197.0):
        assert abs(round_trip(fitted, [cluster])[0] - cluster) < 2.0
    modes = fitted.rare_modes(rewards[:, None], 0)
    assert [mode.count for mode in modes] == [20, 20]
    for mode in modes:
        np.testing.assert_allclose(mode.decoded_mean, mode.mean, rtol=1e-5)


@pytest.mark.parametrize("draw", ["student_t_5", "lognormal", "exponential"])
def test_a_heavy_tailed_continuous_column_is_not_split(draw):
    rng = np.random.default_rng(11)
    column = {
        "student_t_5": lambda: rng.standard_t(5, 100_000),
        "lognormal": lambda: rng.lognormal(0.0, 1.0, 100_000),
        "exponential": lambda: rng.exponential(size=100_000),
    }[draw]()
    fitted = Discretizer.fit(column[:, None], 100, "quantile")
    assert fitted.mode_cuts == [[]]
    plain = np.quantile(column.astype(np.float32).astype(np.float64), np.linspace(0, 1, 101))
    np.testing.assert_allclose(fitted.edges[0].numpy(), plain.astype(np.float32), rtol=1e-6)


def test_more_far_levels_than_bins_can_spare_keep_the_widest_and_say_so():
    """100 bins keep 25 cuts: of 40 levels 10 apart and 20 values each, the widest gaps
    relative to their spread win (all alike here); the others share bins, and fit warns with
    a number of bins that keeps them all."""
    rewards = ladder(range(10, 410, 10))
    with pytest.warns(UserWarning, match=r"dimension 0 has 41 modes.*n_bins=160 keeps them all"):
        fitted = Discretizer.fit(rewards[:, None], 100, "quantile")
    assert len(fitted.mode_cuts[0]) == 25
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enough = Discretizer.fit(rewards[:, None], 160, "quantile")
    for level in range(10, 410, 10):
        assert abs(round_trip(enough, [float(level)])[0] - level) < 1.0


def test_the_report_reads_the_cuts_fit_made():
    rewards = falls(20)
    uniform = Discretizer.fit(rewards[:, None], 100, "uniform")
    assert uniform.mode_cuts == [[]] and uniform.rare_modes(rewards[:, None], 0) == []
    fitted = Discretizer.fit(rewards[:, None], 100, "quantile")
    restored = Discretizer.from_state_dict(fitted.state_dict())
    assert restored.mode_cuts == fitted.mode_cuts and len(fitted.mode_cuts[0]) == 1
    assert restored.rare_modes(rewards[:, None], 0) == fitted.rare_modes(rewards[:, None], 0)
    older = fitted.state_dict()
    del older["mode_cuts"]  # a checkpoint before format 3: the cuts are not known
    assert Discretizer.from_state_dict(older).rare_modes(rewards[:, None], 0) == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_data_is_refused_naming_where(bad):
    data = np.random.default_rng(12).normal(size=(100, 3))
    data[37, 2] = bad
    with pytest.raises(ValueError, match=r"1 non-finite values.*dimension 2 at row 37"):
        Discretizer.fit(data, 10)
