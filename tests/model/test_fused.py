"""The fused decode step (one Triton kernel per block) against the PyTorch step it replaces."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_gpt, tolerance

from trajectory_transformer.model import GPTConfig, TrajectoryGPT
from trajectory_transformer.model.decode import fused


@pytest.mark.parametrize(
    "width, groups, members, keys, mlp_columns, mlp_rows, value_inputs",
    [
        # Two heads of 8 (padded to 16); rows mix prefixes in a tile.
        (16, 3, 5, 16, 128, 16, False),
        (32, 2, 16, 16, 128, 16, False),  # two heads of 16; each tile of rows continues one prefix
        # Own positions in several tiles of keys split over the programs; the MLP's hidden
        # columns over two programs, their partial outputs summed by the next kernel.
        (16, 3, 5, 2, 32, 16, False),
        # Each token's embedding carries what it decodes to (the model's embedding table).
        (16, 3, 5, 16, 128, 16, True),
        (16, 3, 5, 16, 128, 32, False),  # the MLP over tiles of 32 rows, the others of 16
    ],
)
def test_the_fused_step_writes_and_returns_what_the_pytorch_step_does(
    fused_device, width, groups, members, keys, mlp_columns, mlp_rows, value_inputs, monkeypatch
):
    monkeypatch.setattr(fused, "KEYS", keys)
    monkeypatch.setattr(fused, "MLP_COLUMNS", mlp_columns)
    monkeypatch.setattr(fused, "MLP_ROWS", mlp_rows)
    model = tiny_gpt(
        n_bins=20, sequence_transitions=4, embedding_dim=width, value_inputs=value_inputs
    ).to(fused_device)
    config = model.config
    T, copies = config.transition_dim, 2
    prefix_len = T + config.observation_dim  # a transition and an observation: a value inside
    caches = [
        model.new_shared_prefix_cache(groups, members, groups * members * copies, prefix_len, 2 * T)
        for _ in range(2)
    ]
    context = torch.randint(0, 20, (groups, prefix_len), device=fused_device)
    with torch.no_grad():
        for cache in caches:
            model.prefill(context, cache)
        reference, step = model.static_decoder(caches[0]), fused.decoder(model, caches[1])
        # Own positions past a value token; some steps on one copy of the rows only.
        for i in range(T + 2):
            position = torch.tensor([prefix_len + i], device=fused_device)
            rows = groups * members * (1 if i % 3 == 0 else copies)
            tokens = torch.randint(0, 20, (rows,), device=fused_device)
            torch.testing.assert_close(
                step(tokens, position), reference(tokens, position), **tolerance(fused_device)
            )
    own = [(c.own.keys, c.own.values) for c in caches]
    torch.testing.assert_close(own[1], own[0], **tolerance(fused_device))


def test_the_fused_step_says_why_it_cannot_run(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = tiny_gpt()
    assert "runs on CUDA" in fused.unavailable_reason(model)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "float32" in fused.unavailable_reason(tiny_gpt().double())
    assert "model.eval()" in fused.unavailable_reason(tiny_gpt().train())
    original = TrajectoryGPT(
        GPTConfig(observation_dim=3, action_dim=2, n_bins=7, value_sees_itself=False)
    ).eval()
    assert "value_sees_itself" in fused.unavailable_reason(original)
    with pytest.raises(ValueError, match="SharedPrefixKVCache"):
        fused.decoder(model, model.new_cache(4))
