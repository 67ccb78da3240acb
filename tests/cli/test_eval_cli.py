import ctypes.util
import json
from pathlib import Path

import pytest
from conftest import create_dataset, run_module, untrained_checkpoint

from trajectory_transformer.checkpoint import read_payload, save_atomic

SMALL_PLANNER = [
    "planner.horizon=2",
    "planner.beam_width=3",
    "planner.context_transitions=2",
    "eval.episodes=3",
    "eval.num_envs=2",
    "eval.max_episode_steps=15",
    "eval.progress=false",
    "device=cpu",
]


def tt_eval(*overrides, run_dir):
    return run_module("trajectory_transformer.cli.evaluate", *overrides, f"hydra.run.dir={run_dir}")


def test_eval_end_to_end_writes_results_next_to_the_checkpoint(tmp_path, tiny_checkpoint, device):
    on_device = [*SMALL_PLANNER[:-1], f"device={device.type}"]
    # The run directory: a run from before model.pt plans with its checkpoint.pt.
    run = tiny_checkpoint.parent
    result = tt_eval(f"checkpoint={run}", *on_device, run_dir=tmp_path / "eval")
    assert result.returncode == 0, result.stderr
    assert "3 episodes" in result.stdout and "normalized score" in result.stdout
    in_run_dir = json.loads((tmp_path / "eval" / "results.json").read_text())
    (record,) = read_index(tiny_checkpoint)
    assert record["results"] == str((tmp_path / "eval" / "results.json").resolve())
    assert record["normalized_score_mean"] == in_run_dir["normalized_score_mean"]
    assert (record["planner_preset"], record["episodes"], record["checkpoint"]) == (
        "default",
        3,
        "checkpoint.pt",
    )
    assert len(in_run_dir["returns"]) == 3 and in_run_dir["lengths"] == [15, 15, 15]
    saved = read_payload(tiny_checkpoint)["dataset"]["fingerprint"]
    assert in_run_dir["settings"]["dataset_fingerprint"] == saved
    assert sorted(in_run_dir["seeds"]) == [0, 1, 2]
    for key in (
        "return_mean",
        "return_stderr",
        "normalized_score_mean",
        "normalized_score_stderr",
        "normalized_scores",
    ):
        assert key in in_run_dir
    # The dataset's own reference scores, named next to the scores they normalise.
    assert (in_run_dir["ref_min_score"], in_run_dir["ref_max_score"]) == (-1200.0, -150.0)
    assert in_run_dir["reference_source"] == "dataset metadata"
    assert in_run_dir["settings"]["planner"]["horizon"] == 2
    assert in_run_dir["settings"]["device"].startswith(device.type)


def test_bc_preset_runs(tmp_path, tiny_checkpoint):
    result = tt_eval(
        f"checkpoint={tiny_checkpoint}",
        "planner=bc",
        "planner.context_transitions=3",
        "eval.episodes=1",
        "eval.max_episode_steps=5",
        "eval.progress=false",
        run_dir=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "planner bc" in result.stdout
    assert [record["planner_preset"] for record in read_index(tiny_checkpoint)] == ["bc"]


def read_index(checkpoint) -> list[dict]:
    index = checkpoint.parent / "evaluations.jsonl"
    return [json.loads(line) for line in index.read_text().splitlines()]


def test_every_evaluation_stays_on_record(tmp_path, tiny_checkpoint):
    """A short check after a long evaluation adds to the record and replaces nothing."""
    for episodes, run in ((3, "long"), (1, "short")):
        result = tt_eval(
            f"checkpoint={tiny_checkpoint}",
            *SMALL_PLANNER,
            f"eval.episodes={episodes}",
            run_dir=tmp_path / run,
        )
        assert result.returncode == 0, result.stderr
    records = read_index(tiny_checkpoint)
    assert [record["episodes"] for record in records] == [3, 1]
    for record, run in zip(records, ("long", "short"), strict=True):
        assert json.loads(Path(record["results"]).read_text())["seeds"]
        assert record["results"].endswith(f"{run}/results.json")


def test_context_plus_horizon_beyond_the_block_is_refused(tmp_path, tiny_checkpoint):
    result = tt_eval(f"checkpoint={tiny_checkpoint}", "planner.horizon=5", run_dir=tmp_path)
    assert result.returncode == 2
    assert "block" in result.stderr and "Traceback" not in result.stderr


def test_eval_on_an_env_of_another_shape_is_refused(tmp_path, tiny_checkpoint):
    result = tt_eval(
        f"checkpoint={tiny_checkpoint}",
        *SMALL_PLANNER,
        "eval.env_id=MountainCarContinuous-v0",
        run_dir=tmp_path,
    )
    assert result.returncode == 2
    assert "observations: checkpoint (3,), env Box(2,)" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_checkpoint_is_one_clear_message(tmp_path):
    result = tt_eval(f"checkpoint={tmp_path / 'nope.pt'}", run_dir=tmp_path)
    assert result.returncode == 2 and "no checkpoint at" in result.stderr
    assert "planner settings" not in result.stderr and "Traceback" not in result.stderr


def test_a_file_that_is_not_a_checkpoint_is_one_clear_message(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(bytes(range(256)) * 8)
    result = tt_eval(f"checkpoint={path}", run_dir=tmp_path / "eval")
    assert result.returncode == 2, result.stderr
    assert f"error: {path} is not a trajectory-transformer checkpoint (" in result.stderr
    assert "Traceback" not in result.stderr and "planner settings" not in result.stderr


def test_video_of_the_first_episode(tmp_path, tiny_checkpoint):
    result = tt_eval(
        f"checkpoint={tiny_checkpoint}",
        *SMALL_PLANNER,
        "eval.episodes=1",
        "eval.max_episode_steps=4",
        "eval.video=true",
        run_dir=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    import imageio.v2 as imageio

    frames = imageio.mimread(tmp_path / "video.gif")
    assert len(frames) == 5  # the reset frame and one per step


@pytest.mark.skipif(ctypes.util.find_library("EGL") is None, reason="no EGL on this machine")
def test_a_mujoco_video_renders_without_a_display(tmp_path, monkeypatch):
    from trajectory_transformer.suites import pointmaze

    for variable in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL"):
        monkeypatch.delenv(variable, raising=False)
    pointmaze.SUITES[0].build("pointmaze/umaze-v0", episodes=3, reference_episodes=2)
    result = tt_eval(
        "checkpoint=behaviour:pointmaze/umaze-v0",
        "eval.video=true",
        "eval.episodes=1",
        "eval.num_envs=1",
        "eval.max_episode_steps=3",
        "eval.progress=false",
        run_dir=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    import imageio.v2 as imageio
    import numpy as np

    frames = imageio.mimread(tmp_path / "video.gif")
    assert len(frames) >= 3 and np.asarray(frames[0]).std() > 0  # the maze, not a blank


def test_save_plots_writes_figures_next_to_the_results(tmp_path, tiny_checkpoint):
    run_dir = tmp_path / "eval"
    result = tt_eval(
        f"checkpoint={tiny_checkpoint}",
        *SMALL_PLANNER,
        "eval.save_plots=true",
        "eval.plot_steps=[0,3]",
        run_dir=run_dir,
    )
    assert result.returncode == 0, result.stderr
    assert (run_dir / "results.json").exists()
    pngs = sorted(path.name for path in run_dir.glob("*.png"))
    assert pngs == sorted(
        ["episode_predictions.png"]
        + [f"plan_step{s}_{k}.png" for s in (0, 3) for k in ("beams", "predictions", "scores")]
    )
    assert "figures of episode 0" in result.stdout


def test_the_planner_discounts_as_the_checkpoint_was_trained(tmp_path, tiny_checkpoint):
    payload = read_payload(tiny_checkpoint)
    payload["config"]["dataset"]["discount"] = 0.9
    save_atomic(payload, tiny_checkpoint)
    quick = [f"checkpoint={tiny_checkpoint}", *SMALL_PLANNER, "eval.episodes=1"]

    result = tt_eval(*quick, run_dir=tmp_path / "trained")
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / "trained" / "results.json").read_text())
    assert results["settings"]["planner"]["discount"] == 0.9
    assert "note: planner.discount" not in result.stderr

    result = tt_eval(*quick, "planner.discount=0.95", run_dir=tmp_path / "other")
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / "other" / "results.json").read_text())
    assert results["settings"]["planner"]["discount"] == 0.95
    assert "note: planner.discount=0.95 differs from the discount 0.9" in result.stderr


def test_explicit_reference_scores_override_the_datasets(tmp_path, tiny_checkpoint):
    result = tt_eval(
        f"checkpoint={tiny_checkpoint}",
        *SMALL_PLANNER,
        "eval.ref_min_score=-2000",
        "eval.ref_max_score=0",
        run_dir=tmp_path / "eval",
    )
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert (results["ref_min_score"], results["ref_max_score"]) == (-2000.0, 0.0)
    assert results["reference_source"] == "explicit"
    assert "(explicit)" in result.stdout
    expected = [100 * (r + 2000) / 2000 for r in results["returns"]]
    assert results["normalized_scores"] == pytest.approx(expected)


def test_one_reference_score_alone_is_one_clear_message(tmp_path, tiny_checkpoint):
    result = tt_eval(
        f"checkpoint={tiny_checkpoint}", *SMALL_PLANNER, "eval.ref_min_score=0", run_dir=tmp_path
    )
    assert result.returncode == 2
    assert "give both eval.ref_min_score and eval.ref_max_score" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_d4rl_table_normalises_a_hopper_run_with_a_warning(tmp_path):
    create_dataset(
        "test/hopper-v0", obs_dim=11, act_dim=3, env="Hopper-v5", ref_scores=None, action_bound=1
    )
    checkpoint = untrained_checkpoint(tmp_path / "run" / "checkpoint.pt", "test/hopper-v0")
    plain = tt_eval(f"checkpoint={checkpoint}", *SMALL_PLANNER, run_dir=tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr
    # Minari's MuJoCo datasets carry no scores: the output says so, and how to get some.
    assert "no normalized score" in plain.stdout
    assert "eval.ref_min_score" in plain.stdout and "eval.reference=d4rl" in plain.stdout
    plain_results = json.loads((tmp_path / "plain" / "results.json").read_text())
    assert plain_results["normalized_score_mean"] is None
    assert plain_results["reference_source"] is None

    result = tt_eval(
        f"checkpoint={checkpoint}", *SMALL_PLANNER, "eval.reference=d4rl", run_dir=tmp_path / "d4rl"
    )
    assert result.returncode == 0, result.stderr
    assert "v2 MuJoCo environments" in result.stderr and "not on Hopper-v5" in result.stderr
    results = json.loads((tmp_path / "d4rl" / "results.json").read_text())
    assert (results["ref_min_score"], results["ref_max_score"]) == (-20.272305, 3234.3)
    assert results["reference_source"] == "d4rl (v2 envs)"
    expected = [100 * (r + 20.272305) / (3234.3 + 20.272305) for r in results["returns"]]
    assert results["normalized_scores"] == pytest.approx(expected)


def test_the_d4rl_table_refuses_an_env_it_does_not_cover(tmp_path, tiny_checkpoint):
    result = tt_eval(
        f"checkpoint={tiny_checkpoint}", *SMALL_PLANNER, "eval.reference=d4rl", run_dir=tmp_path
    )
    assert result.returncode == 2
    assert "no row for env 'Pendulum-v1'" in result.stderr and "hopper" in result.stderr
    assert "give eval.ref_min_score and eval.ref_max_score instead" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_evaluation_continues_in_its_run_directory_and_refuses_another(
    tmp_path, tiny_checkpoint
):
    """Episodes finished in a run directory are not played again (an interrupted evaluation
    continues); an evaluation of other settings there is one clear message."""
    run_dir = tmp_path / "eval"
    settings = [f"checkpoint={tiny_checkpoint}", *SMALL_PLANNER]
    first = tt_eval(*settings, "eval.episodes=2", run_dir=run_dir)
    assert first.returncode == 0, first.stderr
    before = json.loads((run_dir / "results.json").read_text())
    more = tt_eval(*settings, "eval.episodes=3", run_dir=run_dir)
    assert more.returncode == 0, more.stderr
    assert "2 episodes done" in more.stdout and "3 episodes" in more.stdout
    after = json.loads((run_dir / "results.json").read_text())
    assert after["seeds"][:2] == before["seeds"] and sorted(after["seeds"]) == [0, 1, 2]
    assert after["returns"][:2] == before["returns"]
    other = tt_eval(*settings, "planner.horizon=1", run_dir=run_dir)
    assert other.returncode == 2
    assert "holds episodes of another evaluation (it differs in planner)" in other.stderr
    assert "Traceback" not in other.stderr


def test_the_behaviour_policy_of_a_maze_plays_as_an_agent(tmp_path):
    from trajectory_transformer.suites import pointmaze

    pointmaze.SUITES[0].build("pointmaze/umaze-v0", episodes=3, reference_episodes=2)
    runs = {}
    for seed in (0, 1):
        runs[seed] = tmp_path / f"seed{seed}"
        result = tt_eval(
            "checkpoint=behaviour:pointmaze/umaze-v0",
            f"planner.seed={seed}",
            "eval.episodes=2",
            "eval.max_episode_steps=40",
            "eval.progress=false",
            run_dir=runs[seed],
        )
        assert result.returncode == 0, result.stderr
        assert "planner behaviour" in result.stdout
    played = {seed: json.loads((run / "results.json").read_text()) for seed, run in runs.items()}
    assert played[0]["settings"]["planner"] == {"agent": "behaviour", "seed": 0}
    assert played[0]["settings"]["checkpoint"] == "behaviour:pointmaze/umaze-v0"
    assert played[0]["normalized_score_mean"] is not None  # the dataset's reference scores
    # The seed draws the noise, not the episodes: both play the same starts.
    assert played[1]["settings"]["planner"]["seed"] == 1
    assert played[0]["seeds"] == played[1]["seeds"] == [0, 1]


def test_a_dataset_without_one_behaviour_policy_is_one_clear_message(tmp_path):
    result = tt_eval("checkpoint=behaviour:hopper/medium-replay-v0", run_dir=tmp_path)
    assert result.returncode == 2 and "pointmaze/umaze-v0" in result.stderr
    assert "Traceback" not in result.stderr
    result = tt_eval("checkpoint=behaviour:pointmaze/umaze-v0", "planner=iql", run_dir=tmp_path)
    assert result.returncode == 2 and "leave planner.agent" in result.stderr
