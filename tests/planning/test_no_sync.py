"""A plan call never waits on the device: between its prefill and the returned plan, no
operator that forces a host synchronisation on an accelerator runs.

On the CPU nothing waits, so the test records the operators themselves (what
`torch.cuda.set_sync_debug_mode("error")` would refuse on a GPU). It runs the PyTorch decode
path, the one a GPU uses: the native kernels are CPU only and take the position as a host int
(read from a CPU tensor, which waits for nothing), so they are left out.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_beam import SMALL, run_steps, tiny_discretizer, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from trajectory_transformer.model.decode.native import native_kernels
from trajectory_transformer.planning import BeamPlanner

aten = torch.ops.aten
SYNCING = {
    aten._local_scalar_dense.default: ".item(), bool(tensor) or int(tensor)",
    aten.is_nonzero.default: "bool(tensor)",
    aten.nonzero.default: "nonzero (its size depends on the data)",
    aten.masked_select.default: "boolean-mask selection",
    aten.equal.default: "torch.equal (a host bool)",
    aten.repeat_interleave.Tensor: "repeat_interleave with tensor repeats",
}
"""Operators that read device data on the host, and what calls them."""


class SyncRecorder(TorchDispatchMode):
    """Records the operators of `SYNCING`, boolean-mask indexing and copies to the host, from
    the moment `start()` is called."""

    def __init__(self) -> None:
        super().__init__()
        self.recording = False
        self.syncs: list[str] = []

    def start(self) -> None:
        self.recording = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.recording:
            self._check(func, args, kwargs)
        return func(*args, **kwargs)

    def _check(self, func, args, kwargs) -> None:
        if func in SYNCING:
            self.syncs.append(f"{func}: {SYNCING[func]}")
        elif func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(i is not None and i.dtype == torch.bool for i in indices):
                self.syncs.append(f"{func}: boolean-mask indexing")
        elif func in (aten._to_copy.default, aten.copy_.default):
            source = args[1] if func is aten.copy_.default else args[0]
            target = kwargs.get("device") if func is aten._to_copy.default else args[0].device
            to_host = target is not None and torch.device(target).type == "cpu"
            if to_host and source.device.type != "cpu":
                self.syncs.append(f"{func}: a copy to the host")


@pytest.mark.parametrize("deterministic", [True, False], ids=["greedy", "sampled"])
@pytest.mark.parametrize("active", [None, [True, False, True]], ids=["all", "masked"])
def test_a_plan_call_never_syncs_with_the_device(deterministic, active, monkeypatch) -> None:
    planner = BeamPlanner(tiny_model(), tiny_discretizer(), deterministic=deterministic, **SMALL)
    planner.reset(3)
    with native_kernels(False):
        obs = run_steps(planner, 3, dones={1: [2]})  # two history lengths: two searches
        recorder = SyncRecorder()
        prefill = planner.model.prefill

        def recorded_prefill(*args, **kwargs):
            recorder.start()
            return prefill(*args, **kwargs)

        monkeypatch.setattr(planner.model, "prefill", recorded_prefill)
        with recorder:
            plan = planner.plan(obs, None if active is None else np.array(active))
    assert recorder.recording, "the plan call never reached its prefill"
    assert recorder.syncs == []
    assert plan.tokens.shape[0] == 3


def test_the_recorder_sees_what_syncs() -> None:
    x = torch.arange(6.0)
    recorder = SyncRecorder()
    recorder.start()
    with recorder:
        x.sum().item()
        x[x > 2]
        x.nonzero()
        if x.max() > 0:
            pass
    assert len(recorder.syncs) >= 4
