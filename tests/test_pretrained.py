"""Pretrained checkpoints: a finished run added to a manifest, then loaded by name from Python
and from tt-eval; an unknown name is refused in one line that lists the known ones."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import run_module, untrained_checkpoint

import pretrained as script
from trajectory_transformer.checkpoint import (
    CheckpointError,
    load_checkpoint,
    pretrained_file,
    read_payload,
)
from trajectory_transformer.planning import BeamPlanner


def hydra_run(path: Path, overrides: list[str], results: dict | None = None) -> Path:
    (path / ".hydra").mkdir(parents=True, exist_ok=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if results is not None:
        (path / "results.json").write_text(json.dumps(results))
    return path


@pytest.fixture
def pretrained(tmp_path, tiny_dataset, monkeypatch):
    """`test/tiny-v0`'s untrained model added to a folder of pretrained checkpoints, which
    `TT_PRETRAINED_DIR` names; returns (that folder, the run's model.pt)."""
    run = tmp_path / "run"
    model = untrained_checkpoint(run / "model.pt", "test/tiny-v0")
    # Resumed once: the same training, so the recipe leaves its resume= out.
    hydra_run(run, ["dataset.id=test/tiny-v0", "seed=0", f"resume={run}/checkpoint.pt"])
    scores = {"normalized_score_mean": 41.234, "normalized_score_stderr": 2.5, "returns": [1, 2]}
    small = ["eval.episodes=2", "eval.max_episode_steps=10", "eval.progress=false", "device=cpu"]
    searched = ["planner.horizon=2", "planner.beam_width=3", "planner.context_transitions=2"]
    planner = hydra_run(tmp_path / "eval", ["checkpoint=x", *searched, *small], scores)
    cloned = ["planner=bc", "planner.context_transitions=2"]
    bc = hydra_run(tmp_path / "bc", ["checkpoint=x", *cloned, *small], scores)
    out = tmp_path / "pretrained"
    arguments = ["add", str(run), "--planner", str(planner), "--bc", str(bc)]
    script.main([*arguments, "--commit", "abc123", "--out", str(out)])
    monkeypatch.setenv("TT_PRETRAINED_DIR", str(out))
    return out, model


def test_a_run_added_to_the_manifest_loads_by_name_with_its_weights(pretrained):
    out, model = pretrained
    (entry,) = json.loads((out / "manifest.json").read_text())["checkpoints"].values()
    assert entry["dataset"] == "test/tiny-v0" and entry["file"] == "test-tiny-v0.pt"
    assert entry["training"]["command"] == "tt-train dataset.id=test/tiny-v0 seed=0"
    assert entry["training"]["commit"] == "abc123"
    assert entry["scores"]["bc"] == {
        "normalized_score_mean": 41.23,
        "normalized_score_stderr": 2.5,
        "episodes": 2,
        "command": "tt-eval checkpoint=pretrained:<dataset id> planner=bc "
        "planner.context_transitions=2 eval.episodes=2 eval.max_episode_steps=10 "
        "eval.progress=false device=cpu",
    }
    assert entry["dataset_fingerprint"] == load_checkpoint(model).dataset.fingerprint
    assert entry["weights_dtype"] in ("float16", "float32")
    assert (entry["weights_dtype"] == "float16") == (entry["float16_agreement"] >= 0.99)
    assert pretrained_file("test/tiny-v0") == out / "test-tiny-v0.pt"

    # Planned with the settings the manifest's planner score was measured with, unless told.
    assert entry["planner_settings"] == {"horizon": 2, "beam_width": 3, "context_transitions": 2}
    planner = BeamPlanner.from_pretrained("test/tiny-v0")
    assert (planner.config.horizon, planner.config.beam_width) == (2, 3)
    assert planner.config.context_transitions == 2
    assert BeamPlanner.from_pretrained("test/tiny-v0", beam_width=2).config.beam_width == 2
    by_path = BeamPlanner.from_checkpoint("pretrained:test/tiny-v0").config  # the same settings
    assert (by_path.horizon, by_path.beam_width, by_path.context_transitions) == (2, 3, 2)
    original = load_checkpoint(model).model.state_dict()
    for name, weights in planner.model.state_dict().items():
        assert weights.dtype == original[name].dtype  # float32 again once loaded
        torch.testing.assert_close(weights, original[name], rtol=1e-3, atol=1e-4)


def test_add_stores_float32_weights_when_asked(pretrained, tmp_path):
    out = tmp_path / "float32"
    runs = [
        str(tmp_path / "run"),
        "--planner",
        str(tmp_path / "eval"),
        "--bc",
        str(tmp_path / "bc"),
    ]
    script.main(["add", *runs, "--commit", "abc123", "--float32", "--out", str(out)])
    (entry,) = json.loads((out / "manifest.json").read_text())["checkpoints"].values()
    assert entry["weights_dtype"] == "float32"
    weights = read_payload(out / entry["file"])["model"].values()
    assert all(w.dtype == torch.float32 for w in weights if w.is_floating_point())


def test_rescore_replaces_a_score_and_the_settings_its_command_composes_to(pretrained, tmp_path):
    """Another planner for the installed weights: its score, command and planner settings from
    a tt-eval run of `checkpoint=pretrained:<name>`; BC, the training and the weights kept."""
    out, _ = pretrained
    before = json.loads((out / "manifest.json").read_text())["checkpoints"]["test/tiny-v0"]
    weights = (out / "test-tiny-v0.pt").read_bytes()
    scores = {"normalized_score_mean": 77.777, "normalized_score_stderr": 1.0, "returns": [3, 4]}
    searched = ["planner.horizon=2", "planner.beam_width=2", "planner.context_transitions=1"]
    played = ["checkpoint=pretrained:test/tiny-v0", *searched, "eval.episodes=2"]
    again = hydra_run(tmp_path / "again", played, scores)
    script.main(["rescore", "test/tiny-v0", "--planner", str(again), "--out", str(out)])
    entry = json.loads((out / "manifest.json").read_text())["checkpoints"]["test/tiny-v0"]
    assert entry["scores"]["planner"] == {
        "normalized_score_mean": 77.78,
        "normalized_score_stderr": 1.0,
        "episodes": 2,
        "command": "tt-eval checkpoint=pretrained:<dataset id> planner.horizon=2 "
        "planner.beam_width=2 planner.context_transitions=1 eval.episodes=2",
    }
    assert entry["planner_settings"] == {"horizon": 2, "beam_width": 2, "context_transitions": 1}
    assert BeamPlanner.from_pretrained("test/tiny-v0").config.beam_width == 2
    unchanged = ("training", "dataset_fingerprint", "weights_dtype", "bytes", "file")
    assert entry["scores"]["bc"] == before["scores"]["bc"]
    assert all(entry[key] == before[key] for key in unchanged)
    assert (out / "test-tiny-v0.pt").read_bytes() == weights

    # A run of other weights (the training run itself) is refused, and so is a name not there.
    other = hydra_run(tmp_path / "other", ["checkpoint=runs/x", *searched], scores)
    with pytest.raises(SystemExit, match=r"evaluated checkpoint=runs/x; score the installed"):
        script.main(["rescore", "test/tiny-v0", "--bc", str(other), "--out", str(out)])
    with pytest.raises(SystemExit, match=r"hopper/nope-v0 is not in .*it has test/tiny-v0"):
        script.main(["rescore", "hopper/nope-v0", "--planner", str(again), "--out", str(out)])
    with pytest.raises(SystemExit, match="give --planner or --bc"):
        script.main(["rescore", "test/tiny-v0", "--out", str(out)])


def test_an_unknown_name_is_refused_with_the_known_ones(pretrained):
    with pytest.raises(CheckpointError, match=r"'hopper/nope-v0'.*test/tiny-v0"):
        BeamPlanner.from_pretrained("hopper/nope-v0")


def test_tt_eval_plays_a_pretrained_checkpoint_by_name_and_writes_nothing_beside_it(
    pretrained, tmp_path
):
    out, _ = pretrained
    small = ["planner.horizon=2", "planner.beam_width=3", "planner.context_transitions=2"]
    small += ["eval.episodes=2", "eval.num_envs=2"]
    small += ["eval.max_episode_steps=10", "eval.progress=false", "device=cpu"]
    module = "trajectory_transformer.cli.evaluate"
    result = run_module(
        module, "checkpoint=pretrained:test/tiny-v0", *small, f"hydra.run.dir={tmp_path / 'e'}"
    )
    assert result.returncode == 0, result.stderr
    assert "2 episodes" in result.stdout
    assert (tmp_path / "e" / "results.json").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test-tiny-v0.pt"]

    refused = run_module(module, "checkpoint=pretrained:nope", f"hydra.run.dir={tmp_path / 'f'}")
    assert refused.returncode != 0
    (line,) = refused.stderr.strip().splitlines()
    assert "test/tiny-v0" in line


def test_tt_eval_plans_a_pretrained_checkpoint_with_its_manifests_settings_unless_told(
    pretrained, tmp_path
):
    small = ["eval.episodes=1", "eval.max_episode_steps=3", "eval.progress=false", "device=cpu"]
    runs = iter(range(10))

    def planned(*overrides: str) -> tuple[str, tuple[int, int, int]]:
        run_dir = tmp_path / f"e{next(runs)}"
        module = "trajectory_transformer.cli.evaluate"
        checkpoint = "checkpoint=pretrained:test/tiny-v0"
        result = run_module(module, checkpoint, *overrides, *small, f"hydra.run.dir={run_dir}")
        assert result.returncode == 0, result.stderr
        settings = json.loads((run_dir / "results.json").read_text())["settings"]
        planner = settings["planner"]
        searched = (planner["horizon"], planner["beam_width"], planner["context_transitions"])
        return settings["planner_preset"], searched

    # The manifest's settings (measured with horizon 2, 3 beams, 2 transitions of context), a
    # key of the command line over them, and a preset of the command line in their place.
    assert planned() == ("manifest", (2, 3, 2))
    assert planned("planner.beam_width=2") == ("manifest", (2, 2, 2))
    assert planned("planner=bc", "planner.context_transitions=2") == ("bc", (1, 1, 2))


def test_every_checkpoint_of_the_installed_manifest_is_there(monkeypatch):
    from trajectory_transformer.checkpoint import pretrained_dir, pretrained_manifest

    monkeypatch.delenv("TT_PRETRAINED_DIR", raising=False)
    assert (pretrained_dir() / "manifest.json").is_file()
    for name, entry in pretrained_manifest().items():
        assert entry["dataset"] == name
        assert (pretrained_dir() / entry["file"]).is_file(), name


def test_make_results_evaluates_every_checkpoint_again_and_finds_what_disagrees(
    pretrained, tmp_path, capsys
):
    out, _ = pretrained
    record = tmp_path / "scores.json"
    arguments = ["check", "--out", str(tmp_path / "again"), "--record", str(record)]
    # The manifest's made-up scores (41.2 ± 2.5) are not what the untrained model plays.
    assert script.main(arguments) == 1
    # Each evaluation is told as it ends.
    told = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [line[:6] for line in told] == ["[1/2] ", "[2/2] "]
    assert {line[6:].split(":")[0] for line in told} == {"test/tiny-v0 planner", "test/tiny-v0 bc"}
    (row,) = json.loads(record.read_text())["rows"]
    assert row[0] == "test/tiny-v0" and row[1] == "41.2 ± 2.5" and "disagrees" in row[2]
    # Given what it does play, everything agrees.
    manifest = json.loads((out / "manifest.json").read_text())
    for agent in ("planner", "bc"):
        again = json.loads(
            (tmp_path / "again" / "test/tiny-v0" / agent / "results.json").read_text()
        )
        manifest["checkpoints"]["test/tiny-v0"]["scores"][agent].update(
            normalized_score_mean=again["normalized_score_mean"],
            normalized_score_stderr=again["normalized_score_stderr"],
        )
    (out / "manifest.json").write_text(json.dumps(manifest))
    # A checkpoint file rewritten since (a new clone, a pull): its episodes are played again.
    os.utime(out / "test-tiny-v0.pt")
    assert script.main(arguments) == 0
    assert "disagrees" not in record.read_text()


def test_an_interrupted_check_resumes_keeping_the_episodes_it_had_finished(pretrained, tmp_path):
    again, record = tmp_path / "again", tmp_path / "scores.json"
    arguments = ["check", "--out", str(again), "--record", str(record)]
    # Interrupted after the planner's first episode (of the manifest's 2): its journal holds it.
    planner = again / "test/tiny-v0" / "planner"
    (entry,) = json.loads((pretrained[0] / "manifest.json").read_text())["checkpoints"].values()
    overrides = script.evaluation_overrides("test/tiny-v0", entry["scores"]["planner"])
    first = run_module(
        "trajectory_transformer.cli.evaluate",
        *overrides,
        "eval.episodes=1",
        f"hydra.run.dir={planner}",
    )
    assert first.returncode == 0, first.stderr
    journal = (planner / "episodes.jsonl").read_text().splitlines()
    (again / "check-time.json").write_text(json.dumps({"runs": 1, "seconds": 600.0}))

    script.main([*arguments, "--resume"])
    resumed = (planner / "episodes.jsonl").read_text().splitlines()
    assert resumed[: len(journal)] == journal and len(resumed) == len(journal) + 1
    clock = json.loads((again / "check-time.json").read_text())
    assert clock["runs"] == 2 and clock["seconds"] > 600.0
    assert "in 10 minutes (2-core CPU; over 2 runs" in json.loads(record.read_text())["note"]

    # Without --resume a check starts over: every episode played again, its time its own.
    script.main(arguments)
    assert (planner / "episodes.jsonl").read_text().splitlines()[1] != journal[1]
    assert json.loads((again / "check-time.json").read_text())["runs"] == 1


@pytest.mark.skipif(not Path("/proc/self/cmdline").is_file(), reason="reads /proc")
def test_a_terminated_check_stops_its_evaluations_and_keeps_its_time(pretrained, tmp_path):
    """SIGTERM to the check alone, as a scheduler sends it: its evaluations end too, instead
    of playing on for an hour, and the time taken is kept for --resume."""
    again = tmp_path / "again"
    # Evaluations far longer than the test: only the stop can end them in time.
    long = ["eval.episodes=100000", "eval.max_episode_steps=10"]
    arguments = ["check", "--out", str(again), "--record", str(tmp_path / "scores.json"), *long]
    script_path = Path(script.__file__)
    check = subprocess.Popen(
        [sys.executable, str(script_path), *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ignored SIGINT, as a background job of a non-interactive shell has it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )

    def evaluations() -> list[int]:
        running = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes()
            except OSError:
                continue
            if str(again).encode() in text and b"cli.evaluate" in text:
                running.append(int(cmdline.parent.name))
        return running

    try:
        deadline = time.monotonic() + 120
        while not (again / "test/tiny-v0" / "planner" / "episodes.jsonl").is_file():
            assert check.poll() is None, check.stderr.read()  # ended: its stderr says why
            assert time.monotonic() < deadline, "no evaluation wrote an episode in 120 s"
            time.sleep(0.2)
        assert evaluations()
        check.send_signal(signal.SIGTERM)
        _, stderr = check.communicate(timeout=60)
        assert check.returncode != 0 and "--resume" in stderr
        assert not evaluations()
    finally:  # a failing run leaves nothing playing on
        check.kill()
        for pid in evaluations():
            os.kill(pid, signal.SIGKILL)
    clock = json.loads((again / "check-time.json").read_text())
    assert clock["runs"] == 1 and clock["seconds"] > 0


def test_two_scores_agree_within_twice_their_combined_standard_error():
    agrees = script.agrees
    assert agrees(50.0, 3.0, {"normalized_score_mean": 59.9, "normalized_score_stderr": 4.0})
    assert not agrees(50.0, 3.0, {"normalized_score_mean": 60.1, "normalized_score_stderr": 4.0})
    # A score every episode reaches alike: its standard error is near zero, and hundredths
    # of a point (another CPU, float16 weights) are not a disagreement; a point and more is.
    held = {"normalized_score_mean": 99.95, "normalized_score_stderr": 0.003}
    assert agrees(99.91, 0.002, held)
    assert not agrees(98.5, 0.002, held)


def installed_entries() -> list[tuple[str, dict]]:
    import os

    from trajectory_transformer.checkpoint import PRETRAINED_DIR_VARIABLE, pretrained_manifest

    if os.environ.get(PRETRAINED_DIR_VARIABLE):
        return []
    return sorted(pretrained_manifest().items())


INSTALLED = installed_entries()


def test_each_installed_checkpoint_records_the_planner_settings_its_command_composes_to():
    """`from_pretrained` plans with the manifest's `planner_settings`, `make results` with its
    command: a preset changed since a checkpoint was added parts them, and its scores must be
    measured again (`scripts/pretrained.py add`, or `rescore` for the same weights)."""
    for name, entry in INSTALLED:
        assert entry["planner_settings"] == script.planner_settings(
            name, entry["scores"]["planner"]
        ), name


@pytest.mark.parametrize(("name", "entry"), INSTALLED, ids=[name for name, _ in INSTALLED])
def test_each_installed_checkpoint_plans_and_plays_one_episode_within_a_wide_band(
    name, entry, tmp_path
):
    """The manifest's planner command plans a few steps, and its BC command plays one episode
    and scores within four of its episodes' standard deviations of the manifest's mean, or
    `SCORE_FLOOR` (`make results` checks the scores themselves; a planner's whole episode is
    up to a minute on one core)."""
    planner = script.evaluation_overrides(name, entry["scores"]["planner"])
    few = ["eval.episodes=1", "eval.num_envs=1", "eval.max_episode_steps=5"]
    result = run_module(
        "trajectory_transformer.cli.evaluate", *planner, *few, f"hydra.run.dir={tmp_path / 'p'}"
    )
    assert result.returncode == 0, result.stderr
    assert math.isfinite(json.loads((tmp_path / "p" / "results.json").read_text())["return_mean"])

    recorded = entry["scores"]["bc"]
    bc = script.evaluation_overrides(name, recorded)
    one = ["eval.episodes=1", "eval.num_envs=1", f"hydra.run.dir={tmp_path / 'bc'}"]
    result = run_module("trajectory_transformer.cli.evaluate", *bc, *one)
    assert result.returncode == 0, result.stderr
    score = json.loads((tmp_path / "bc" / "results.json").read_text())["normalized_score_mean"]
    spread = recorded["normalized_score_stderr"] * recorded["episodes"] ** 0.5
    band = max(4 * spread, script.SCORE_FLOOR)
    assert abs(score - recorded["normalized_score_mean"]) <= band, score


def test_check_only_evaluates_the_named_checkpoints_and_keeps_the_others_rows(pretrained, tmp_path):
    record = tmp_path / "scores.json"
    arguments = ["check", "--out", str(tmp_path / "again"), "--record", str(record)]
    with pytest.raises(SystemExit, match=r"--only nope/x-v0: not in the manifest.*test/tiny-v0"):
        script.main([*arguments, "--only", "nope/x-v0"])
    before = {
        "title": "Pretrained checkpoints, evaluated again",
        "page": "docs/results/pretrained.md",
        "provenance": {"commands": ["make results"], "machines": ["m"], "dates": ["2026-01-01"]},
        "note": "Every pretrained checkpoint evaluated again in 20 minutes.",
        "columns": ["dataset", "planner (manifest)", "planner", "BC (manifest)", "BC"],
        "rows": [["gone/x-v0", "1", "1", "1", "1"], ["test/tiny-v0", "2", "2", "2", "2"]],
    }
    record.write_text(json.dumps(before))
    script.main([*arguments, "--only", "test/tiny-v0"])
    after = json.loads(record.read_text())
    # A checkpoint no longer in the manifest leaves the table; the one named is measured again.
    ((name, was, now, *_),) = after["rows"]
    assert (name, was) == ("test/tiny-v0", "41.2 ± 2.5") and now != "2"
    assert after["provenance"]["commands"][-1].endswith("check --only test/tiny-v0")
    assert after["note"].startswith(before["note"]) and "test/tiny-v0" in after["note"]
    # Checked by name again: the note still names it once, not once per check.
    script.main([*arguments, "--only", "test/tiny-v0"])
    again = json.loads(record.read_text())
    assert again["note"] == after["note"] and again["note"].count("test/tiny-v0") == 1
