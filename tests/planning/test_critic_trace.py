"""scripts/critic_trace.py: the critic's values along real episodes of the critic-scored search."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
from test_critic_scores import critic_file

SCRIPT = Path(__file__).parents[2] / "scripts" / "critic_trace.py"


def load_script():
    spec = importlib.util.spec_from_file_location("critic_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_with_a_one_transition_plan_the_imagined_q_is_the_real_one(
    tmp_path, tiny_checkpoint, monkeypatch
):
    # Horizon 1: the plan's last transition is the real state and the executed action, so the
    # Q the plan gave it and the Q of what really happened are one number: the rows line up.
    trace = load_script()
    critic = critic_file(tmp_path / "critic" / "critic.pt", "test/tiny-v0")
    out = tmp_path / "trace"
    small = ["planner.horizon=1", "planner.beam_width=2", "planner.context_transitions=1"]
    argv = ["critic_trace.py", f"--checkpoint={tiny_checkpoint}", f"--critic={critic}"]
    argv += ["--episodes=1", "--max-episode-steps=40", f"--out={out}", *small]
    monkeypatch.setattr("sys.argv", argv)
    trace.main()
    summaries = json.loads((out / "summary.json").read_text())
    assert [s["seed"] for s in summaries] == [0]
    rows = (out / "trace.csv").read_text().splitlines()
    header, first = rows[0].split(","), rows[1].split(",")
    assert header[:3] == ["seed", "step", "reward"] and len(rows) == 1 + 40
    imagined = float(first[header.index("q_imagined")])
    real = float(first[header.index("q_real")])
    np.testing.assert_allclose(imagined, real, atol=1e-5)
    for summary in summaries:
        assert abs(summary["imagined_minus_real_mean"]) < 1e-5
    assert (out / "critic_trace.png").stat().st_size > 0
