"""How torch's CPU worker threads wait between parallel regions, chosen before torch loads.

A planner's decode step on the CPU runs several short parallel regions per layer and token.
By default the OpenMP runtime behind torch (GNU libgomp on Linux) lets a worker that finished
its part spin for a long while (300,000 spins) before it sleeps. On a machine whose cores are
all busy, a spinning worker holds a core that the thread it waits for needs, and each region's
end becomes a wait for the scheduler's next time slice: a plan call that takes a third of a
second alone took tens of seconds next to one other busy process (docs/results/planning-cpu.md).
A worker that sleeps at once (`OMP_WAIT_POLICY=PASSIVE`) avoids that but
pays a wake-up for every region, about 1.3x on a 1-env plan call alone. A short spin keeps
most of both: the next region of a decode step starts within microseconds, while a worker
whose core is wanted elsewhere gives it up almost at once.

The runtime reads these variables once, when torch's libraries are loaded. So importing this
package sets `GOMP_SPINCOUNT=300` (libgomp: spin that many times, then sleep) and
`OMP_WAIT_POLICY=PASSIVE` (what LLVM's libomp, on macOS, understands; libgomp lets the spin
count override it) when the user has set none of the variables that choose a wait, and only
while torch is not imported yet: the package's `__init__` imports this module before anything
that imports torch, and the command-line entry points live inside the package. A program that
imports torch before this package keeps the runtime's default (a long spin); set the two
variables in its environment, or import `trajectory_transformer` first.
`OMP_WAIT_POLICY=ACTIVE` restores unbounded spinning, which a machine with idle cores to spare
may prefer (see docs/results/planning-cpu.md for the cost of each choice).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"
SPIN_COUNT_VARIABLE = "GOMP_SPINCOUNT"
USER_VARIABLES = (WAIT_POLICY_VARIABLE, SPIN_COUNT_VARIABLE, "KMP_BLOCKTIME")
SHORT_SPIN = "300"
"""Spins before a libgomp worker sleeps: alone, as fast as a longer spin within the noise;
next to one busy process, about 2x the time alone (docs/results/planning-cpu.md, "A short spin")."""


def prefer_short_spin() -> str | None:
    """Set a short spin, then sleep (`GOMP_SPINCOUNT=300`, `OMP_WAIT_POLICY=PASSIVE`), unless
    the user chose how threads wait or torch is already loaded.

    Returns the wait this process's OpenMP runtime will use as far as can be told from here:
    `GOMP_SPINCOUNT=<n>` when a spin count is set (by this call or the user), else the user's
    `OMP_WAIT_POLICY`, or None when torch was loaded first (so the runtime's default holds)
    or the user set only `KMP_BLOCKTIME`.
    """
    if not any(name in os.environ for name in USER_VARIABLES):
        if "torch" in sys.modules:  # its OpenMP runtime has read the environment already
            return None
        os.environ[SPIN_COUNT_VARIABLE] = SHORT_SPIN
        os.environ[WAIT_POLICY_VARIABLE] = "PASSIVE"
    if SPIN_COUNT_VARIABLE in os.environ:
        return f"{SPIN_COUNT_VARIABLE}={os.environ[SPIN_COUNT_VARIABLE]}"
    return os.environ.get(WAIT_POLICY_VARIABLE)


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


wait_policy = prefer_short_spin()
"""The wait this import chose or found (see `prefer_short_spin`)."""
