"""Vector environments, evaluation episodes, scores and videos."""

from trajectory_transformer.rollout.envs import (
    EnvMismatchError,
    check_env_matches,
    make_env,
    make_vector_env,
)
from trajectory_transformer.rollout.evaluate import EvalResult, evaluate, normalized_score
from trajectory_transformer.rollout.video import write_video

__all__ = [
    "EnvMismatchError",
    "EvalResult",
    "check_env_matches",
    "evaluate",
    "make_env",
    "make_vector_env",
    "normalized_score",
    "write_video",
]
