"""Progress in a log file: whole lines on an interval, no carriage returns."""

import io

import pytest

from trajectory_transformer import progress as progress_module
from trajectory_transformer.progress import PlainProgress, progress_bar


def test_a_plain_progress_prints_whole_lines_on_its_interval_and_once_at_the_end(
    monkeypatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    bar = PlainProgress(total=100, desc="train", interval=30.0, stream=stream)
    for _ in range(50):  # 50 steps in 25 s: no line yet
        now[0] += 0.5
        bar.update(1)
    assert stream.getvalue() == ""
    bar.set_postfix(loss="1.2345")
    for _ in range(20):  # crosses 30 s once
        now[0] += 0.5
        bar.update(1)
    bar.close()
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines == [
        "train: 60/100 (60%) | 30s elapsed, ~20s left | loss=1.2345",
        "train: 70/100 (70%) | 35s elapsed, ~15s left | loss=1.2345",
    ]


def test_a_log_file_gets_plain_lines_and_a_terminal_a_bar(monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())
    monkeypatch.setenv("TT_PROGRESS_SECONDS", "5")
    bar = progress_bar(10, "eval")
    assert isinstance(bar, PlainProgress) and bar.interval == 5.0
    assert not isinstance(progress_bar(10, "eval", disable=True), PlainProgress)
    monkeypatch.setenv("TT_PROGRESS_SECONDS", "often")
    with pytest.raises(ValueError, match="TT_PROGRESS_SECONDS='often' is not a number"):
        progress_bar(10, "eval")
