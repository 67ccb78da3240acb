"""Vector environments for evaluation, and the check that a checkpoint fits its env."""

from __future__ import annotations

import os
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import FlattenObservation

from trajectory_transformer.data.minari_source import DatasetInfo, observation_layout


class EnvMismatchError(ValueError):
    """The evaluation env does not have the spaces the checkpoint was trained on."""


def make_env(info: DatasetInfo, env_id: str | None = None, **kwargs) -> Callable[[], gym.Env]:
    """A thunk building the dataset's evaluation env (or `env_id`), CleanRL style; a Dict env
    comes flattened as the checkpoint's observations were (`flatten_as_trained`)."""

    def thunk() -> gym.Env:
        env = gym.make(env_id, **kwargs) if env_id else info.make_env(**kwargs)
        return flatten_as_trained(info, env)

    return thunk


def flatten_as_trained(info: DatasetInfo, env: gym.Env) -> gym.Env:
    """`env` with its observations as the checkpoint saw them: a Dict env whose keys, order
    and shapes are the checkpoint's `observation_layout` is wrapped in gymnasium's
    `FlattenObservation` (the same concatenation the dataset went through); a Box env is
    returned as it is (`check_env_matches` checks its shape). A Dict env with other keys,
    another key order or other shapes, a Dict env for a checkpoint of flat observations and a
    Box env for a checkpoint of Dict ones are refused (EnvMismatchError, listing both sides)."""
    layout = observation_layout(env.observation_space)
    if layout == info.observation_layout:
        return env if layout is None else FlattenObservation(env)
    if layout is None:
        found = f"{_describe(env.observation_space)} observations"
    else:
        found = f"Dict observations {_format_layout(layout)}"
    wanted = (
        f"({info.observation_dim},) Box observations"
        if info.observation_layout is None
        else f"Dict observations {_format_layout(info.observation_layout)}"
    )
    lines = [f"observations: checkpoint {wanted}, env {found}"]
    if layout is not None and info.observation_layout is not None:
        keys, trained = [k for k, _ in layout], [k for k, _ in info.observation_layout]
        if sorted(keys) == sorted(trained) and keys != trained:
            lines.append(
                "the same keys in another order: their values would be concatenated in "
                "another order than the model was trained on"
            )
    env.close()
    raise EnvMismatchError(_mismatch(info, env.spec.id if env.spec else None, lines))


def _format_layout(layout: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    return "{" + ", ".join(f"{key}: {shape}" for key, shape in layout) + "}"


def make_vector_env(
    info: DatasetInfo,
    num_envs: int,
    env_id: str | None = None,
    asynchronous: bool = False,
    render: bool = False,
    max_episode_steps: int | None = None,
) -> gym.vector.VectorEnv:
    """`num_envs` copies in one vector env; async runs each in its own process."""
    if render:
        use_egl_without_a_display()
    kwargs = {"render_mode": "rgb_array"} if render else {}
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    thunks = [make_env(info, env_id, **kwargs) for _ in range(num_envs)]
    vector = gym.vector.AsyncVectorEnv if asynchronous else gym.vector.SyncVectorEnv
    return vector(thunks, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


def check_env_matches(info: DatasetInfo, env: gym.vector.VectorEnv) -> None:
    """Refuse an env whose observation or action shape differs from the checkpoint's."""
    obs_space, act_space = env.single_observation_space, env.single_action_space
    differences = []
    if not isinstance(obs_space, gym.spaces.Box) or obs_space.shape != (info.observation_dim,):
        differences.append(
            f"observations: checkpoint ({info.observation_dim},), env {_describe(obs_space)}"
        )
    if not isinstance(act_space, gym.spaces.Box) or act_space.shape != (info.action_dim,):
        differences.append(f"actions: checkpoint ({info.action_dim},), env {_describe(act_space)}")
    elif not (
        np.allclose(act_space.low, info.action_low)
        and np.allclose(act_space.high, info.action_high)
    ):
        differences.append(
            f"action bounds: checkpoint [{info.action_low}, {info.action_high}], "
            f"env [{act_space.low.tolist()}, {act_space.high.tolist()}]"
        )
    if differences:
        raise EnvMismatchError(_mismatch(info, env.spec.id if env.spec else None, differences))


def _mismatch(info: DatasetInfo, env_id: str | None, differences: list[str]) -> str:
    return (
        f"the checkpoint was trained on {info.dataset_id} ({info.eval_env_id}) and does not "
        f"fit {env_id or 'the eval env'}:\n  " + "\n  ".join(differences) + "\nEvaluate it on "
        "its own env (leave eval.env_id unset) or train a model for this one."
    )


def _describe(space: gym.Space) -> str:
    shape = getattr(space, "shape", None)
    return f"{type(space).__name__}{tuple(shape) if shape is not None else ''}"


def use_egl_without_a_display() -> None:
    """MuJoCo renders through OpenGL. Without a display, gymnasium's first choice (GLFW) makes
    no context and the first frame fails; EGL renders off screen (in software through Mesa
    where there is no GPU). A `MUJOCO_GL` that is set is kept."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("MUJOCO_GL", "egl")
