"""How torch's CPU worker threads wait between parallel regions, chosen before torch loads.

A planner's decode step on the CPU runs several short parallel regions per layer and token.
By default the OpenMP runtime behind torch (GNU libgomp on Linux) lets a worker that finished
its part spin for a while before it sleeps. On a machine whose cores are all busy, a spinning
worker holds a core that the thread it waits for needs, and each region's end becomes a wait
for the scheduler's next time slice: a plan call that takes a third of a second alone took
tens of seconds next to one other busy process (BENCHMARKS.md, "Planning next to other
jobs"). With the passive policy a worker sleeps at once and is woken when there is work.

The runtime reads `OMP_WAIT_POLICY` once, when torch's libraries are loaded. So importing this
package sets it to `PASSIVE` when the user has set neither it nor `GOMP_SPINCOUNT`, and only
while torch is not imported yet: the package's `__init__` imports this module before anything
that imports torch, and the command-line entry points live inside the package. A program that
imports torch before this package keeps the runtime's default (spinning); set
`OMP_WAIT_POLICY=PASSIVE` in its environment, or import `trajectory_transformer` first.
`OMP_WAIT_POLICY=ACTIVE` restores spinning, which a machine with idle cores to spare may
prefer (see BENCHMARKS.md for the cost of either).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"
USER_VARIABLES = (WAIT_POLICY_VARIABLE, "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def prefer_passive_wait() -> str | None:
    """Set `OMP_WAIT_POLICY=PASSIVE` unless the user chose a policy or torch is already loaded.

    Returns the policy that this process's OpenMP runtime will use as far as can be told from
    here: the user's `OMP_WAIT_POLICY`, `PASSIVE` when this call set it, or None when torch
    was loaded first (so the runtime's default holds) or the user set only a spin count.
    """
    if any(name in os.environ for name in USER_VARIABLES):
        return os.environ.get(WAIT_POLICY_VARIABLE)
    if "torch" in sys.modules:  # its OpenMP runtime has read the environment already
        return None
    os.environ[WAIT_POLICY_VARIABLE] = "PASSIVE"
    return "PASSIVE"


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask (a `taskset`, a batch scheduler's
    binding), lowered to a cgroup's CPU quota (a container's `--cpus`) where there is one."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks on this platform (macOS)
        count = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return count
    if quota == "max":
        return count
    return max(1, min(count, -(-int(quota) // int(period))))


def fit_threads_to_cpus() -> int:
    """Lower torch's intra-op threads to `available_cpus()` when the user set no thread count.

    The OpenMP runtime already counts only the CPUs of the affinity mask, but not a cgroup's
    quota: in a container limited to fewer CPUs than the machine has, the extra threads only
    wait for each other. Returns the thread count in use.
    """
    import torch

    threads = torch.get_num_threads()
    if "OMP_NUM_THREADS" not in os.environ and threads > available_cpus():
        threads = available_cpus()
        torch.set_num_threads(threads)
    return threads


wait_policy = prefer_passive_wait()
"""The wait policy this import chose or found (see `prefer_passive_wait`)."""
