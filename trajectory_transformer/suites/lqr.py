"""LQR controllers for the MuJoCo pole-balancing suites, from MuJoCo's own model.

The suites' experts are discrete-time LQRs on the state ``z = (qpos, qvel)``: the env's step
is linearised about the upright rest (all zero) by central differences of MuJoCo's dynamics
over one env step (:func:`linearised_step`), and the gain is the fixed point of the Riccati
recursion (:func:`discrete_gain`).
"""

from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np

__all__ = ["discrete_gain", "linearised_step"]


def linearised_step(env_id: str, delta: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """``(A, B)`` of one step of ``env_id`` about the rest, ``z' = A z + B u`` for the state
    ``z = (qpos, qvel)`` and the control ``u`` (one actuator)."""
    env = gym.make(env_id)
    try:
        model, data, frames = env.unwrapped.model, env.unwrapped.data, env.unwrapped.frame_skip
        nq, nv = model.nq, model.nv

        def step(state: np.ndarray, action: float) -> np.ndarray:
            mujoco.mj_resetData(model, data)
            data.qpos[:], data.qvel[:], data.ctrl[:] = state[:nq], state[nq:], action
            mujoco.mj_step(model, data, nstep=frames)
            return np.concatenate([data.qpos, data.qvel])

        rest, n = np.zeros(nq + nv), nq + nv
        a = np.stack(
            [(step(rest + d, 0.0) - step(rest - d, 0.0)) / (2 * delta) for d in np.eye(n) * delta],
            axis=1,
        )
        b = ((step(rest, delta) - step(rest, -delta)) / (2 * delta))[:, None]
        return a, b
    finally:
        env.close()


def discrete_gain(
    a: np.ndarray, b: np.ndarray, state_weights: tuple[float, ...], action_weight: float
) -> np.ndarray:
    """``(1, n)`` gain ``K`` of the discrete-time LQR, ``u = -K z``, for diagonal weights: the
    Riccati recursion iterated to its fixed point."""
    q, r = np.diag(state_weights), np.array([[action_weight]])
    p = q
    for _ in range(10_000):
        gain = np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
        following = q + a.T @ p @ (a - b @ gain)
        if np.allclose(following, p, rtol=1e-12, atol=1e-9):
            return gain
        p = following
    raise RuntimeError("the LQR's Riccati recursion did not converge: has the model changed?")
