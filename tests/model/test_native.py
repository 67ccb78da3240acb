"""The native CPU decode attention against the PyTorch reference, and its fallbacks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_gpt

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.model import GPTConfig, TrajectoryGPT, native
from trajectory_transformer.model.gpt import trajectory_attention_mask
from trajectory_transformer.model.kv_cache import RowLayout, shared_prefix_attention
from trajectory_transformer.planning import BeamPlanner


def uses_native(model, cache) -> bool:
    """Whether `model.decoder(cache)` takes the native kernels."""
    return native.decoder(model, cache, module_step=None) is not None


@pytest.fixture(scope="module")
def kernel(native_module):
    return native_module.decode_attention


def reference(qkv, prefix_k, prefix_v, own_k, own_v, layout, P, t, T):
    """shared_prefix_attention on the same inputs, with the model's mask row of the query."""
    R, heads, hs = qkv.shape[0], own_k.shape[1], own_k.shape[3]
    q, k, v = qkv.view(R, 3, heads, 1, hs).unbind(1)  # (R, nh, 1, hs) each
    keys, values = own_k[:R].clone(), own_v[:R].clone()
    keys[:, :, t : t + 1], values[:, :, t : t + 1] = k, v
    mask = trajectory_attention_mask(P + t + 1, T)[-1:]  # (1, P + t + 1)
    bias = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
    y = shared_prefix_attention(
        q,
        prefix_k[: layout.groups, :, :P],
        prefix_v[: layout.groups, :, :P],
        keys[:, :, : t + 1],
        values[:, :, : t + 1],
        bias,
        layout,
    )
    return y.transpose(1, 2).reshape(R, heads * hs), keys, values


@pytest.mark.parametrize(
    "groups, members, copies, heads, head_size, T, P, t",
    [
        (1, 4, 2, 4, 32, 25, 142, 60),  # HalfCheetah-shaped: 5 transitions + an observation
        (3, 2, 2, 2, 16, 7, 10, 0),  # the first planned token
        (2, 3, 1, 2, 64, 7, 7, 6),  # the query is a value token: it sees itself
        (2, 2, 3, 3, 8, 5, 4, 11),  # generic head size; hidden keys in both parts
        (1, 1, 1, 1, 12, 4, 1, 2),
    ],
)
def test_kernel_matches_reference_and_writes_the_cache(
    kernel, groups, members, copies, heads, head_size, T, P, t
) -> None:
    g = torch.Generator().manual_seed(P + t)
    R, C = groups * members * copies, heads * head_size
    qkv = torch.randn(R, 3 * C, generator=g)
    prefix_k = torch.randn(groups + 1, heads, P + 2, head_size, generator=g)  # spare capacity
    prefix_v = torch.randn(groups + 1, heads, P + 2, head_size, generator=g)
    own_k = torch.randn(R + 2, heads, t + 3, head_size, generator=g)
    own_v = torch.randn(R + 2, heads, t + 3, head_size, generator=g)
    before_k, before_v = own_k.clone(), own_v.clone()
    layout = RowLayout(groups, members)
    expected, keys, values = reference(qkv, prefix_k, prefix_v, own_k, own_v, layout, P, t, T)
    group_of_row = layout.group_of_rows(R + 2)  # as the cache hands it over: for every row
    out = kernel(qkv, prefix_k, prefix_v, own_k, own_v, group_of_row, P, t, T)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)
    # The new key and value are written at own position t of rows [0, R); nothing else moves.
    assert torch.equal(own_k[:R], keys) and torch.equal(own_v[:R], values)
    assert torch.equal(own_k[R:], before_k[R:]) and torch.equal(own_v[R:], before_v[R:])


def test_kernel_checks_its_inputs(kernel) -> None:
    qkv = torch.randn(4, 3 * 16)
    prefix = torch.randn(1, 2, 5, 8)
    own = torch.randn(4, 2, 6, 8)
    groups = torch.zeros(4, dtype=torch.long)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        kernel(qkv.double(), prefix, prefix, own, own, groups, 5, 0, 7)
    with pytest.raises(RuntimeError, match="a group for every row"):
        kernel(qkv, prefix, prefix, own, own, groups[:3], 5, 0, 7)
    with pytest.raises(RuntimeError, match="names prefix row 1"):
        kernel(qkv, prefix, prefix, own, own, torch.tensor([0, 0, 1, 0]), 5, 0, 7)
    with pytest.raises(RuntimeError, match="outside the cache"):
        kernel(qkv, prefix, prefix, own, own, groups, 5, 6, 7)


@torch.no_grad()
def test_decode_step_native_equals_the_module_path(kernel) -> None:
    torch.manual_seed(0)
    config = GPTConfig(3, 2, 9, sequence_transitions=4, n_layer=2, n_head=2, embedding_dim=64)
    model = TrajectoryGPT(config).eval()
    T, members, copies = config.transition_dim, 3, 2
    g = torch.Generator().manual_seed(1)
    context = torch.randint(0, 9, (2, T + 3), generator=g)
    planned = torch.randint(0, 9, (2 * members * copies, 2 * T), generator=g)
    caches = {}
    logits = {}
    for use_native in (True, False):
        cache = model.new_shared_prefix_cache(2, members, 12, prefix_len=T + 3, own_len=2 * T)
        model.prefill(context, cache)
        with native.native_kernels(use_native):
            assert uses_native(model, cache) == use_native
            logits[use_native] = torch.stack(
                [
                    model.decode_step(planned[:, i], cache, T + 3 + i)
                    for i in range(2 * T - 3)  # crosses planned value tokens
                ]
            )
        caches[use_native] = cache
    torch.testing.assert_close(logits[True], logits[False], atol=1e-5, rtol=0)
    own = [caches[flag].own for flag in (True, False)]
    torch.testing.assert_close(own[0].keys, own[1].keys, atol=1e-6, rtol=0)
    torch.testing.assert_close(own[0].values, own[1].values, atol=1e-6, rtol=0)


def test_native_path_only_for_cpu_inference(kernel) -> None:
    model = tiny_gpt()
    cache = model.new_shared_prefix_cache(1, 2, 2, prefix_len=4, own_len=4)
    with torch.no_grad():
        model.prefill(torch.zeros(1, 4, dtype=torch.long), cache)
        assert uses_native(model, cache)
        assert not uses_native(model, model.new_cache(2))  # no shared prefix
        with native.native_kernels(False):
            assert not uses_native(model, cache)
    assert not uses_native(model, cache)  # autograd on: the module path
    model.train()
    with torch.no_grad():
        assert not uses_native(model, cache)


def test_planner_plans_alike_with_and_without_native(kernel) -> None:
    model = tiny_gpt(3, 2, 7, sequence_transitions=4, seed=3)
    data = np.random.default_rng(0).normal(size=(500, model.config.transition_dim))
    planner = BeamPlanner(
        model, Discretizer.fit(data, n_bins=7), horizon=2, beam_width=4, context_transitions=1
    )
    observations = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    plans = {}
    for use_native in (True, False):
        planner.reset(3)
        with native.native_kernels(use_native):
            planner.act(observations)  # one real transition of context, then a sampled plan
            planner.observe(np.ones(3), np.zeros(3, dtype=bool))
            plans[use_native] = planner.plan(observations)
    assert torch.equal(plans[True].tokens, plans[False].tokens)
    torch.testing.assert_close(plans[True].scores, plans[False].scores, atol=1e-5, rtol=0)


def test_a_failed_build_falls_back_with_a_warning(monkeypatch) -> None:
    import torch.utils.cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("c++: not found")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failure", None)
    with pytest.warns(RuntimeWarning, match="could not be built.*c\\+\\+: not found"):
        assert native.load() is None
    assert native.kernels() is None  # no second attempt, no second warning
    model = tiny_gpt()
    cache = model.new_shared_prefix_cache(1, 2, 2, prefix_len=4, own_len=4)
    with torch.no_grad():
        model.prefill(torch.zeros(1, 4, dtype=torch.long), cache)
        assert not uses_native(model, cache)
        assert model.decode_step(torch.zeros(2, dtype=torch.long), cache, 4).shape == (2, 7)


@torch.no_grad()
def test_native_decoder_refuses_what_the_cache_cannot_hold(kernel) -> None:
    model = tiny_gpt()  # window of 3 transitions of 7 tokens
    cache = model.new_shared_prefix_cache(1, 2, 4, prefix_len=4, own_len=3)
    model.prefill(torch.zeros(1, 4, dtype=torch.long), cache)
    step = model.decoder(cache)
    assert step(torch.zeros(4, dtype=torch.long), 4).shape == (4, 7)
    with pytest.raises(ValueError, match="whole copies"):
        step(torch.zeros(3, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="past the cache"):
        step(torch.zeros(2, dtype=torch.long), 7)
    with pytest.raises(ValueError, match="not after the shared prefix"):
        step(torch.zeros(2, dtype=torch.long), 3)


def test_a_stale_build_lock_is_removed(tmp_path, monkeypatch) -> None:
    import os
    import time

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    name = "trajectory_transformer_decode_test"
    from torch.utils import cpp_extension

    lock = os.path.join(cpp_extension._get_build_directory(name, verbose=False), "lock")
    open(lock, "w").close()
    native._clear_stale_lock(name)  # fresh: another build may hold it
    assert os.path.exists(lock)
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="stale build lock"):
        native._clear_stale_lock(name)
    assert not os.path.exists(lock)


def test_checkouts_of_the_same_source_share_one_build(tmp_path, monkeypatch) -> None:
    """torch's build file names its source by path: each checkout compiling its own copy would
    rebuild whenever another had built last. The same source in the same environment gives the
    same name and path; another source or another torch, another name."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    paths = {}
    for checkout in ("a", "b"):
        source = tmp_path / checkout / "cpu_kernels.cpp"
        source.parent.mkdir()
        source.write_bytes(native.SOURCE.read_bytes())
        monkeypatch.setattr(native, "SOURCE", source)
        name, _ = native._build_options()
        paths[checkout] = (name, native._source_in_build_directory(name))
    assert paths["a"] == paths["b"]
    copy = paths["a"][1]
    assert copy.read_bytes() == source.read_bytes() and tmp_path / "extensions" in copy.parents
    written = copy.stat().st_mtime_ns
    native._source_in_build_directory(paths["a"][0])
    assert copy.stat().st_mtime_ns == written  # untouched, so ninja has nothing to redo

    monkeypatch.setattr(native.torch, "__version__", "0.0.0+elsewhere")
    assert native._build_options()[0] != paths["a"][0]  # another torch, another build
    monkeypatch.undo()
    monkeypatch.setattr(native, "SOURCE", source)
    source.write_bytes(source.read_bytes() + b"\n// changed\n")
    assert native._build_options()[0] != paths["a"][0]  # another source, another build
