"""Ctrl-C and SIGTERM in a training loop, shared by the model's trainer and the critic's."""

from __future__ import annotations

import pytest

from trajectory_transformer.training.interrupts import STOP_LINE, TERMINATE_LINE, StopRequests


def test_the_first_ctrl_c_asks_for_a_stop_and_the_second_stops_at_once(capsys):
    stops = StopRequests()
    stops.handle()
    assert stops.requested and not stops.diverted
    assert capsys.readouterr().err == f"\n{STOP_LINE}\n"
    with pytest.raises(KeyboardInterrupt):
        stops.handle()


def test_a_second_ctrl_c_during_an_update_takes_effect_after_it():
    stops, applied = StopRequests(announce=False), []
    stops.request()  # as a first Ctrl-C does
    with pytest.raises(KeyboardInterrupt), stops.applying():
        stops.handle()
        applied.append("the rest of the update")
    assert applied == ["the rest of the update"]
    with stops.applying():  # the deferred stop is spent
        pass


def test_a_diverted_first_ctrl_c_asks_for_something_else_and_the_second_stops(capsys):
    stops = StopRequests(divert="cooling down first")
    stops.handle()
    assert stops.diverted and not stops.requested
    assert "cooling down first" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        stops.handle()


def test_sigterm_asks_for_the_stop_even_where_ctrl_c_would_divert_and_a_second_stops(capsys):
    """A scheduler's SIGTERM leaves seconds: a checkpoint, not a cooldown."""
    stops = StopRequests(divert="cooling down first")
    stops.terminate()
    assert stops.requested and not stops.diverted
    assert capsys.readouterr().err == f"\n{TERMINATE_LINE}\n"
    with pytest.raises(KeyboardInterrupt):
        stops.terminate()
    diverted = StopRequests(divert="cooling down first", announce=False)
    diverted.handle()  # a cooldown under way, then the scheduler's SIGTERM
    diverted.terminate()
    assert diverted.requested


def test_installed_handles_sigint_and_sigterm_and_gives_them_back():
    import signal

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stops = StopRequests(announce=False)
    with stops.installed():
        assert signal.getsignal(signal.SIGINT) == stops.handle
        assert signal.getsignal(signal.SIGTERM) == stops.terminate
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
