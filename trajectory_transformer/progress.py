"""Progress of a long loop: a tqdm bar on a terminal, a plain line every so often elsewhere.

A bar redraws itself with carriage returns, which a terminal overwrites and a log file keeps:
output sent to a file (SLURM, `nohup`, CI) would get a line per update. So where stderr is
not a terminal, progress is a plain line every `TT_PROGRESS_SECONDS` seconds (default 30),
and one when the loop ends.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from tqdm.auto import tqdm

PLAIN_INTERVAL_SECONDS = 30.0
INTERVAL_VARIABLE = "TT_PROGRESS_SECONDS"


def format_duration(seconds: float) -> str:
    """`1h05m`, `12m30s` or `45s`: how a progress line names a duration."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class PlainProgress:
    """The parts of tqdm's interface that the loops use (`update`, `set_postfix`, `total`,
    `refresh`, `close`), written as whole lines: `desc: n/total (p%) | elapsed, ~left left |
    key=value ...` at most once per `interval` seconds."""

    def __init__(
        self,
        total: int | None = None,
        desc: str = "",
        initial: int = 0,
        interval: float = PLAIN_INTERVAL_SECONDS,
        stream: TextIO | None = None,
    ) -> None:
        self.total, self.desc, self.n = total, desc, initial
        self.interval = interval
        self.stream = stream if stream is not None else sys.stderr
        self._initial = initial
        self._start = self._last = time.monotonic()
        self._postfix: dict[str, str] = {}
        self._closed = False
        self._printed_at_n: int | None = None

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last >= self.interval:
            self._print()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **fields) -> None:
        self._postfix = {str(k): str(v) for k, v in {**(ordered_dict or {}), **fields}.items()}

    def refresh(self) -> None:
        """A bar redraws here; a log gets its line on the interval only."""

    def close(self) -> None:
        if not self._closed and self._printed_at_n != self.n:
            self._print()
        self._closed = True

    def line(self) -> str:
        elapsed = time.monotonic() - self._start
        count = f"{self.n}"
        timing = f"{format_duration(elapsed)} elapsed"
        if self.total:
            count += f"/{self.total} ({100 * self.n / self.total:.0f}%)"
            done = self.n - self._initial
            if done > 0 and self.n < self.total:
                timing += f", ~{format_duration(elapsed / done * (self.total - self.n))} left"
        fields = " ".join(f"{k}={v}" for k, v in self._postfix.items())
        return " | ".join(part for part in (f"{self.desc}: {count}", timing, fields) if part)

    def _print(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self._last = time.monotonic()
        self._printed_at_n = self.n


def progress_bar(
    total: int | None = None, desc: str = "", initial: int = 0, disable: bool = False
) -> tqdm | PlainProgress:
    """A tqdm bar when stderr is a terminal, else plain lines (`PlainProgress`)."""
    if disable or sys.stderr.isatty():
        return tqdm(total=total, initial=initial, desc=desc, disable=disable, dynamic_ncols=True)
    interval = os.environ.get(INTERVAL_VARIABLE)
    try:
        seconds = PLAIN_INTERVAL_SECONDS if interval is None else float(interval)
    except ValueError:
        raise ValueError(
            f"{INTERVAL_VARIABLE}={interval!r} is not a number of seconds; unset it, or set "
            "e.g. TT_PROGRESS_SECONDS=60"
        ) from None
    return PlainProgress(total, desc, initial, interval=seconds)
