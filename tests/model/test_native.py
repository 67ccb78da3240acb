"""The native CPU decode attention against the PyTorch reference, and its fallbacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_gpt

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.model import GPTConfig, TrajectoryGPT
from trajectory_transformer.model.decode import native
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
    # Many bins: with few, candidates often repeat, and which of two equal-scoring copies
    # survives would hinge on the float rounding in which the two paths differ.
    model = tiny_gpt(3, 2, 256, sequence_transitions=4, seed=3)
    data = np.random.default_rng(0).normal(size=(500, model.config.transition_dim))
    planner = BeamPlanner(
        model, Discretizer.fit(data, n_bins=256), horizon=2, beam_width=4, context_transitions=1
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


def test_a_failed_build_falls_back_with_a_warning(tmp_path, monkeypatch) -> None:
    import torch.utils.cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("c++: not found")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # no finished build to import
    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failure", None)
    with pytest.warns(RuntimeWarning, match="could not be built.*c\\+\\+: not found"):
        assert native.load() is None
    assert native.kernels() is None  # no second attempt, no second warning
    assert not list(tmp_path.rglob("*.building-*"))  # the failed build's directory is gone
    model = tiny_gpt()
    cache = model.new_shared_prefix_cache(1, 2, 2, prefix_len=4, own_len=4)
    with torch.no_grad():
        model.prefill(torch.zeros(1, 4, dtype=torch.long), cache)
        assert not uses_native(model, cache)
        assert model.decode_step(torch.zeros(2, dtype=torch.long), cache, 4).shape == (2, 7)


def test_weights_are_prepared_once_per_version_of_the_parameters(kernel, monkeypatch) -> None:
    """Plan calls share the transposed weights; an in-place change of a parameter, or a
    `load_state_dict`, makes the next decoder prepare them again and decode with them."""
    model = tiny_gpt(3, 2, 7, sequence_transitions=4, seed=3)
    data = np.random.default_rng(0).normal(size=(500, model.config.transition_dim))
    planner = BeamPlanner(
        model, Discretizer.fit(data, n_bins=7), horizon=2, beam_width=4, context_transitions=1
    )
    prepared = []
    real_prepare = native._prepare
    monkeypatch.setattr(native, "_prepare", lambda model: prepared.append(1) or real_prepare(model))
    observations = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    planner.reset(3)
    planner.plan(observations)
    weights = native.prepared_weights(model)
    planner.plan(observations)
    assert native.prepared_weights(model) is weights and len(prepared) == 1

    def decoded() -> torch.Tensor:
        """Logits of a few decode steps after a prefill, with the current weights."""
        T = model.config.transition_dim
        cache = model.new_shared_prefix_cache(1, 2, 4, prefix_len=T, own_len=T)
        model.prefill(torch.arange(T)[None] % 7, cache)
        step = model.decoder(cache)
        return torch.stack([step(torch.full((4,), i % 7), T + i) for i in range(T - 1)])

    other = tiny_gpt(3, 2, 7, sequence_transitions=4, seed=4)
    with torch.no_grad():
        for change in (
            lambda: model.blocks[0].mlp.c_proj.weight.mul_(torch.linspace(-20, 20, 16)[:, None]),
            lambda: model.blocks[-1].attn.c_attn.weight[-8:].mul_(-30.0),  # values, through a view
            lambda: model.load_state_dict(other.state_dict()),
        ):
            before = decoded()
            change()
            after = decoded()
            assert native.prepared_weights(model) is not weights
            weights = native.prepared_weights(model)
            with native.native_kernels(False):
                torch.testing.assert_close(after, decoded(), atol=1e-5, rtol=0)
            assert (before - after).abs().max() > 1e-3
    assert len(prepared) == 4


@torch.inference_mode()
def test_parameters_made_in_inference_mode_are_prepared_for_each_decoder(kernel) -> None:
    """Such parameters keep no version counter, so nothing tells when they change."""
    model = tiny_gpt()
    assert native.prepared_weights(model) is not native.prepared_weights(model)
    cache = model.new_shared_prefix_cache(1, 2, 2, prefix_len=4, own_len=4)
    model.prefill(torch.zeros(1, 4, dtype=torch.long), cache)
    before = model.decoder(cache)(torch.zeros(2, dtype=torch.long), 4)
    model.blocks[0].mlp.c_proj.weight.mul_(torch.linspace(-20, 20, 16)[:, None])
    after = model.decoder(cache)(torch.zeros(2, dtype=torch.long), 4)
    with native.native_kernels(False):
        torch.testing.assert_close(after, model.decoder(cache)(torch.zeros(2, dtype=torch.long), 4))
    assert (before - after).abs().max() > 1e-3


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


def fake_compiler(monkeypatch, then=None) -> list[str]:
    """`cpp_extension.load` replaced by one that writes a library file into its build directory
    (then runs `then`) and returns that directory; the directories it built in are listed."""
    import torch.utils.cpp_extension

    built = []

    def load(name, sources, build_directory, **kwargs):
        Path(build_directory, f"{name}.so").write_text("ours")
        built.append(build_directory)
        if then is not None:
            then()
        return build_directory

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    return built


def test_a_build_is_published_whole_then_imported(tmp_path, monkeypatch) -> None:
    """A build runs in a directory of its own, renamed into place when it is finished; a later
    process imports it without building. A build killed earlier blocks nothing."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    name = "trajectory_transformer_cpu_test"
    final = native.build_directory(name)
    assert final == tmp_path / "trajectory_transformer" / name
    killed = final.with_name(f"{name}.building-killed")  # what a killed build leaves
    killed.mkdir(parents=True)
    (killed / "lock").touch()
    built = fake_compiler(monkeypatch)
    assert native._build_or_import(name, [], verbose=False) == built[0]
    assert Path(built[0]).parent == final.parent and Path(built[0]) != final
    assert (final / f"{name}.so").read_text() == "ours"
    assert sorted(final.parent.iterdir()) == sorted([final, killed])

    imported = []
    monkeypatch.setattr(native, "_import_library", lambda name, path: imported.append(path))
    native._build_or_import(name, [], verbose=False)
    assert imported == [final / f"{name}.so"] and len(built) == 1  # nothing built again


def test_of_two_builds_at_once_the_first_finished_is_kept(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    name = "trajectory_transformer_cpu_test"
    final = native.build_directory(name)

    def another_process_finishes_first() -> None:
        final.mkdir()
        (final / f"{name}.so").write_text("theirs")

    built = fake_compiler(monkeypatch, then=another_process_finishes_first)
    assert native._build_or_import(name, [], verbose=False) == built[0]  # our own module
    assert (final / f"{name}.so").read_text() == "theirs"  # theirs stays published
    assert list(final.parent.iterdir()) == [final]  # ours is removed


def test_checkouts_of_the_same_source_share_one_build(tmp_path, monkeypatch) -> None:
    """The same source in the same environment gives the same name, so the same build
    directory; another source or another torch, another name. The name says the CPU's
    instruction set."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    names = {}
    for checkout in ("a", "b"):
        source = tmp_path / checkout / "cpu_kernels.cpp"
        source.parent.mkdir()
        source.write_bytes(native.SOURCE.read_bytes())
        monkeypatch.setattr(native, "SOURCE", source)
        names[checkout] = native._build_options()[0]
    assert names["a"] == names["b"]
    capability = torch.backends.cpu.get_cpu_capability().lower()
    assert f"_{capability}_" in names["a"] or "_generic_" in names["a"]
    assert tmp_path / "extensions" in native.build_directory(names["a"]).parents

    monkeypatch.setattr(native.torch, "__version__", "0.0.0+elsewhere")
    assert native._build_options()[0] != names["a"]  # another torch, another build
    monkeypatch.undo()
    monkeypatch.setattr(native, "SOURCE", source)
    source.write_bytes(source.read_bytes() + b"\n// changed\n")
    assert native._build_options()[0] != names["a"]  # another source, another build


def test_the_build_uses_no_fast_math() -> None:
    """IEEE semantics in the kernels: the vector code they need is written out (see csrc)."""
    assert not any("fast-math" in flag for flag in native._build_options()[1])
