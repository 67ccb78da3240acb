"""Reference returns for normalised scores: the dataset's own, explicit ones, or D4RL's table.

A normalised score is `100 * (return - ref_min) / (ref_max - ref_min)` (`data/scores.py`).
Minari's `mujoco/*` datasets carry no reference scores, so on them an evaluation prints raw
returns unless it is given scores: explicitly (`eval.ref_min_score`, `eval.ref_max_score`) or
from D4RL's table (`eval.reference=d4rl`), the scores behind the paper's normalised tables.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# Random-policy and expert-policy returns of D4RL (Fu et al., 2020, "D4RL: Datasets for Deep
# Data-Driven Reinforcement Learning"), as in its repository's d4rl/infos.py (REF_MIN_SCORE,
# REF_MAX_SCORE). They were measured on the v2 MuJoCo environments (mujoco-py).
D4RL = {
    "halfcheetah": (-280.178953, 12135.0),
    "hopper": (-20.272305, 3234.3),
    "walker2d": (1.629008, 4592.3),
}
D4RL_SOURCE = "D4RL (Fu et al., 2020; d4rl/infos.py), measured on the v2 MuJoCo environments"
REFERENCES = ("d4rl",)
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

    def as_dict(self) -> dict:
        return asdict(self)


def _d4rl_row(env_id: str | None, dataset_id: str | None) -> tuple[str, tuple[float, float]]:
    """D4RL's row for an env id (`Hopper-v5`) or a Minari id (`mujoco/hopper/medium-v0`)."""
    for name in (env_id, dataset_id):
        if not name:
            continue
        words = re.split(r"[^a-z0-9]+", name.lower())
        for word in words:
            family = re.sub(r"v\d+$", "", word)
            if family in D4RL:
                return family, D4RL[family]
    raise ReferenceScoreError(
        f"eval.reference=d4rl has no row for env {env_id!r} (dataset {dataset_id!r}): its "
        f"table covers {', '.join(D4RL)}; give eval.ref_min_score and eval.ref_max_score "
        "instead"
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
    the env, with a warning that it was measured on v2 environments. Giving explicit scores
    and a reference table at once is ambiguous, and is refused.
    """
    explicit = (ref_min_score, ref_max_score)
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
            "were both given; keep one"
        )
    if ref_min_score is not None:
        scores = ReferenceScores(*map(float, explicit), "explicit (eval.ref_min_score/max)")
    elif reference == "d4rl":
        family, (low, high) = _d4rl_row(env_id, dataset_id)
        warning = (
            f"warning: D4RL's {family} reference returns ({low}, {high}) were measured on "
            f"the v2 MuJoCo environments (mujoco-py), not {env_id}: the normalised scores "
            "are approximate"
        )
        return ReferenceScores(low, high, f"{D4RL_SOURCE}: {family}"), None, warning
    elif None not in dataset_scores:
        scores = ReferenceScores(*map(float, dataset_scores), "dataset metadata")
    else:
        return None, f"the dataset carries no ref_min_score/ref_max_score; {HOW_TO_GET_ONE}", None
    if scores.ref_max_score == scores.ref_min_score:
        raise ReferenceScoreError(
            f"reference scores from {scores.source} are equal ({scores.ref_min_score}): "
            "no score can be normalised by them"
        )
    return scores, None, None
