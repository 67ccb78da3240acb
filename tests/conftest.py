"""Shared fixtures: an isolated Minari folder and tiny datasets made on the spot."""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import replace

import torch

# Without a GPU, Triton's kernels (the fused decode step) run through its interpreter, and
# Triton reads that choice when it is first imported: before anything imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import gymnasium as gym
import minari
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from minari.data_collector import EpisodeBuffer

# Property-based tests: a few examples each in `make test`, many with --hypothesis-profile=long.
settings.register_profile(
    "default",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile("long", parent=settings.get_profile("default"), max_examples=400)
settings.load_profile("default")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


cuda_only = pytest.mark.skipif(not _cuda_available(), reason="no CUDA device on this machine")
"""Marks a test that needs a GPU; it is skipped elsewhere (CI has none)."""


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=cuda_only)])
def device(request):
    """Each device a test that compares paths runs on: the CPU, and CUDA where there is one."""
    import torch

    return torch.device(request.param)


@pytest.fixture
def fused_device():
    """Where the fused decode step's Triton kernels run in a test: CUDA where there is a GPU,
    else the CPU through Triton's interpreter (slow: tiny models and few steps only)."""
    pytest.importorskip("triton", reason="Triton is not installed for this platform")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU, and TRITON_INTERPRET is not 1 (Triton's interpreter)")
    return torch.device("cpu")


def tolerance(device) -> dict:
    """`torch.testing.assert_close` tolerances between two float32 computations of the same
    values on `device`: other kernels sum in other orders, more so on a GPU."""
    return dict(atol=1e-5, rtol=0.0) if device.type == "cpu" else dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(autouse=True)
def minari_dir(tmp_path_factory, monkeypatch):
    """Every test sees its own empty Minari folder, never ~/.minari."""
    path = tmp_path_factory.mktemp("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    return path


@pytest.fixture(scope="session")
def native_module():
    """The compiled native CPU kernels; skips where no C++ compiler can build them."""
    from trajectory_transformer.model.decode import native

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine: the native kernels cannot be built")
    module = native.load()
    assert module is not None, f"the native kernels failed to build: {native._failure}"
    return module


def make_episode(
    rng: np.random.Generator,
    length: int,
    obs_dim: int,
    act_dim: int,
    *,
    terminated: bool,
    seed: int,
) -> EpisodeBuffer:
    terminations = np.zeros(length, dtype=bool)
    truncations = np.zeros(length, dtype=bool)
    if terminated:
        terminations[-1] = True
    else:
        truncations[-1] = True
    return EpisodeBuffer(
        id=seed,
        seed=seed,
        observations=rng.uniform(-1, 1, (length + 1, obs_dim)).astype(np.float32),
        actions=rng.uniform(-1, 1, (length, act_dim)).astype(np.float32),
        rewards=rng.normal(size=length).astype(np.float64),
        terminations=terminations,
        truncations=truncations,
    )


def create_dataset(
    dataset_id: str,
    *,
    episodes: int = 6,
    length: int = 12,
    obs_dim: int = 3,
    act_dim: int = 1,
    terminated_every: int = 2,
    seed: int = 0,
    observation_space: gym.Space | None = None,
    buffers: list[EpisodeBuffer] | None = None,
    env: str | None = "Pendulum-v1",
    ref_scores: tuple[float, float] | None = (-1200.0, -150.0),
    action_bound: float = 2.0,
) -> minari.MinariDataset:
    """A small random dataset (every `terminated_every`-th episode terminates)."""
    rng = np.random.default_rng(seed)
    if buffers is None:
        buffers = [
            make_episode(
                rng,
                length + i % 3,
                obs_dim,
                act_dim,
                terminated=(i % terminated_every == 0),
                seed=i,
            )
            for i in range(episodes)
        ]
    obs_space = observation_space or gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
    kwargs = {}
    if ref_scores is not None:
        kwargs = {"ref_min_score": ref_scores[0], "ref_max_score": ref_scores[1]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return minari.create_dataset_from_buffers(
            dataset_id,
            buffers,
            env=env,
            observation_space=obs_space,
            action_space=gym.spaces.Box(-action_bound, action_bound, (act_dim,), np.float32),
            algorithm_name="random",
            description="test data",
            **kwargs,
        )


@pytest.fixture
def tiny_dataset():
    """A 3-obs, 1-act dataset named like a user's own: `test/tiny-v0`."""
    return create_dataset("test/tiny-v0")


def untrained_checkpoint(path, dataset_id: str):
    """An untrained checkpoint of the Minari dataset `dataset_id`, as tt-train writes it."""
    import torch

    from trajectory_transformer.checkpoint import build_payload, save_atomic
    from trajectory_transformer.data.discretizer import Discretizer
    from trajectory_transformer.data.episodes import joint_transitions
    from trajectory_transformer.data.minari_source import load_episodes
    from trajectory_transformer.model import GPTConfig, TrajectoryGPT

    episodes, info = load_episodes(dataset_id)
    discretizer = Discretizer.fit(joint_transitions(episodes, 0.99, -100.0), 12)
    torch.manual_seed(0)
    model = TrajectoryGPT(GPTConfig(info.observation_dim, info.action_dim, 12, 4, 1, 2, 16, 0.0))
    payload = build_payload(model, discretizer, info, {"dataset": {"id": dataset_id}}, None)
    return save_atomic(payload, path)


def untrained_critic(path, dataset_id: str, config: dict | None = None, step: int = 1):
    """An untrained IQL critic of the Minari dataset `dataset_id` (2-D actions in [-1, 1]), as
    tt-train-critic writes it, with the run config `config` and `step` training steps."""
    from trajectory_transformer.checkpoint import save_atomic
    from trajectory_transformer.critic.model import build_critic_payload
    from trajectory_transformer.critic.training import CriticConfig, new_critic
    from trajectory_transformer.data.minari_source import load_episodes

    episodes, info = load_episodes(dataset_id)
    critic, policy = new_critic(episodes, CriticConfig(hidden_dim=8), [-1.0] * 2, [1.0] * 2)
    payload = build_critic_payload(critic, policy, info, config or {}, {"step": step})
    return save_atomic(payload, path)


@pytest.fixture
def tiny_checkpoint(tmp_path, tiny_dataset):
    """An untrained checkpoint of `test/tiny-v0` (Pendulum-v1 spaces), as tt-train writes it."""
    return untrained_checkpoint(tmp_path / "run" / "checkpoint.pt", "test/tiny-v0")


@pytest.fixture
def maze_checkpoint(tmp_path):
    """An untrained checkpoint of a tiny `pointmaze/umaze-v0` (3 episodes): a maze, with Dict
    observations."""
    from trajectory_transformer.suites import pointmaze

    pointmaze.SUITES[0].build("pointmaze/umaze-v0", episodes=3, reference_episodes=2)
    return untrained_checkpoint(tmp_path / "maze" / "checkpoint.pt", "pointmaze/umaze-v0")


def tiny_gpt(
    observation_dim: int = 3,
    action_dim: int = 2,
    n_bins: int = 7,
    sequence_transitions: int = 3,
    seed: int = 0,
    embedding_dim: int = 16,
    value_inputs: bool = False,
    token_embeddings: bool = True,
    value_embedding: str = "linear",
    observation_vector: bool = False,
):
    """A 2-layer, 2-head TrajectoryGPT (16 wide unless told) in eval mode, with seeded random
    weights. With `value_inputs`, seeded random value inputs too: what each token decodes to,
    each dimension's range and normalisation, and a map of values large enough to matter
    (`set_value_inputs` again for a discretizer's); `token_embeddings=False` drops the
    tokens' own embeddings; `value_embedding` and `observation_vector` are the config's (the
    observation's map, too, large enough to matter)."""
    import torch

    from trajectory_transformer.model import GPTConfig, TrajectoryGPT

    torch.manual_seed(seed)
    config = GPTConfig(
        observation_dim=observation_dim,
        action_dim=action_dim,
        n_bins=n_bins,
        sequence_transitions=sequence_transitions,
        n_layer=2,
        n_head=2,
        embedding_dim=embedding_dim,
        dropout=0.0,
        value_inputs=value_inputs,
        token_embeddings=token_embeddings,
        value_embedding=value_embedding,
        observation_vector=observation_vector,
    )
    model = TrajectoryGPT(config).eval()
    if value_inputs:
        T = config.transition_dim
        decoded = torch.randn(T, n_bins).sort(dim=1).values
        low, high = decoded[:, 0] - 0.1, decoded[:, -1] + 0.1
        model.set_value_inputs(decoded, low, high, torch.randn(T), torch.rand(T) + 0.5)
        with torch.no_grad():
            model.value_weight.normal_(0.0, 0.5)
            if observation_vector:
                model.observation_map.weight.normal_(0.0, 0.5)
    return model


def set_discretizer_values(model, discretizer):
    """`model`'s value inputs from `discretizer`, as tt-train sets them; returns the model."""
    model.set_value_inputs(discretizer.values, *discretizer.value_normalisation())
    return model


TINY_TRAINING = [
    "dataset.id=test/tiny-v0",
    "dataset.n_bins=12",
    "model.n_layer=1",
    "model.n_head=2",
    "model.embedding_dim=16",
    "model.sequence_transitions=3",
    "trainer.batch_size=8",
    "trainer.log_every=2",
    "device=cpu",
]
"""tt-train overrides for a seconds-long run on `test/tiny-v0` (see `create_dataset`)."""


def run_module(module: str, *args: str, timeout: float = 180.0, check: bool = False):
    """Run `python -m module args...` as a user would, capturing its output."""
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=timeout,
        check=check,
    )


def structured_transitions(episodes: int = 20, length: int = 15, seed: int = 0):
    """Smooth, predictable episodes (2 obs, 1 act): a model has something to learn."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(episodes):
        phase = rng.uniform(0, 2 * np.pi)
        t = np.arange(length)
        obs = np.stack([np.sin(phase + 0.3 * t), np.cos(phase + 0.3 * t)], 1)
        act = -obs[:, :1]
        rew = obs[:, 1:]
        val = np.cumsum(rew[::-1])[::-1][:, None]
        rows.append(np.concatenate([obs, act, rew, val], 1))
    return np.concatenate(rows).astype(np.float32), np.full(episodes, length)


def tiny_training(seed: int = 0, device="cpu", value_inputs: bool = False, **trainer_overrides):
    """(model, windows, discretizer, trainer config) of a 2-layer, 32-wide model with dropout on
    `structured_transitions`: 300 windows of 4 transitions, 40 steps of 16; the model on
    `device`, where the trainer runs. With `value_inputs`, the model takes the windows' real
    values, normalised as tt-train sets them; the windows hold them with `value_inputs` or
    `target_sigma`."""
    import torch

    from trajectory_transformer.data.discretizer import Discretizer
    from trajectory_transformer.data.windows import TokenWindows
    from trajectory_transformer.model import GPTConfig, TrajectoryGPT
    from trajectory_transformer.training.trainer import TrainerConfig

    transitions, lengths = structured_transitions()
    discretizer = Discretizer.fit(transitions, 16, "uniform")
    real_values = value_inputs or trainer_overrides.get("target_sigma", 0.0) > 0
    windows = TokenWindows(transitions, lengths, discretizer, 4, real_values=real_values)
    torch.manual_seed(seed)
    config = GPTConfig(
        observation_dim=2,
        action_dim=1,
        n_bins=16,
        sequence_transitions=4,
        n_layer=2,
        n_head=2,
        embedding_dim=32,
        dropout=0.1,
        value_inputs=value_inputs,
    )
    settings = dict(batch_size=16, learning_rate=3e-3, max_steps=40, log_every=1)
    cfg = TrainerConfig(**(settings | {"checkpoint_every": 1000} | trainer_overrides))
    model = TrajectoryGPT(config)
    if value_inputs:
        set_discretizer_values(model, discretizer)
    return model.to(device), windows, discretizer, cfg


def tiny_training_info():
    """The `DatasetInfo` stored with checkpoints of `tiny_training`."""
    from trajectory_transformer.data.minari_source import DatasetInfo

    return DatasetInfo(
        "test/tiny-v0", None, "Pendulum-v1", 2, 1, [-2.0], [2.0], None, None, 20, 300
    )


MAZE_SPACE = gym.spaces.Dict(
    {
        "observation": gym.spaces.Box(-np.inf, np.inf, (4,), np.float64),
        "achieved_goal": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64),
        "desired_goal": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64),
    }
)


def synthetic_maze_dataset(dataset_id: str = "test/dict-maze-v0", episodes: int = 8):
    """Random goal-conditioned episodes of 12-14 steps with a sparse reward at the end, PointMaze's
    observation keys, its UMaze as the env (goal rewards from its compute_reward)."""
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    rng = np.random.default_rng(0)
    buffers = []
    for i in range(episodes):
        n = 12 + i % 3
        position = np.cumsum(rng.normal(0, 0.1, (n + 1, 2)), axis=0)
        goal = np.repeat(rng.uniform(-1, 1, (1, 2)), n + 1, axis=0)
        velocity = rng.normal(0, 1, (n + 1, 2))
        observations = {
            "observation": np.concatenate([position, velocity], axis=1),
            "achieved_goal": position,
            "desired_goal": goal,
        }
        buffer = make_episode(rng, n, 1, 2, terminated=False, seed=i)
        rewards = np.zeros(n)
        rewards[-1] = 1.0
        buffers.append(replace(buffer, observations=observations, rewards=rewards))
    return create_dataset(
        dataset_id,
        buffers=buffers,
        observation_space=MAZE_SPACE,
        env="PointMaze_UMaze-v3",
        ref_scores=(0.0, 100.0),
        action_bound=1.0,
        act_dim=2,
    )


def within_half(achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
    """A sparse goal reward: 1 within 0.5 of the goal."""
    return (np.abs(achieved - desired)[..., 0] <= 0.5).astype(np.float64)
