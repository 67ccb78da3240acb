"""Write rendered frames to a gif or mp4, and render states the planner only imagined."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np


def write_video(frames: list[np.ndarray], path: str | Path, fps: int = 30) -> Path:
    """Save frames (H, W, 3) uint8; `.gif` needs only Pillow, `.mp4` needs imageio-ffmpeg."""
    import imageio.v2 as imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gif":
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
    elif path.suffix == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise RuntimeError(
                "mp4 videos need imageio-ffmpeg: `pip install imageio-ffmpeg`, or use "
                "eval.video_format=gif."
            ) from None
        imageio.mimsave(path, frames, fps=fps)
    else:
        raise ValueError(f"unsupported video format {path.suffix!r}; use .gif or .mp4")
    return path


def set_state_from_observation(env: gym.Env, observation: np.ndarray) -> bool:
    """Put a (reset) env into the state an observation describes; False if this env's
    observation does not determine its state in a way known here.

    Known: Pendulum (cos, sin, angular velocity) and the MuJoCo locomotion envs whose
    observation is `qpos` without the x position, then `qvel` (HalfCheetah, Hopper, Walker2d);
    their x position stays where the env is.
    """
    base = env.unwrapped
    obs = np.asarray(observation, dtype=np.float64)
    if isinstance(base, gym.envs.classic_control.PendulumEnv):
        base.state = np.array([np.arctan2(obs[1], obs[0]), obs[2]])
        return True
    model = getattr(base, "model", None)
    if (
        hasattr(base, "set_state")
        and getattr(base, "_exclude_current_positions_from_observation", False)
        and model is not None
        and obs.shape == (model.nq - 1 + model.nv,)
    ):
        qpos = np.concatenate([base.data.qpos[:1], obs[: model.nq - 1]])
        base.set_state(qpos, obs[model.nq - 1 :])
        return True
    return False


def render_observations(
    env: gym.Env, observations: np.ndarray, actions: np.ndarray | None = None
) -> list[np.ndarray] | None:
    """Frames of imagined observations (n, O) in an `rgb_array` env, or None where the env's
    state cannot be set from an observation. Pendulum also draws the planned torque."""
    frames = []
    for i, observation in enumerate(observations):
        if not set_state_from_observation(env, observation):
            return None
        if actions is not None and hasattr(env.unwrapped, "last_u"):
            env.unwrapped.last_u = float(np.asarray(actions[i]).reshape(-1)[0])
        frames.append(env.render())
    return frames
