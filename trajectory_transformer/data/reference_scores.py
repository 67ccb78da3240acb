"""Reference returns for normalised scores: the dataset's own, explicit ones, or D4RL's table.

A normalised score is `100 * (return - ref_min) / (ref_max - ref_min)` (`scores.py`).
Minari's `mujoco/*` datasets carry no reference scores, so on them an evaluation prints raw
returns unless it is given scores: explicitly (`eval.ref_min_score`, `eval.ref_max_score`) or
from D4RL's table (`eval.reference=d4rl`), the scores behind the paper's normalised tables.
`resolve` is the one place that decides; tt-eval calls it for its episodes, and tt-compare
calls `check_request` (and `d4rl_row`) on every agent's evaluation settings before training.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Random-policy and expert-policy returns of D4RL: Fu, Kumar, Nachum, Tucker and Levine,
# "D4RL: Datasets for Deep Data-Driven Reinforcement Learning" (2020, arXiv:2004.07219), as in
# its repository (github.com/Farama-Foundation/D4RL, formerly rail-berkeley/d4rl), file
# d4rl/infos.py: REF_MIN_SCORE and REF_MAX_SCORE, one pair per environment shared by all its
# datasets (random, medium, expert, ...; the v2 rows are the ones quoted in the literature).
# They were measured on D4RL's MuJoCo environments (mujoco-py), not gymnasium's v5 ones.
D4RL = {
    "halfcheetah": (-280.178953, 12135.0),
    "hopper": (-20.272305, 3234.3),
    "walker2d": (1.629008, 4592.3),
}
REFERENCES = ("d4rl",)

# Where the scores came from, as `reference_source` in results.json.
DATASET = "dataset metadata"
EXPLICIT = "explicit"
D4RL_V2 = "d4rl (v2 envs)"

HOW_TO_GET_ONE = (
    "give eval.ref_min_score and eval.ref_max_score (random and expert returns), or "
    f"eval.reference=d4rl for {', '.join(D4RL)}"
)


class ReferenceScoreError(ValueError):
    """Reference scores asked for in a way that cannot be honoured; says what to do."""


@dataclass(frozen=True)
class ReferenceScores:
    ref_min_score: float
    ref_max_score: float
    source: str
    """`dataset metadata`, `explicit` or `d4rl (v2 envs)`."""

    def as_dict(self) -> dict:
        """The keys of results.json: `ref_min_score`, `ref_max_score`, `reference_source`."""
        return {
            "ref_min_score": self.ref_min_score,
            "ref_max_score": self.ref_max_score,
            "reference_source": self.source,
        }


def d4rl_row(env_id: str | None, dataset_id: str | None = None) -> tuple[str, float, float]:
    """(family, random return, expert return) of D4RL's row for the evaluation env
    (`Hopper-v5`, `HalfCheetah-v5`, `Walker2d-v4`, ...), or, where the env is unknown, for a
    dataset id that names one (`mujoco/hopper/medium-v0`). The env decides when it is known:
    a Pendulum evaluation of a checkpoint trained on hopper data has no row."""
    name = env_id or dataset_id or ""
    for word in re.split(r"[^a-z0-9]+", name.lower()):
        family = re.sub(r"v\d+$", "", word)
        if family in D4RL:
            return (family, *D4RL[family])
    evaluated = f"env {env_id!r}" if env_id else f"dataset {dataset_id!r} (env unknown)"
    raise ReferenceScoreError(
        f"eval.reference=d4rl has no row for {evaluated}: D4RL's table covers "
        f"{', '.join(D4RL)} (e.g. Hopper-v5 or mujoco/hopper/medium-v0); give "
        "eval.ref_min_score and eval.ref_max_score instead"
    )


def check_request(
    ref_min_score: float | None, ref_max_score: float | None, reference: str | None
) -> None:
    """Refuse settings that name no single pair of scores: one explicit score alone, an
    unknown table, explicit scores together with a table (ambiguous), or equal scores."""
    if (ref_min_score is None) != (ref_max_score is None):
        raise ReferenceScoreError(
            "give both eval.ref_min_score and eval.ref_max_score (the random and expert "
            f"returns), not one; got {ref_min_score} and {ref_max_score}"
        )
    if reference is not None and reference not in REFERENCES:
        raise ReferenceScoreError(
            f"eval.reference={reference} is not a known table; use one of {REFERENCES}, "
            "or give eval.ref_min_score and eval.ref_max_score"
        )
    if reference is not None and ref_min_score is not None:
        raise ReferenceScoreError(
            f"eval.reference={reference} and explicit eval.ref_min_score/eval.ref_max_score "
            "were both given, which is ambiguous; keep one"
        )
    if ref_min_score is not None and float(ref_min_score) == float(ref_max_score):
        raise ReferenceScoreError(
            f"eval.ref_min_score and eval.ref_max_score are equal ({ref_min_score}): no score "
            "can be normalised by them"
        )


def d4rl_warning(family: str, env_id: str | None) -> str:
    low, high = D4RL[family]
    return (
        f"warning: D4RL's {family} reference returns ({low}, {high}) were measured on the v2 "
        f"MuJoCo environments (D4RL, mujoco-py), not on {env_id or 'this env'}: the "
        "normalised scores are approximate on v5"
    )


def resolve(
    *,
    dataset_scores: tuple[float | None, float | None],
    env_id: str | None,
    dataset_id: str | None,
    ref_min_score: float | None = None,
    ref_max_score: float | None = None,
    reference: str | None = None,
) -> tuple[ReferenceScores | None, str | None, str | None]:
    """(the scores to normalise with or None, why there are none, a warning to print).

    Explicit scores (both) win over the dataset's; `reference="d4rl"` takes D4RL's row for
    the env, with a warning that it was measured on v2 environments. Explicit scores and a
    table at once are ambiguous, and refused (`check_request`).
    """
    check_request(ref_min_score, ref_max_score, reference)
    if ref_min_score is not None:
        return ReferenceScores(float(ref_min_score), float(ref_max_score), EXPLICIT), None, None
    if reference == "d4rl":
        family, low, high = d4rl_row(env_id, dataset_id)
        return ReferenceScores(low, high, D4RL_V2), None, d4rl_warning(family, env_id)
    if None in dataset_scores:
        return None, f"the dataset carries no ref_min_score/ref_max_score; {HOW_TO_GET_ONE}", None
    low, high = map(float, dataset_scores)
    if low == high:
        raise ReferenceScoreError(
            f"the dataset's reference scores are equal ({low}): no score can be normalised by "
            "them; give eval.ref_min_score and eval.ref_max_score"
        )
    return ReferenceScores(low, high, DATASET), None, None
