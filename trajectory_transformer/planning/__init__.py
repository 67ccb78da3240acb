"""Beam-search planning over a trained TrajectoryGPT."""

from trajectory_transformer.planning.beam import BeamPlanner, Plan, PlannerConfig
from trajectory_transformer.planning.naive import naive_plan

__all__ = ["BeamPlanner", "Plan", "PlannerConfig", "naive_plan"]
