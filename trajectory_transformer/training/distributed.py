"""Data-parallel training across processes, as `torchrun` starts them.

Every process (rank) holds the whole model; each takes its share of every global batch and
DistributedDataParallel averages the gradients. `Distributed` wraps the few collectives the
trainer needs beyond that, so that a single process (`Distributed.single()`) runs the same
code with no process group at all.

Two extra groups, both gloo (CPU) whatever the main backend:
- `control`: per-step decisions (stop now?) and small Python objects (RNG states to save);
  on a CPU group, a decision costs no device synchronisation.
- `waiting`: with a timeout of days, for ranks that wait while rank 0 evaluates the planner.
  The main group's timeout stays short, so a rank that died is reported, not waited for.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

WAIT_FOR_EVALUATION = datetime.timedelta(days=7)


def launched_by_torchrun() -> bool:
    """Whether this process is one of several started by torchrun (or a compatible launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    control: Any = None  # gloo group for decisions and objects
    waiting: Any = None  # gloo group with a long timeout

    @classmethod
    def single(cls) -> Distributed:
        return cls()

    @classmethod
    def from_environment(cls, device: torch.device, timeout_s: float) -> Distributed:
        """Join the process group that torchrun describes in the environment (RANK,
        WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): nccl on CUDA, gloo on the CPU."""
        missing = [
            k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
        ]
        if missing:
            raise RuntimeError(
                f"WORLD_SIZE is {os.environ['WORLD_SIZE']} but {', '.join(missing)} is not set; "
                "start data-parallel training with `torchrun --nproc-per-node=N -m "
                "trajectory_transformer.cli.train ...`"
            )
        rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(local_rank)
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, timeout=timeout)
        control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
        waiting = dist.new_group(backend="gloo", timeout=WAIT_FOR_EVALUATION)
        return cls(rank, dist.get_world_size(), local_rank, control, waiting)

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """This rank's device: its own GPU on a multi-GPU node."""
        if self.active and device.type == "cuda":
            return torch.device("cuda", self.local_rank)
        return device

    def share(self, window_ids: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous part of a global batch (parts differ by at most one)."""
        if not self.active:
            return window_ids
        return torch.tensor_split(window_ids, self.world_size)[self.rank]

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place, on the main group (no host synchronisation)."""
        if self.active:
            dist.all_reduce(tensor)
        return tensor

    def any(self, flag: bool) -> bool:
        """True on every rank if `flag` is True on any."""
        if not self.active:
            return flag
        value = torch.tensor([int(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.control)
        return bool(value.item())

    def gather(self, obj: object) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.active:
            return [obj]
        objects: list = [None] * self.world_size
        dist.all_gather_object(objects, obj, group=self.control)
        return objects

    def from_main(self, obj: object) -> object:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def wait_for_main(self) -> None:
        """Block until rank 0 arrives here too, however long it takes (an evaluation)."""
        if self.active:
            dist.barrier(group=self.waiting)

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()
