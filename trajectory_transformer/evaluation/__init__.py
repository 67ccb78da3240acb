"""Vector environments, evaluation episodes, scores and videos."""

from trajectory_transformer.evaluation.agent import Agent, EvaluationObserver, PlanningAgent
from trajectory_transformer.evaluation.envs import (
    EnvMismatchError,
    check_env_matches,
    make_env,
    make_vector_env,
)
from trajectory_transformer.evaluation.loop import (
    EpisodeJournal,
    EvalResult,
    JournalMismatchError,
    evaluate,
)
from trajectory_transformer.evaluation.record import EpisodeRecord, PlanSnapshot, record_episode
from trajectory_transformer.evaluation.video import render_observations, write_video
from trajectory_transformer.scores import normalized_score

__all__ = [
    "Agent",
    "EnvMismatchError",
    "EpisodeJournal",
    "EpisodeRecord",
    "EvalResult",
    "EvaluationObserver",
    "JournalMismatchError",
    "PlanSnapshot",
    "PlanningAgent",
    "check_env_matches",
    "evaluate",
    "make_env",
    "make_vector_env",
    "normalized_score",
    "record_episode",
    "render_observations",
    "write_video",
]
