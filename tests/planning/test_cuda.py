"""The planner on a GPU: plans as on the CPU, every decode path plans the same, a plan call
never waits on the device, and a model trained on CUDA plans on the CPU. All but the first
test need a CUDA device and are skipped elsewhere."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
import torch
from conftest import cuda_only, tiny_training, tiny_training_info
from test_beam import SMALL, assert_same_plan, run_steps, tiny_discretizer, tiny_model

from trajectory_transformer.checkpoint import build_payload, save_atomic
from trajectory_transformer.model.decode.captured import CapturedCall
from trajectory_transformer.planning import BeamPlanner
from trajectory_transformer.training.trainer import Trainer


def test_decode_settings_are_checked_and_nothing_is_captured_on_the_cpu() -> None:
    with pytest.raises(ValueError, match=r"planner\.decode must be eager, compile or fused"):
        BeamPlanner(tiny_model(), tiny_discretizer(), decode="graph", **SMALL)
    with pytest.raises(ValueError, match=r"planner\.cuda_graph must be none, step or search"):
        BeamPlanner(tiny_model(), tiny_discretizer(), cuda_graph="all", **SMALL)
    planner = BeamPlanner(tiny_model(), tiny_discretizer(), cuda_graph="search", **SMALL)
    assert planner.cuda_graph == "none"
    play(planner)
    assert not planner._captures


class ReplayedEagerly:
    """A stand-in for `CapturedCall` off CUDA: keeps its first inputs' buffers, as a graph
    does, and "replays" by calling the function again on them."""

    def __init__(self, fn, pool=None) -> None:
        self.fn, self.inputs, self.graph = fn, None, "captured"

    def __call__(self, *inputs):
        if self.inputs is None:
            self.inputs = [x.clone() for x in inputs]
        for static, given in zip(self.inputs, inputs, strict=True):
            static.copy_(given)
        return self.fn(*self.inputs)


def test_a_captured_search_is_wired_as_the_search_it_replays(monkeypatch) -> None:
    """Off CUDA the capture itself cannot run; what surrounds it can: one capture per envs and
    history length, the noise redrawn into the buffer it reads at every call, the outputs
    handed back as a search's."""
    import trajectory_transformer.planning.beam as beam

    plans = {}
    for path in ("none", "search"):
        planner = BeamPlanner(tiny_model(), tiny_discretizer(), seed=5, **SMALL)
        if path == "search":
            monkeypatch.setattr(beam, "CapturedCall", ReplayedEagerly)
            planner.cuda_graph = "search"
            monkeypatch.setattr(planner, "_pool", lambda: None)
        plans[path], obs = play(planner)
        if path == "search":
            keys = set(planner._captures)
            assert {key[0] for key in keys} == {"search"} and len(keys) > 1  # mixed histories
            planner.plan(obs)
            assert set(planner._captures) == keys
    assert_same_plan(plans["search"], plans["none"])


def play(planner: BeamPlanner, envs: int = 3):
    """A few steps with an episode ending (so that groups of other history lengths and sizes
    are planned), then the plan of the next observation."""
    planner.reset(envs)
    obs = run_steps(planner, 4, {1: [0], 2: [2]})
    return planner.plan(obs), obs


def assert_same_plan_up_to_ties(a, b, atol: float = 1e-4) -> None:
    """The same scores, and the same best plan in every env whose best plan is not within
    rounding of another plan (a greedy search keeps copies of a beam: those are no tie)."""
    a, b = (replace(p, **{f.name: getattr(p, f.name).cpu() for f in fields(p)}) for p in (a, b))
    torch.testing.assert_close(a.scores, b.scores, atol=atol, rtol=0)  # best first, both
    compared = 0
    for env in range(a.tokens.shape[0]):
        best = a.tokens[env, 0]
        others = (a.tokens[env] != best).flatten(1).any(dim=1)  # beams that plan otherwise
        runner_up = a.scores[env][others].max() if others.any() else -float("inf")
        if a.scores[env, 0] - runner_up > 10 * atol:
            assert torch.equal(b.tokens[env, 0], best), f"env {env} plans otherwise"
            torch.testing.assert_close(b.rewards[env, 0], a.rewards[env, 0], atol=atol, rtol=0)
            compared += 1
    assert compared, "every env has a near tie: choose another seed"


@cuda_only
@pytest.mark.parametrize(
    "decode, cuda_graph",
    [
        ("eager", "none"),
        ("eager", "step"),
        ("compile", "search"),
        ("fused", "none"),
        ("fused", "search"),
    ],
)
def test_greedy_plans_on_cuda_equal_the_cpus(decode: str, cuda_graph: str) -> None:
    plans = {}
    for device in ("cpu", "cuda"):
        planner = BeamPlanner(
            tiny_model(),
            tiny_discretizer(),
            device=device,
            deterministic=True,
            decode="eager" if device == "cpu" else decode,
            cuda_graph=cuda_graph,
            **SMALL,
        )
        plans[device] = play(planner)[0]
    assert_same_plan_up_to_ties(plans["cuda"], plans["cpu"])


@cuda_only
@pytest.mark.parametrize("cuda_graph", ["step", "search"])
def test_a_capture_plans_as_the_uncaptured_step_and_is_captured_once_per_shape(cuda_graph: str):
    plans = {}
    for captured in ("none", cuda_graph):
        planner = BeamPlanner(
            tiny_model(), tiny_discretizer(), device="cuda", cuda_graph=captured, seed=5, **SMALL
        )
        plans[captured], obs = play(planner)
        if captured != "none":
            captures = dict(planner._captures)
            kind = {"step": "captured step", "search": "search"}[cuda_graph]
            assert captures and {key[0] for key in captures} == {kind}
            planner.plan(obs)  # replays: nothing captured again
            assert dict(planner._captures) == captures
            calls = [c if isinstance(c, CapturedCall) else c.call for c in captures.values()]
            assert all(call.graph is not None for call in calls)
    # The same kernels on the same draws: equal bit for bit.
    assert_same_plan(plans[cuda_graph], plans["none"])


@cuda_only
@pytest.mark.parametrize("decode", ["eager", "fused"])
@pytest.mark.parametrize("cuda_graph", ["none", "step", "search"])
def test_a_plan_call_never_waits_on_the_gpu(cuda_graph: str, decode: str) -> None:
    planner = BeamPlanner(
        tiny_model(),
        tiny_discretizer(),
        device="cuda",
        decode=decode,
        cuda_graph=cuda_graph,
        **SMALL,
    )
    planner.reset(3)
    obs = run_steps(planner, 2)  # captures what it will replay
    active = np.array([True, False, True])
    planner.plan(obs, active=active)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        plan = planner.plan(obs, active=active)
        planner.plan(obs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert plan.tokens.is_cuda and not plan.tokens[1].any()


@cuda_only
def test_a_model_trained_on_cuda_plans_on_the_cpu(tmp_path) -> None:
    model, windows, discretizer, cfg = tiny_training(device="cuda")
    Trainer(model, windows, replace(cfg, max_steps=5), lambda s: tmp_path, progress=False).train()
    path = save_atomic(
        build_payload(model, discretizer, tiny_training_info(), {"seed": 0}, None),
        tmp_path / "checkpoint.pt",
    )
    plans = {}
    for device in ("cuda", "cpu"):
        planner = BeamPlanner.from_checkpoint(
            path, device=device, deterministic=True, **(SMALL | dict(horizon=2))
        )  # 2 + 2 transitions fit the model's window of 4
        assert planner.model.head_weight.device.type == device
        planner.reset(2)
        observations = np.random.default_rng(0).normal(size=(2, 2)).astype(np.float32)
        plans[device] = planner.plan(observations)
    assert_same_plan_up_to_ties(plans["cuda"], plans["cpu"])
