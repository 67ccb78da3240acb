"""Beam-search planning over a trained TrajectoryGPT."""

from trajectory_transformer.planning.beam import BeamPlanner
from trajectory_transformer.planning.config import PlannerConfig
from trajectory_transformer.planning.naive import naive_plan
from trajectory_transformer.planning.plan import Plan, build_plan

__all__ = ["BeamPlanner", "Plan", "PlannerConfig", "build_plan", "naive_plan"]
