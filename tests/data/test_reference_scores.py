"""Which reference scores normalise an evaluation: explicit ones, D4RL's table, the dataset's."""

from __future__ import annotations

import pytest

from trajectory_transformer.data.reference_scores import (
    D4RL,
    ReferenceScoreError,
    d4rl_row,
    resolve,
)


def scores(**overrides):
    arguments = {"dataset_scores": (None, None), "env_id": None, "dataset_id": None}
    return resolve(**(arguments | overrides))


def test_the_d4rl_table_is_d4rls():
    # d4rl/infos.py (REF_MIN_SCORE, REF_MAX_SCORE): random and expert returns.
    assert D4RL == {
        "hopper": (-20.272305, 3234.3),
        "halfcheetah": (-280.178953, 12135.0),
        "walker2d": (1.629008, 4592.3),
    }


@pytest.mark.parametrize(
    ("env_id", "dataset_id", "family"),
    [
        ("Hopper-v5", None, "hopper"),
        ("HalfCheetah-v5", "mujoco/halfcheetah/medium-v0", "halfcheetah"),
        ("Walker2d-v5", None, "walker2d"),
        (None, "mujoco/walker2d/expert-v0", "walker2d"),
        (None, "mujoco/hopper/medium-v0", "hopper"),
        ("Walker2d-v4", "my/own-v0", "walker2d"),
    ],
)
def test_d4rl_rows_are_found_from_env_or_dataset_ids(env_id, dataset_id, family):
    found, reason, warning = scores(env_id=env_id, dataset_id=dataset_id, reference="d4rl")
    assert (found.ref_min_score, found.ref_max_score) == D4RL[family]
    assert found.source == "d4rl (v2 envs)"
    assert reason is None and "v2 MuJoCo environments" in warning and family in warning


def test_the_evaluation_env_decides_the_row_over_the_dataset_id():
    # A hopper-trained checkpoint evaluated on Pendulum has no D4RL score.
    with pytest.raises(ReferenceScoreError, match="no row for env 'Pendulum-v1'"):
        d4rl_row("Pendulum-v1", "mujoco/hopper/medium-v0")


def test_dataset_scores_apply_unless_overridden():
    found, _, _ = scores(dataset_scores=(-10.0, 90.0))
    assert (found.ref_min_score, found.ref_max_score, found.source) == (
        -10.0,
        90.0,
        "dataset metadata",
    )
    found, _, warning = scores(dataset_scores=(-10.0, 90.0), ref_min_score=0, ref_max_score=1)
    assert (found.ref_min_score, found.ref_max_score, found.source) == (0.0, 1.0, "explicit")
    assert warning is None
    assert found.as_dict() == {
        "ref_min_score": 0.0,
        "ref_max_score": 1.0,
        "reference_source": "explicit",
    }


def test_without_scores_the_reason_says_how_to_get_them():
    found, reason, _ = scores(env_id="Hopper-v5")
    assert found is None
    assert "eval.ref_min_score" in reason and "eval.reference=d4rl" in reason


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ref_min_score": 0.0}, "give both"),
        ({"ref_max_score": 1.0}, "give both"),
        ({"reference": "d4rl", "ref_min_score": 0.0, "ref_max_score": 1.0}, "ambiguous"),
        ({"reference": "atari"}, "not a known table"),
        ({"reference": "d4rl", "env_id": "Ant-v5"}, "no row for env 'Ant-v5'"),
        ({"reference": "d4rl", "dataset_id": "my/own-v0"}, r"dataset 'my/own-v0' \(env unknown"),
        ({"ref_min_score": 5.0, "ref_max_score": 5.0}, "are equal"),
        ({"dataset_scores": (3.0, 3.0)}, "are equal"),
    ],
)
def test_ambiguous_or_impossible_requests_are_refused(overrides, message):
    with pytest.raises(ReferenceScoreError, match=message):
        scores(**overrides)
