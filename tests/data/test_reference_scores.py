"""Which reference scores normalise an evaluation: explicit ones, D4RL's table, the dataset's."""

from __future__ import annotations

import pytest

from trajectory_transformer.data.reference_scores import D4RL, ReferenceScoreError, resolve


def scores(**overrides):
    arguments = {"dataset_scores": (None, None), "env_id": None, "dataset_id": None}
    return resolve(**(arguments | overrides))


@pytest.mark.parametrize(
    ("env_id", "dataset_id", "family"),
    [
        ("Hopper-v5", None, "hopper"),
        ("HalfCheetah-v5", "mujoco/halfcheetah/medium-v0", "halfcheetah"),
        (None, "mujoco/walker2d/expert-v0", "walker2d"),
        ("Walker2d-v4", "my/own-v0", "walker2d"),
    ],
)
def test_d4rl_rows_are_found_from_env_or_dataset_ids(env_id, dataset_id, family):
    found, reason, warning = scores(env_id=env_id, dataset_id=dataset_id, reference="d4rl")
    assert (found.ref_min_score, found.ref_max_score) == D4RL[family]
    assert reason is None and "v2 MuJoCo environments" in warning


def test_dataset_scores_apply_unless_overridden():
    found, _, _ = scores(dataset_scores=(-10.0, 90.0))
    assert (found.ref_min_score, found.ref_max_score, found.source) == (
        -10.0,
        90.0,
        "dataset metadata",
    )
    found, _, warning = scores(dataset_scores=(-10.0, 90.0), ref_min_score=0, ref_max_score=1)
    assert (found.ref_min_score, found.ref_max_score) == (0.0, 1.0) and warning is None


def test_without_scores_the_reason_says_how_to_get_them():
    found, reason, _ = scores(env_id="Hopper-v5")
    assert found is None
    assert "eval.ref_min_score" in reason and "eval.reference=d4rl" in reason


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ref_min_score": 0.0}, "give both"),
        ({"ref_max_score": 1.0}, "give both"),
        ({"reference": "d4rl", "ref_min_score": 0.0, "ref_max_score": 1.0}, "keep one"),
        ({"reference": "atari"}, "not a known table"),
        ({"reference": "d4rl", "env_id": "Ant-v5"}, "no row for env 'Ant-v5'"),
        ({"ref_min_score": 5.0, "ref_max_score": 5.0}, "are equal"),
    ],
)
def test_ambiguous_or_impossible_requests_are_refused(overrides, message):
    with pytest.raises(ReferenceScoreError, match=message):
        scores(**overrides)
