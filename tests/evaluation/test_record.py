import gymnasium as gym
import numpy as np
import pytest
import torch

from trajectory_transformer.evaluation import (
    EpisodeRecord,
    PlanningAgent,
    evaluate,
    make_vector_env,
    record_episode,
    render_observations,
)
from trajectory_transformer.evaluation.envs import make_env
from trajectory_transformer.evaluation.video import set_state_from_observation
from trajectory_transformer.planning import BeamPlanner


def small_planner(checkpoint) -> BeamPlanner:
    return BeamPlanner.from_checkpoint(
        checkpoint, beam_width=4, horizon=2, context_transitions=1, n_expand=2
    )


def test_evaluate_records_the_first_episode_with_its_plans(tiny_checkpoint):
    planner = small_planner(tiny_checkpoint)
    env = make_vector_env(planner.dataset, 2, max_episode_steps=5)
    record = EpisodeRecord(plan_steps=(0, 3, 99))
    result = evaluate(planner, env, episodes=3, seed=7, progress=False, observers=[record])
    env.close()

    episode = result.seeds.index(7)  # the second wave (seed 9) must not overwrite it
    assert record.seed == 7 and len(record) == result.lengths[episode] == 5
    assert len(record.observations) == 6 and len(record.predicted_values) == 5
    assert sum(record.rewards) == pytest.approx(result.returns[episode])
    assert sorted(record.plans) == [0, 3]  # step 99 never came
    snapshot = record.plans[3]
    assert snapshot.plan.tokens.shape[0] == 1  # env 0 only
    # The search starts from the real current observation, after one real transition.
    observation = snapshot.plan.tokens[0, snapshot.best, 0, :3]
    assert torch.equal(observation, snapshot.context[-3:]) and len(snapshot.context) == 6 + 3
    encoded = planner.discretizer.encode(torch.as_tensor(record.observations[3]), slice(0, 3))
    assert torch.equal(observation, encoded)
    # What was executed is the chosen plan's first action; its predictions were kept.
    np.testing.assert_allclose(record.actions[3], snapshot.plan.actions[0, 0].numpy(), rtol=1e-6)
    best_reward = snapshot.plan.rewards[0, snapshot.best, 0]
    assert record.predicted_rewards[3] == pytest.approx(float(best_reward))


class ZeroAgent:
    def reset(self, num_envs, seed=None):
        self.num_envs = num_envs

    def act(self, observations, active=None):
        return np.zeros((self.num_envs, 1), dtype=np.float32)

    def observe(self, rewards, dones):
        pass


def test_an_agent_without_plans_records_steps_only(tiny_checkpoint):
    planner = small_planner(tiny_checkpoint)
    thunk = make_env(planner.dataset, max_episode_steps=4)
    assert isinstance(planner, PlanningAgent) and not isinstance(ZeroAgent(), PlanningAgent)
    record = record_episode(ZeroAgent(), thunk, seed=3, plan_steps=(0,))
    assert len(record) == 4 and record.plans == {}
    assert np.isnan(record.predicted_rewards).all()
    assert record.frames == []


def test_plan_every_keeps_only_the_steps_that_replanned(tiny_checkpoint):
    planner = BeamPlanner.from_checkpoint(
        tiny_checkpoint, beam_width=3, horizon=2, context_transitions=1, plan_every=2
    )
    record = record_episode(planner, make_env(planner.dataset, max_episode_steps=5), seed=0)
    replanned = ~np.isnan(record.predicted_rewards)
    assert replanned.tolist() == [True, False, True, False, True]


def test_value_targets_are_the_trained_reward_to_go():
    record = EpisodeRecord()
    record.rewards, record.terminated = [1.0, 2.0, 3.0], True
    np.testing.assert_allclose(record.reward_targets(-100.0), [1.0, 2.0, -97.0])
    # V_t = sum_{k>t} discount^(k-t-1) r_k, with the terminal penalty on the last reward.
    expected = [2.0 + 0.5 * -97.0, -97.0, 0.0]
    np.testing.assert_allclose(record.value_targets(0.5, -100.0), expected)
    record.terminated = False  # truncated: no penalty
    np.testing.assert_allclose(record.value_targets(0.5, -100.0), [2.0 + 1.5, 3.0, 0.0])


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "HalfCheetah-v5", "Hopper-v5"])
def test_state_set_from_an_observation_reproduces_it(env_id, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warnings to MUJOCO_LOG.TXT here
    source, target = gym.make(env_id), gym.make(env_id)
    source.reset(seed=1)
    for _ in range(5):  # move away from the reset distribution
        observation, *_ = source.step(source.action_space.sample())
    target.reset(seed=2)
    assert set_state_from_observation(target, observation)
    np.testing.assert_allclose(target.unwrapped._get_obs(), observation, rtol=1e-5, atol=1e-6)


def test_imagined_frames_render_where_the_state_can_be_set():
    pytest.importorskip("pygame", reason="Pendulum draws its frames with pygame (the test extra)")
    pendulum = gym.make("Pendulum-v1", render_mode="rgb_array")
    pendulum.reset(seed=0)
    observations = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.5]], dtype=np.float32)
    frames = render_observations(pendulum, observations, np.array([[1.0], [-1.0]]))
    assert len(frames) == 2 and frames[0].shape[-1] == 3
    assert not np.array_equal(frames[0], frames[1])  # different angles, different pictures
    cartpole = gym.make("CartPole-v1", render_mode="rgb_array")
    cartpole.reset(seed=0)
    assert render_observations(cartpole, np.zeros((2, 4))) is None
