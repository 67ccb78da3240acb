"""The static decode step captured once as a CUDA graph, then replayed for every token.

A planner's decode step is a few dozen small kernels on a few thousand rows: on a GPU their
launches, not their arithmetic, set its time. `static_decoder` keeps the same shapes and no host
sync at every position (the position lives in a device tensor), so one capture holds for a
whole search and for every later search over the same cache buffers and rows. A replay launches
the recorded kernels at once, reading its inputs from fixed buffers and writing the logits into
a fixed buffer: the logits a call returns are overwritten by the next call, so a caller reads
them (or copies them) before it decodes again, as a beam search does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

DecodeStep = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

WARMUP_CALLS = 2
"""Eager calls on a side stream before the capture, as CUDA graphs need (library handles and
workspaces are created outside the graph). The step is idempotent for the same inputs: it
writes the same keys and values at the same position again."""


class CapturedDecodeStep:
    """`step(tokens (R,), position (1,)) -> logits (R, N)` replayed from a CUDA graph.

    Captured on the first call, from that call's very inputs: the warm-up calls compute what
    the call itself must compute, so capturing costs no wasted or foreign cache writes. Every
    later call copies its inputs into the graph's buffers and replays it. The tensors the step
    reads beside its arguments (weights, cache buffers, the cache's device-held prefix length)
    must keep their storage: the graph reads them where they were at capture.
    """

    def __init__(self, step: DecodeStep, pool: tuple[int, int] | None = None) -> None:
        """`pool` (`torch.cuda.graph_pool_handle()`) lets the graphs of one planner share
        their scratch memory; they replay one at a time on one stream, which makes it safe."""
        self.step = step
        self.pool = pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self._tokens: torch.Tensor | None = None
        self._position: torch.Tensor | None = None
        self._logits: torch.Tensor | None = None

    def __call__(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        if self.graph is None:
            return self._capture(tokens, position)
        if tokens.shape != self._tokens.shape:
            raise ValueError(
                f"this step was captured for {self._tokens.shape[0]} rows, not {tokens.shape[0]}"
            )
        self._tokens.copy_(tokens)
        self._position.copy_(position)
        self.graph.replay()
        return self._logits

    def _capture(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        if tokens.device.type != "cuda":
            raise ValueError(f"a CUDA graph records CUDA work, not work on {tokens.device}")
        self._tokens, self._position = tokens.clone(), position.clone()
        current = torch.cuda.current_stream(tokens.device)
        side = torch.cuda.Stream(tokens.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.step(self._tokens, self._position)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._logits = self.step(self._tokens, self._position)
        self.graph = graph
        graph.replay()  # capturing runs nothing: this is the call's own result
        return self._logits
