"""The PyTorch decode step is static: under `torch.compile(fullgraph=True, dynamic=False)` a
whole search traces it once, with no graph break, and plans as the eager step does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo
from test_beam import SMALL, assert_same_plan, run_steps, tiny_discretizer, tiny_model

from trajectory_transformer.model.decode.native import native_kernels
from trajectory_transformer.planning import BeamPlanner


@pytest.mark.parametrize("deterministic", [True, False], ids=["greedy", "sampled"])
def test_a_search_compiles_its_decode_step_once_per_number_of_rows(
    deterministic: bool, monkeypatch
) -> None:
    # aot_eager traces as inductor does (dynamo, then functionalised ATen graphs) without
    # generating code, which would take most of a minute on two cores.
    model, disc = tiny_model(), tiny_discretizer()
    compiled = []

    def compiled_decoder(cache):
        step = torch.compile(
            model.static_decoder(cache), fullgraph=True, dynamic=False, backend="aot_eager"
        )
        compiled.append(step)
        return step

    plans = {}
    for compile in (False, True):
        planner = BeamPlanner(model, disc, deterministic=deterministic, seed=3, **SMALL)
        planner.reset(2)
        with native_kernels(False):
            obs = run_steps(planner, 3)
            if compile:
                torch._dynamo.reset()
                torch._dynamo.utils.counters.clear()
                monkeypatch.setattr(model, "decoder", compiled_decoder)
            plans[compile] = planner.plan(obs)
            if compile:
                # Every position of a search ran one of two graphs: all the candidates' rows,
                # and the beams' rows that decode observations. A second search traces none.
                counters = torch._dynamo.utils.counters
                assert counters["stats"]["unique_graphs"] == 2
                assert counters["aot_autograd"]["total"] == 2
                with torch._dynamo.config.patch(error_on_recompile=True):
                    planner.plan(obs)
    assert len(compiled) == 2  # one group of envs, two searches
    # fullgraph=True leaves no room for a graph break.
    assert not torch._dynamo.utils.counters["graph_break"]
    assert_same_plan(plans[True], plans[False])
    assert np.prod(plans[True].tokens.shape) > 0


def test_the_compiled_step_writes_the_cache_in_place() -> None:
    """The step's key and value writes reach the compiler as writes by index into the whole
    cache buffers. Written through a view of them, functionalisation rebuilds the buffer around
    the view (`select_scatter`, `slice_scatter`) and inductor copies the whole cache back at
    every step: on a GPU that made the compiled step 4.5x slower than the eager one."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def record(graph, example_inputs):
        graphs.append(graph)
        return make_boxed_func(graph.forward)

    model, disc = tiny_model(), tiny_discretizer()

    def compiled_decoder(cache):
        backend = aot_autograd(fw_compiler=record)
        return torch.compile(model.static_decoder(cache), fullgraph=True, backend=backend)

    planner = BeamPlanner(model, disc, seed=3, **SMALL)
    planner.reset(2)
    torch._dynamo.reset()
    with native_kernels(False):
        obs = run_steps(planner, 2)
        model.decoder = compiled_decoder
        planner.plan(obs)
    ops = {node.target for graph in graphs for node in graph.graph.nodes}
    rebuilt = {torch.ops.aten.select_scatter.default, torch.ops.aten.slice_scatter.default}
    assert graphs and not ops & rebuilt
    assert torch.ops.aten.index_put.default in ops


def test_a_compiled_planner_plans_more_numbers_of_envs_than_dynamos_default_limit(
    monkeypatch,
) -> None:
    """Two graphs per number of planned envs: a continuous-batching tail that plans 5, 4, 3,
    2 and 1 envs needs ten, past the 8 that dynamo allows a function by default, where
    fullgraph=True fails instead of falling back."""
    compile = torch.compile

    def traced_only(fn, **kwargs):
        return compile(fn, **kwargs, backend="eager")  # traced, run as traced

    monkeypatch.setattr(torch, "compile", traced_only)
    # Through dynamo's own `patch`: monkeypatch's undo leaves the option unreadable.
    with torch._dynamo.config.patch(recompile_limit=8):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        planner = BeamPlanner(tiny_model(), tiny_discretizer(), decode="compile", seed=1, **SMALL)
        planner.reset(5)
        obs = run_steps(planner, 1)
        for envs in range(5, 0, -1):
            active = np.arange(5) < envs
            plan = planner.plan(obs, active=active)
            assert not plan.tokens[~active].any()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 10


def test_a_compiled_step_lifts_dynamos_limit_only_while_it_runs(monkeypatch) -> None:
    """A planner's compiled steps share one code object, so their shapes count against one
    limit: each call lifts it to dynamo's overall limit, and the user's process keeps its own."""
    from trajectory_transformer.planning.beam import _compile_step

    dynamo = torch._dynamo.config
    seen = []

    def fake_compile(fn, **settings):
        return lambda *args: seen.append(dynamo.recompile_limit) or fn(*args)

    monkeypatch.setattr(torch, "compile", fake_compile)
    before = dynamo.recompile_limit
    step = _compile_step(lambda x: x + 1)
    assert step(torch.ones(1)).item() == 2.0
    assert seen == [dynamo.accumulated_recompile_limit]
    assert dynamo.recompile_limit == before
