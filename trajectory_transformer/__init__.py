"""Trajectory Transformer."""
