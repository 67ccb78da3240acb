"""scripts/train_behaviour_policy.py: SAC runs and resumes, and the shipped snapshots are chosen
by their returns (expert the best, medium the earlier one nearest a third of it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from trajectory_transformer.suites.actors import GaussianActor

SCRIPT = Path(__file__).parents[1] / "scripts" / "train_behaviour_policy.py"


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


def test_sac_trains_resumes_and_saves_evaluated_snapshots(tmp_path):
    run = tmp_path / "run"
    common = ["--run-dir", str(run), "--random-steps", "100", "--eval-every", "100"]
    first = script(*common, "--steps", "200", "--eval-episodes", "1")
    assert first.returncode == 0, first.stderr
    again = script(*common, "--steps", "300", "--eval-episodes", "1", "--resume")
    assert again.returncode == 0, again.stderr
    assert "resumed at step 200" in again.stdout
    snapshots = sorted((run / "snapshots").glob("step_*.pt"))
    assert [p.name for p in snapshots] == [f"step_{s:07d}.pt" for s in (100, 200, 300)]
    actor = GaussianActor.load(snapshots[-1])
    assert actor.metadata["step"] == 300 and actor.metadata["eval_episodes"] == 1


def test_select_takes_the_best_the_third_and_earlier_stages(tmp_path):
    run = tmp_path / "run"
    (run / "snapshots").mkdir(parents=True)
    returns = {10: 20.0, 20: 300.0, 30: 500.0, 40: 900.0, 50: 1050.0, 60: 3000.0, 70: 2500.0}
    for step, value in returns.items():
        GaussianActor(11, 3, 8).save(
            run / "snapshots" / f"step_{step:07d}.pt", step=step, mean_return=value, std_return=1.0
        )
    config = {"env": "Hopper-v5", "run_dir": "runs/x", "eval_episodes": 5, "actor_hidden": 8}
    (run / "config.json").write_text(json.dumps(config | {"seed": 3}))
    (run / "log.jsonl").write_text('{"step": 70, "seconds": 120.0}\n')
    chosen = tmp_path / "chosen"
    result = script("--run-dir", str(run), "--select", str(chosen))
    assert result.returncode == 0, result.stderr
    step_of = {
        p.stem: torch.load(p, weights_only=True)["metadata"]["step"] for p in chosen.glob("*.pt")
    }
    # expert 3000 (step 60); medium nearest 1000 before it (1050, step 50); replay stages nearest
    # 262, 525 and 788 before the medium (300, 500, 900).
    assert step_of == {"expert": 60, "medium": 50, "replay_0": 20, "replay_1": 30, "replay_2": 40}
    readme = (chosen / "README.md").read_text()
    assert "| `expert.pt` | 60 | 3000.0 ± 1.0 |" in readme
    assert "| 70 | 2500.0 ± 1.0 |" in readme  # every evaluation is listed
    # The command that trained it names the settings that differ from the defaults.
    command = (
        "train_behaviour_policy.py --run-dir runs/x --eval-episodes 5 --actor-hidden 8 --seed 3\n"
    )
    assert command in readme and "70 environment steps" in readme
