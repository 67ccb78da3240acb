"""Ctrl-C or SIGTERM during a training loop, the same for the model's trainer and the
critic's: a checkpoint never holds half a step."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_LINE = "stopping after this step to write a checkpoint (Ctrl-C again: at once)"
TERMINATE_LINE = "terminated (SIGTERM): stopping after this step to write a checkpoint"


class StopRequests:
    """Ctrl-C between a training loop's steps. The first asks the loop to stop after the step
    in progress (`requested`; the loop then saves), or, given `divert` (the line it prints),
    asks for something else that the loop reads in `diverted` (a cooldown, say). A second
    stops at once (KeyboardInterrupt), except while an update is being applied (`applying`),
    which is finished first. SIGTERM (a cluster's scheduler ending or preempting the job, a
    container stopping) always asks for the stop, never the diversion: the process has
    seconds left. `announce`: print (one rank of several prints)."""

    def __init__(self, divert: str | None = None, announce: bool = True) -> None:
        self.requested = False
        self.diverted = False
        self.divert = divert
        self.announce = announce
        self._applying = False
        self._abort_after_update = False

    def request(self) -> None:
        """Stop after the step in progress, as a first Ctrl-C does."""
        self.requested = True

    def handle(self, signum: int | None = None, frame: object = None) -> None:
        """The SIGINT handler."""
        self._ask(self.divert, STOP_LINE)

    def terminate(self, signum: int | None = None, frame: object = None) -> None:
        """The SIGTERM handler: the stop, never the diversion."""
        self._ask(None, TERMINATE_LINE)

    def _ask(self, divert: str | None, stop_line: str) -> None:
        """A first request asks for `divert` (where given) or for the stop, printing what it
        asked; a later one stops at once, or after the update being applied."""
        if not (self.requested or (divert is not None and self.diverted)):
            if divert is not None:
                self.diverted = True
                line = divert
            else:
                self.requested = True
                line = stop_line
            if self.announce:
                print(f"\n{line}", file=sys.stderr, flush=True)
        elif self._applying:
            self._abort_after_update = True
        else:
            raise KeyboardInterrupt

    def install(self) -> dict[int, Callable | int | None] | None:
        """Handle SIGINT and SIGTERM from now on; returns the handlers replaced (None off the
        main thread, where Python delivers no signals)."""
        if threading.current_thread() is not threading.main_thread():
            return None
        return {
            signal.SIGINT: signal.signal(signal.SIGINT, self.handle),
            signal.SIGTERM: signal.signal(signal.SIGTERM, self.terminate),
        }

    @staticmethod
    def restore(previous: dict[int, Callable | int | None] | None) -> None:
        """Give SIGINT and SIGTERM back to the handlers that `install` replaced."""
        for number, handler in (previous or {}).items():
            if handler is not None:
                signal.signal(number, handler)

    @contextmanager
    def installed(self) -> Iterator[None]:
        previous = self.install()
        try:
            yield
        finally:
            self.restore(previous)

    @contextmanager
    def applying(self) -> Iterator[None]:
        """An update applied as a unit: a second Ctrl-C meanwhile takes effect after it."""
        self._applying = True
        try:
            yield
        finally:
            self._applying = False
        if self._abort_after_update:
            self._abort_after_update = False
            raise KeyboardInterrupt
