"""Work of fixed shapes captured once as a CUDA graph, then replayed.

A planner's decode step is a few dozen small kernels on a few thousand rows, and a search is a
few thousand: on a GPU their launches, not their arithmetic, set the time. `static_decoder`
keeps the same shapes and no host sync at every position (the position lives in a device
tensor), and so does a search whose random numbers are drawn before it, so one capture holds for
every later call over the same buffers. A replay launches the recorded kernels at once, reading
its inputs from fixed buffers and writing its outputs into fixed buffers: what a call returns
is overwritten by the next call, so a caller reads it (or copies it) before it calls again, as
a beam search does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

WARMUP_CALLS = 2
"""Eager calls on a side stream before the capture, as CUDA graphs need (library handles and
workspaces are created outside the graph)."""


class CapturedCall:
    """`fn(*tensors)` replayed from a CUDA graph, `fn` returning a tensor or a tuple of them.

    Captured on the first call, from that call's very inputs: `fn` must give the same result
    when called again on the same inputs (a decode step writes the same keys and values at the
    same position again), so the warm-up calls compute what the call itself must compute and
    capturing costs no foreign writes. Every later call copies its inputs into the graph's
    buffers and replays it. The tensors `fn` reads beside its arguments (weights, cache
    buffers, drawn noise, the cache's device-held prefix length) must keep their storage: the
    graph reads them where they were at capture.
    """

    def __init__(self, fn: Callable, pool: tuple[int, int] | None = None) -> None:
        """`pool` (`torch.cuda.graph_pool_handle()`) lets the graphs of one planner share
        their scratch memory; they replay one at a time on one stream, which makes it safe."""
        self.fn = fn
        self.pool = pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self._inputs: list[torch.Tensor] = []
        self._outputs = None

    def __call__(self, *inputs: torch.Tensor):
        if self.graph is None:
            return self._capture(inputs)
        for static, given in zip(self._inputs, inputs, strict=True):
            if given.shape != static.shape:
                raise ValueError(
                    f"captured for inputs of shape {tuple(static.shape)}, not {tuple(given.shape)}"
                )
            static.copy_(given)
        self.graph.replay()
        return self._outputs

    def _capture(self, inputs: tuple[torch.Tensor, ...]):
        device = inputs[0].device
        if device.type != "cuda":
            raise ValueError(f"a CUDA graph records CUDA work, not work on {device}")
        self._inputs = [x.clone() for x in inputs]
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.fn(*self._inputs)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._outputs = self.fn(*self._inputs)
        self.graph = graph
        graph.replay()  # capturing runs nothing: this is the call's own result
        return self._outputs
