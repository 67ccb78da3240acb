"""The PyTorch decode step is static: under `torch.compile(fullgraph=True, dynamic=False)` a
whole search traces it once, with no graph break, and plans as the eager step does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo
from test_beam import SMALL, assert_same_plan, run_steps, tiny_discretizer, tiny_model

from trajectory_transformer.model.native import native_kernels
from trajectory_transformer.planning import BeamPlanner


@pytest.mark.parametrize("deterministic", [True, False], ids=["greedy", "sampled"])
def test_a_search_compiles_its_decode_step_once(deterministic: bool, monkeypatch) -> None:
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
        with native_kernels(False), torch._dynamo.config.patch(error_on_recompile=True):
            obs = run_steps(planner, 3)
            if compile:
                torch._dynamo.reset()
                torch._dynamo.utils.counters.clear()
                monkeypatch.setattr(model, "decoder", compiled_decoder)
            plans[compile] = planner.plan(obs)
    assert len(compiled) == 1  # one group of envs, one search
    # Every position of the search ran one graph (a recompile would have raised above), and
    # fullgraph=True leaves no room for a graph break.
    counters = torch._dynamo.utils.counters
    assert counters["stats"]["unique_graphs"] == 1 and counters["aot_autograd"]["total"] == 1
    assert not counters["graph_break"]
    assert_same_plan(plans[True], plans[False])
    assert np.prod(plans[True].tokens.shape) > 0
