import json

import gymnasium as gym
import numpy as np
import pytest

from trajectory_transformer.data.minari_source import DatasetInfo
from trajectory_transformer.evaluation import (
    EnvMismatchError,
    EpisodeJournal,
    JournalMismatchError,
    check_env_matches,
    evaluate,
    make_vector_env,
    normalized_score,
)


class CountdownEnv(gym.Env):
    """Terminates after `3 + seed % 4` steps; reward 1 per step, observation = step count."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.limit = 3 + (seed or 0) % 4
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(1, self.t, np.float32), 1.0, self.t >= self.limit, False, {}


class RecordingAgent:
    def __init__(self):
        self.resets, self.starts, self.calls, self.dones = [], [], 0, []

    def reset(self, num_envs, seed=None):
        self.resets.append((num_envs, seed))

    def reset_env(self, env, seed=None):
        self.starts.append((env, seed))

    def act(self, observations, active=None):
        self.calls += 1
        self.active = active.copy()
        return np.zeros((len(observations), 1), np.float32)

    def observe(self, rewards, dones):
        self.dones.append(dones.copy())


def test_episodes_are_seeded_in_order_and_scored():
    env = gym.vector.SyncVectorEnv([CountdownEnv] * 3)
    agent = RecordingAgent()
    result = evaluate(agent, env, episodes=5, seed=10, ref_scores=(0.0, 10.0), progress=False)
    assert sorted(result.seeds) == [10, 11, 12, 13, 14]
    by_seed = dict(zip(result.seeds, result.returns, strict=True))
    # Each episode's return counts only its own steps, although envs finish at different times.
    assert by_seed == {s: float(3 + s % 4) for s in range(10, 15)}
    assert result.lengths == [int(r) for r in result.returns]
    np.testing.assert_allclose(result.normalized_scores, np.array(result.returns) * 10)
    # Limits 5, 6, 3, 4, 5: seed 13 starts in the slot of seed 12 as soon as it ends (step 3),
    # seed 14 in the slot of seed 10 (step 5); the run ends with seed 14, after 10 steps.
    assert agent.resets == [(3, None)]
    assert agent.starts == [(0, 10), (1, 11), (2, 12), (2, 13), (0, 14)]
    assert agent.calls == 10
    assert result.env_steps == sum(result.lengths)
    summary = result.summary()
    assert summary["return_mean"] == pytest.approx(np.mean(result.returns))
    assert summary["return_stderr"] == pytest.approx(np.std(result.returns, ddof=1) / np.sqrt(5))
    assert summary["normalized_score_mean"] == pytest.approx(10 * np.mean(result.returns))


def test_at_the_tail_finished_envs_stay_in_the_batch_masked():
    env = gym.vector.SyncVectorEnv([CountdownEnv] * 2)
    agent = RecordingAgent()
    result = evaluate(agent, env, episodes=2, seed=0, progress=False)  # limits 3 and 4
    assert agent.calls == 4  # no episode left to start: the batch runs out its longest one
    assert agent.active.tolist() == [False, True]
    assert result.returns == [3.0, 4.0]


class GoalLineEnv(gym.Env):
    """A point on a line stepping by its action, its goal at 3, `success` (as a goal env's
    info) within 0.5 of it, rewarded 1 per success; 8 steps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = 0.0, 0
        return np.zeros(1, np.float32), {"success": False}

    def step(self, action):
        self.x += float(action[0])
        self.t += 1
        success = abs(self.x - 3.0) <= 0.5
        observation = np.full(1, self.x, np.float32)
        return observation, float(success), False, self.t >= 8, {"success": success}


class GoalLineAgent(RecordingAgent):
    """Steps 1 towards the goal until it is there, then `after` (0: stays, 1: goes on)."""

    def __init__(self, after: float):
        super().__init__()
        self.after = after

    def act(self, observations, active=None):
        x = observations[:, :1]
        return np.where(x >= 3.0, self.after, 1.0).astype(np.float32)


@pytest.mark.parametrize("after, at_goal", [(0.0, 6), (1.0, 1)])
def test_goal_envs_report_when_the_goal_was_reached_and_how_long_it_was_held(after, at_goal):
    env = gym.vector.SyncVectorEnv([GoalLineEnv] * 2)
    result = evaluate(GoalLineAgent(after), env, episodes=3, progress=False)
    # At the goal after the third step (step 2), then the 6 steps from there, or only that one.
    assert result.first_success_steps == [2, 2, 2]
    assert result.success_steps == [at_goal] * 3
    held = at_goal / 6
    summary = result.summary()
    assert summary["reached_fraction"] == 1.0
    assert summary["stayed_fraction"] == pytest.approx(held)
    assert f"then held {held:.0%} of the steps" in result.line()
    # Envs without `success` say nothing of goals.
    plain = evaluate(RecordingAgent(), gym.vector.SyncVectorEnv([CountdownEnv]), 1, progress=False)
    assert plain.first_success_steps is None and "goal" not in plain.line()


def test_no_reference_scores_says_why(tmp_path):
    env = gym.vector.SyncVectorEnv([CountdownEnv])
    result = evaluate(RecordingAgent(), env, episodes=1, progress=False)
    assert result.normalized_scores is None and "ref_min_score" in result.line()
    result.write(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["normalized_score_mean"] is None


def test_normalized_score_is_the_d4rl_scale():
    np.testing.assert_allclose(normalized_score(np.array([-1000.0, -100.0]), -1000, -100), [0, 100])
    assert normalized_score(np.array([1.0]), None, 5.0) is None


def pendulum_info(obs_dim=3, low=-2.0):
    return DatasetInfo(
        "pendulum/x-v0", None, "Pendulum-v1", obs_dim, 1, [low], [2.0], -1200.0, -150.0, 1, 200
    )


def test_env_that_matches_the_checkpoint_is_accepted():
    env = make_vector_env(pendulum_info(), 2, max_episode_steps=5)
    check_env_matches(pendulum_info(), env)
    assert env.num_envs == 2


def test_env_with_other_shapes_is_refused_with_what_differs():
    env = make_vector_env(pendulum_info(), 1, env_id="MountainCarContinuous-v0")
    with pytest.raises(EnvMismatchError, match=r"observations: checkpoint \(3,\), env Box\(2,\)"):
        check_env_matches(pendulum_info(), env)
    with pytest.raises(EnvMismatchError, match="action bounds"):
        check_env_matches(pendulum_info(low=-1.0), make_vector_env(pendulum_info(), 1))


def test_every_episode_draws_from_a_stream_of_its_own_seed(tiny_checkpoint):
    from trajectory_transformer.planning import BeamPlanner

    planner = BeamPlanner.from_checkpoint(
        tiny_checkpoint, horizon=2, beam_width=3, context_transitions=2
    )
    streams = {}
    reset_env = planner.reset_env

    def reset_env_and_look(env, seed=None):
        reset_env(env, seed)
        streams[seed] = planner.generators[env].get_state()

    planner.reset_env = reset_env_and_look
    env = make_vector_env(planner.dataset, 2, max_episode_steps=3)
    try:
        evaluate(planner, env, episodes=6, seed=0, progress=False)
    finally:
        env.close()
    assert sorted(streams) == list(range(6))
    # Episode i and episode i + 2 (the same slot, next) are not driven by one stream.
    assert not any(streams[i].equal(streams[j]) for i in range(6) for j in range(i))
    reset_env(1, 4)
    assert planner.generators[1].get_state().equal(streams[4])


# --- a vector rollout of terminating envs: every episode scored once, on its own rewards ---


class FallingEnv(gym.Env):
    """Falls (terminates) after a seed-dependent 1 to 8 steps, unless its time limit (6 steps,
    a truncation) comes first. Rewards are drawn from the seed and differ at every step but do
    not depend on the action, so an episode's return is known without replaying the agent;
    observations and actions have Pendulum's shapes, so the tiny checkpoint plans here."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    limit = 6

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # an autoreset (seed None) continues the seed's stream
        self.fall = int(self.np_random.integers(1, 9))
        self.t = 0
        return self._observation(0.0), {}

    def step(self, action):
        self.t += 1
        reward = float(self.np_random.uniform(1.0, 2.0))
        terminated = self.t >= self.fall
        truncated = self.t >= self.limit and not terminated
        return self._observation(reward), reward, terminated, truncated, {}

    def _observation(self, reward):
        return np.array([self.t, self.fall, reward], np.float32)


def reference_episode(seed: int) -> tuple[float, int, bool]:
    """(return, length, terminated) of the episode of `seed`, played alone."""
    env = FallingEnv()
    env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(np.zeros(1, np.float32))
        total, steps, done = total + reward, steps + 1, terminated or truncated
    return total, steps, terminated


def check_every_episode_scored_once(result, seeds: list[int], steps_cut_short=False) -> None:
    """`steps_cut_short`: the evaluation was interrupted, and the env-steps of the episodes it
    cut, up to the last one finished before, count with the others'."""
    assert len(result.returns) == len(result.lengths) == len(seeds)
    assert sorted(result.seeds) == seeds  # each episode once, none twice, no filler env
    for seed, ret, length in zip(result.seeds, result.returns, result.lengths, strict=True):
        total, steps, _ = reference_episode(seed)
        assert length == steps, f"seed {seed}: {length} steps scored, the episode has {steps}"
        assert ret == pytest.approx(total, rel=1e-12), f"seed {seed}: {ret} against {total}"
    if steps_cut_short:
        assert result.env_steps > sum(result.lengths)
    else:
        assert result.env_steps == sum(result.lengths)


SEEDS = list(range(100, 107))  # 7 episodes on 3 envs


def test_the_falling_env_mixes_early_falls_and_truncations():
    # What the rollout tests below rely on: in every wave an env ends at least two steps
    # before another, so it is stepped into a new episode (an autoreset, then real rewards)
    # while the wave goes on; and some episodes fall, others are cut by the time limit.
    episodes = {seed: reference_episode(seed) for seed in SEEDS}
    for wave in (SEEDS[0:3], SEEDS[3:6]):
        lengths = [episodes[seed][1] for seed in wave]
        assert max(lengths) - min(lengths) >= 2, lengths
    assert {terminated for _, _, terminated in episodes.values()} == {True, False}


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP", "DISABLED"])
def test_a_vector_rollout_of_falling_envs_scores_every_episode_once(mode):
    # Whatever the vector env does with a finished env (resets it at the next step, at the
    # same step, or not at all), the steps after an episode's end count in no score.
    env = gym.vector.SyncVectorEnv(
        [FallingEnv] * 3, autoreset_mode=getattr(gym.vector.AutoresetMode, mode)
    )
    agent = RecordingAgent()
    result = evaluate(agent, env, episodes=len(SEEDS), seed=SEEDS[0], progress=False)
    env.close()
    check_every_episode_scored_once(result, SEEDS)
    assert len(set(result.lengths)) > 2
    assert agent.starts == [(0, 100), (1, 101), (2, 102), *agent.starts[3:]]
    assert sorted(seed for _, seed in agent.starts) == SEEDS


def test_the_planner_in_a_vector_rollout_of_falling_envs_scores_every_episode_once(
    tiny_checkpoint,
):
    from trajectory_transformer.planning import BeamPlanner

    planner = BeamPlanner.from_checkpoint(
        tiny_checkpoint, horizon=2, beam_width=3, context_transitions=2, plan_every=2
    )
    acted = []
    act = planner.act

    def act_and_look(observations, active=None):
        actions = act(observations, active)
        acted.append((observations.copy(), active.copy(), actions))
        return actions

    planner.act = act_and_look
    env = make_vector_env(planner.dataset, 3, env_id="test/Falling-v0")
    try:
        result = evaluate(planner, env, episodes=len(SEEDS), seed=SEEDS[0], progress=False)
    finally:
        env.close()
    check_every_episode_scored_once(result, SEEDS)
    # Finished envs were masked: they got no action, and no plan was made for them.
    for _, active, actions in acted:
        assert not actions[~active].any()
        assert np.abs(actions[active]).max() <= 2.0


class SteeredFallingEnv(FallingEnv):
    """FallingEnv whose rewards also count the action: returns tell what the agent did."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward + float(action[0]), terminated, truncated, info


def test_an_episode_plays_alike_whatever_the_number_of_envs(tiny_checkpoint):
    """A sampled planner's per-episode returns do not depend on `num_envs`: each episode draws
    from its own seed's stream, whichever slot plays it and whoever plays beside it."""
    from trajectory_transformer.planning import BeamPlanner

    planner = BeamPlanner.from_checkpoint(
        tiny_checkpoint, horizon=2, beam_width=3, context_transitions=2, seed=4
    )
    returns = {}
    for num_envs in (1, 2, 3):
        env = make_vector_env(planner.dataset, num_envs, env_id="test/SteeredFalling-v0")
        try:
            result = evaluate(planner, env, episodes=len(SEEDS), seed=SEEDS[0], progress=False)
        finally:
            env.close()
        returns[num_envs] = dict(zip(result.seeds, result.returns, strict=True))
        assert sorted(returns[num_envs]) == SEEDS
    assert returns[1] == returns[2] == returns[3]
    played_alone = [reference_episode(seed)[0] for seed in SEEDS]  # zero actions
    assert [returns[1][seed] for seed in SEEDS] != pytest.approx(played_alone)


gym.register("test/Falling-v0", entry_point=FallingEnv)
gym.register("test/SteeredFalling-v0", entry_point=SteeredFallingEnv)


# --- an interrupted evaluation continues from its journal ---


class InterruptedAgent(RecordingAgent):
    """Stops the evaluation (as Ctrl-C would) at its `stop_at`-th action."""

    def __init__(self, stop_at: int):
        super().__init__()
        self.stop_at = stop_at

    def act(self, observations, active=None):
        if self.calls + 1 == self.stop_at:
            raise KeyboardInterrupt
        return super().act(observations, active)


def test_an_interrupted_evaluation_plays_only_the_episodes_it_had_not_finished(tmp_path):
    path = tmp_path / "episodes.jsonl"
    env = gym.vector.SyncVectorEnv([FallingEnv] * 3)

    def run(agent):  # the same evaluation, on its journal as the file holds it
        journal = EpisodeJournal(path, {"checkpoint": "model.pt", "planner": {"beam": 4}})
        return evaluate(agent, env, len(SEEDS), SEEDS[0], progress=False, journal=journal)

    with pytest.raises(KeyboardInterrupt):
        run(InterruptedAgent(stop_at=7))
    first = EpisodeJournal(path, {"checkpoint": "model.pt", "planner": {"beam": 4}}).finished
    assert 0 < len(first) < len(SEEDS)

    agent = RecordingAgent()
    result = run(agent)
    # The recorded episodes and the new ones, each scored once on its own rewards.
    check_every_episode_scored_once(result, SEEDS, steps_cut_short=True)
    played = sorted(seed for _, seed in agent.starts)
    assert played == sorted(set(SEEDS) - set(first))  # none played twice
    assert result.seeds[: len(first)] == sorted(first)

    # Once complete, the same evaluation plays nothing: its results come from the journal.
    agent = RecordingAgent()
    again = run(agent)
    env.close()
    assert agent.calls == 0 and sorted(again.seeds) == SEEDS
    assert again.returns == [result.returns[result.seeds.index(s)] for s in again.seeds]
    assert again.env_steps == result.env_steps
    assert again.planning_seconds == pytest.approx(result.planning_seconds)  # summed otherwise


def test_a_journal_of_another_evaluation_is_refused_and_a_cut_line_is_replayed(tmp_path):
    path = tmp_path / "episodes.jsonl"
    journal = EpisodeJournal(path, {"checkpoint": "a.pt", "planner": {"horizon": 5}})
    for seed in (3, 4):
        journal.append(
            {
                "seed": seed,
                "return": 1.0,
                "length": 2,
                "planning_seconds": 0.1,
                "env_steps": 2,
                "wall_seconds": 0.2,
            }
        )
    with pytest.raises(JournalMismatchError, match=r"differs in planner\).*hydra\.run\.dir"):
        EpisodeJournal(path, {"checkpoint": "a.pt", "planner": {"horizon": 15}})
    with open(path, "a") as file:
        file.write('{"seed": 5, "ret')  # a crash in the middle of a line
    journal = EpisodeJournal(path, {"checkpoint": "a.pt", "planner": {"horizon": 5}})
    assert sorted(journal.finished) == [3, 4]
    # Episodes finished after the crash read back: the cut line is gone, not in their way.
    journal.append(
        {
            "seed": 5,
            "return": 1.0,
            "length": 2,
            "planning_seconds": 0.1,
            "env_steps": 2,
            "wall_seconds": 0.2,
        }
    )
    again = EpisodeJournal(path, {"checkpoint": "a.pt", "planner": {"horizon": 5}})
    assert sorted(again.finished) == [3, 4, 5]
