"""scripts/results_table.py: seeds per dataset, mean ± standard error over seeds, wall times."""

from __future__ import annotations

import json
import sys

import pytest
import render_results
import results_table as script


def test_each_dataset_takes_its_own_seeds_and_names_them(tmp_path, monkeypatch):
    scores = {("hopper-embedded-medium", "default"): [60.0, 70.0, 65.0]}
    scores[("hopper-embedded-medium", "bc")] = [40.0, 50.0, 45.0]
    scores[("hopper-embedded-medium-expert", "default")] = [80.0]
    scores[("hopper-embedded-medium-expert", "bc")] = [55.0]

    def train(dataset, seed, run_dir, overrides):
        run_dir.mkdir(parents=True)
        return run_dir / "checkpoint.pt"

    def training_minutes(checkpoint):  # seed 2's is unknown (an older checkpoint)
        seed = int(checkpoint.parent.name.removeprefix("seed"))
        return None if seed == 2 else 10.0 * (seed + 1)

    def evaluate(checkpoint, planner, episodes, overrides):
        dataset = checkpoint.parent.parent.name
        score = scores[(dataset, planner)][int(checkpoint.parent.name.removeprefix("seed"))]
        return {"normalized_score_mean": score, "wall_seconds": 120}

    monkeypatch.setattr(script, "train", train)
    monkeypatch.setattr(script, "training_minutes", training_minutes)
    monkeypatch.setattr(script, "evaluate", evaluate)
    monkeypatch.setattr(script, "dataset_score", lambda dataset: 46.2)
    argv = ["results_table.py", "--out", str(tmp_path), "--episodes", "20", "--datasets"]
    argv += ["hopper-embedded-medium:0,1,2", "hopper-embedded-medium-expert:0"]
    monkeypatch.setattr(sys, "argv", argv)
    script.main()

    table = (tmp_path / "table.md").read_text().splitlines()
    # mean ± standard error over seeds (none for one seed); training minutes averaged over the
    # seeds that recorded them
    assert table[2] == "| hopper/medium-v0 | 46.2 | 45.0 ± 2.9 | 65.0 ± 2.9 | 0, 1, 2 | 15 + 2 |"
    one_seed = "| 55.0 (one seed) | 80.0 (one seed) | 0 | 10 + 2 |"
    assert table[3] == "| hopper/medium-expert-v0 | 46.2 " + one_seed
    summary = json.loads((tmp_path / "hopper-embedded-medium" / "scores.json").read_text())
    assert summary["seeds"] == [0, 1, 2] and summary["scores"]["bc"] == [40.0, 50.0, 45.0]


def test_an_unknown_dataset_is_refused_before_training(monkeypatch, capsys):
    monkeypatch.setattr(script, "train", lambda *a: pytest.fail("trained"))
    monkeypatch.setattr(sys, "argv", ["results_table.py", "--datasets", "hopper-mediun:0"])
    with pytest.raises(SystemExit):
        script.main()
    assert "unknown dataset 'hopper-mediun'" in capsys.readouterr().err


def test_a_maze_is_compared_with_its_behaviour_policy(tmp_path, monkeypatch):
    """pointmaze/* episodes each end at a random goal (return 1): the data column is the
    behaviour policy's score in the evaluation env, from the metadata, and the note says so."""
    from types import SimpleNamespace

    metadata = {"behaviour_policy": {"normalized_score": 77.3, "return": 137.4}}
    dataset = SimpleNamespace(storage=SimpleNamespace(metadata=metadata))
    monkeypatch.setattr(script, "load_minari", lambda dataset_id: dataset)
    monkeypatch.setattr(script, "load_episodes", lambda *a: pytest.fail("episodes read"))
    monkeypatch.setattr(script, "train", lambda d, s, run_dir, o: run_dir / "checkpoint.pt")
    monkeypatch.setattr(script, "training_minutes", lambda checkpoint: None)
    monkeypatch.setattr(
        script, "evaluate", lambda *a: {"normalized_score_mean": 90.0, "wall_seconds": 60}
    )
    (tmp_path / "pointmaze-umaze").mkdir(parents=True)
    argv = ["results_table.py", "--out", str(tmp_path), "--datasets", "pointmaze-umaze:0"]
    monkeypatch.setattr(sys, "argv", argv)
    script.main()
    table = (tmp_path / "table.md").read_text()
    assert "| pointmaze/umaze-v0 | 77.3 | 90.0 (one seed) | 90.0 (one seed) | 0 | ? + 1 |" in table
    assert "Dataset mean of pointmaze/umaze-v0: its behaviour policy's score" in table


def test_an_evaluation_is_reused_only_with_the_same_play_settings(tmp_path, monkeypatch):
    checkpoint = tmp_path / "seed0" / "checkpoint.pt"
    run_dir = checkpoint.parent / "eval_default"
    run_dir.mkdir(parents=True)
    settings = {"eval": {"num_envs": 10, "episodes": 3}, "planner": {"horizon": 15}}
    summary = {"returns": [1.0, 2.0, 3.0], "settings": settings}
    (run_dir / "results.json").write_text(json.dumps(summary))
    ran = []
    monkeypatch.setattr(script, "run", ran.append)
    assert script.evaluate(checkpoint, "default", 3, ["eval.num_envs=10"]) == summary
    assert script.evaluate(checkpoint, "default", 3, []) == summary
    # Episodes play the same with any number of envs (each has its own seed).
    assert script.evaluate(checkpoint, "default", 3, ["eval.num_envs=5", "device=cpu"]) == summary
    assert not ran
    for overrides in (["planner.horizon=5", "eval.num_envs=5"], ["planner.beam_width=4"]):
        script.evaluate(checkpoint, "default", 3, overrides)
    script.evaluate(checkpoint, "default", 4, [])
    assert len(ran) == 3 and ran[0][-2:] == ["planner.horizon=5", "eval.num_envs=5"]


def test_an_interrupted_training_continues_from_its_checkpoint(tmp_path, monkeypatch):
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.touch()
    finished = {"finished": False}
    monkeypatch.setattr(script, "read_payload", lambda path: {"training": finished})
    ran = []
    monkeypatch.setattr(script, "run", ran.append)
    assert script.train("pendulum-medium", 0, tmp_path, ["trainer.max_steps=10"]) == checkpoint
    assert ran[0][-2:] == ["trainer.max_steps=10", f"resume={checkpoint}"]
    finished["finished"] = True
    script.train("pendulum-medium", 0, tmp_path, [])
    assert len(ran) == 1


def test_the_table_is_also_written_as_a_results_record(tmp_path, monkeypatch):
    """--record writes the table in scripts/render_results.py's format: the pages' tables that
    show the record are then written from it."""
    monkeypatch.setattr(script, "train", lambda d, s, run_dir, o: run_dir / "checkpoint.pt")
    monkeypatch.setattr(script, "training_minutes", lambda checkpoint: 12.0)
    monkeypatch.setattr(
        script, "evaluate", lambda *a: {"normalized_score_mean": 90.0, "wall_seconds": 60}
    )
    monkeypatch.setattr(script, "dataset_score", lambda dataset: 27.2)
    (tmp_path / "pendulum-medium-replay").mkdir(parents=True)
    record = tmp_path / "records" / "planner-scores" / "pendulum.json"
    argv = ["results_table.py", "--out", str(tmp_path), "--datasets", "pendulum-medium-replay:0"]
    monkeypatch.setattr(sys, "argv", [*argv, "--record", str(record)])
    script.main()

    written = json.loads(record.read_text())
    assert written["rows"] == [
        ["pendulum/medium-replay-v0", "27.2", *["90.0 (one seed)"] * 2, "0", "12 + 1"]
    ]
    assert written["provenance"]["commands"][0].endswith(f"--record {record}")
    table = render_results.table("planner-scores/pendulum", records=tmp_path / "records")
    assert table == (tmp_path / "table.md").read_text().split("\nNormalised")[0] + "\n"
