import numpy as np
import torch

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.windows import TokenWindows


def test_windows_stay_in_their_episode_and_mask_padding():
    lengths = np.array([3, 5])
    transitions = np.arange(8 * 2, dtype=np.float32).reshape(8, 2)
    discretizer = Discretizer.fit(transitions, 16, "uniform")
    windows = TokenWindows(transitions, lengths, discretizer, sequence_transitions=4)
    assert len(windows) == 8
    all_tokens = discretizer.encode(torch.as_tensor(transitions))

    tokens, mask, values = windows.batch(torch.tensor([1, 3, 7]))
    assert values is None
    assert tokens.shape == (3, 8) and mask.shape == (3, 8)
    # Window 1: episode 0 steps 1, 2, then two padded transitions.
    assert torch.equal(tokens[0, :4], all_tokens[1:3].flatten())
    assert mask[0].tolist() == [True] * 4 + [False] * 4
    # Window 3: episode 1 steps 0..3, no padding.
    assert torch.equal(tokens[1], all_tokens[3:7].flatten())
    assert mask[1].all()
    # Window 7: the last step of episode 1, then padding (never the start of another episode).
    assert torch.equal(tokens[2, :2], all_tokens[7])
    assert mask[2].tolist() == [True] * 2 + [False] * 6


def test_tokens_are_stored_in_the_smallest_type_and_batches_come_as_int64():
    transitions = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    lengths = np.array([20, 30])
    for n_bins, stored in [(100, torch.uint8), (256, torch.uint8), (300, torch.int16)]:
        discretizer = Discretizer.fit(transitions, n_bins, "uniform")
        windows = TokenWindows(transitions, lengths, discretizer, sequence_transitions=4)
        assert windows.tokens.dtype == stored
        assert windows.to("cpu") is windows
        ids = torch.tensor([0, 19, 20, 49])
        tokens, mask, _ = windows.batch(ids)
        assert tokens.dtype == torch.int64 and mask.dtype == torch.bool
        expected = discretizer.encode(torch.as_tensor(transitions))
        assert torch.equal(tokens[1, :3], expected[19])  # the top bins survive the narrow type
        assert torch.equal(tokens[3, :3], expected[49])
    # Two bytes a token at 300 bins, not eight: (50 + 2 * 3 padding rows) x 3 tokens.
    assert windows.tokens.nbytes == 56 * 3 * 2
    assert windows.nbytes == windows.tokens.nbytes + 56 + 8 * 50 + 8 * 4
