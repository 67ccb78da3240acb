"""The PointMaze suite: gymnasium-robotics' mazes, D4RL maze2d's waypoint controller, Minari's
way of cutting a continuing task into episodes, and tiny builds checked with tolerances."""

from __future__ import annotations

import dataclasses
import itertools

import gymnasium as gym
import minari
import numpy as np
import pytest
from gymnasium.wrappers import FlattenObservation

from trajectory_transformer import suites
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.evaluation import check_env_matches, make_vector_env
from trajectory_transformer.suites import collect, pointmaze

pointmaze.import_gymnasium_robotics()

REFERENCE_EPISODES = 2
IDS = {"pointmaze/umaze-v0", "pointmaze/medium-v0", "pointmaze/large-v0"}


def suite(name: str = "umaze") -> collect.Suite:
    return pointmaze.SUITES[list(pointmaze.MAZES).index(name)]


def build(name: str = "umaze", **kwargs) -> minari.MinariDataset:
    kwargs = {"episodes": 3, "reference_episodes": REFERENCE_EPISODES} | kwargs
    return suite(name).build(f"pointmaze/{name}-v0", **kwargs)


def test_the_mazes_are_gymnasium_robotics_own():
    from gymnasium_robotics.envs.maze import maps

    expected = {"umaze": maps.U_MAZE, "medium": maps.MEDIUM_MAZE, "large": maps.LARGE_MAZE}
    for name, maze in pointmaze.MAZES.items():
        registered = gym.spec(maze.env_id)
        assert [list(row) for row in maze.maze_map] == expected[name]
        assert registered.kwargs["maze_map"] == expected[name]
        assert maze.time_limit == registered.max_episode_steps
        assert registered.entry_point == pointmaze.ENTRY_POINT
        assert maze.maze_map[maze.goal_cell[0]][maze.goal_cell[1]] == 0


def test_the_flat_layout_the_controller_reads_is_gymnasiums():
    env = FlattenObservation(gym.make("PointMaze_UMaze-v3"))
    assert env.unwrapped.observation_space == pointmaze.OBSERVATION_SPACE
    flat, _ = env.reset(seed=0)
    raw, _ = gym.make("PointMaze_UMaze-v3").reset(seed=0)
    np.testing.assert_allclose(flat[pointmaze.POSITION], raw["achieved_goal"])
    np.testing.assert_allclose(flat[pointmaze.GOAL], raw["desired_goal"])
    np.testing.assert_allclose(flat[pointmaze.VELOCITY], raw["observation"][2:])


@pytest.mark.parametrize("name", list(pointmaze.MAZES))
def test_every_next_cell_is_one_step_nearer_the_goal(name):
    maze = pointmaze.MAZES[name]
    walls = np.array(maze.maze_map) == 1
    table = pointmaze.WaypointController(maze, 0.0).next_cell
    free = np.flatnonzero(~walls.ravel())
    columns = walls.shape[1]
    for goal in free:
        for cell in free:
            steps, here = 0, cell
            while here != goal:
                nxt = table[goal, here]
                row, column = divmod(int(here), columns)
                assert abs(nxt // columns - row) + abs(nxt % columns - column) == 1
                assert not walls.ravel()[nxt]
                here, steps = nxt, steps + 1
                assert steps < free.size
    assert (table[np.ix_(free, free)] >= 0).all()


def test_the_controller_reaches_the_goal_and_stays_there():
    maze = pointmaze.MAZES["umaze"]
    env = FlattenObservation(gym.make(pointmaze.evaluation_env(maze)))
    controller = pointmaze.WaypointController(maze, 0.0)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=3)
    rewards = []
    for _ in range(maze.time_limit):
        obs, reward, terminated, truncated, _ = env.step(controller(obs[None], rng)[0])
        rewards.append(reward)
        assert not terminated
    assert truncated
    first = rewards.index(1.0)
    assert first < 200 and sum(rewards[first:]) > 0.9 * (len(rewards) - first)


def vector_eval_env(maze_name: str, num_envs: int) -> gym.vector.VectorEnv:
    maze = pointmaze.MAZES[maze_name]
    return gym.make_vec(
        pointmaze.evaluation_env(maze), num_envs, "sync", wrappers=[FlattenObservation]
    )


def test_the_behaviour_agent_without_noise_scores_the_reference_controllers_returns():
    # The agent plays the controller that `reference_scores` plays, through `evaluate`.
    from trajectory_transformer.evaluation import evaluate

    episodes = 3
    _, controller = pointmaze.reference_scores("umaze", 0, episodes)
    agent = pointmaze.BehaviourAgent("umaze", noise=0.0)
    first = collect.evaluation_seeds(0, episodes)[0]
    result = evaluate(agent, vector_eval_env("umaze", 2), episodes, seed=first, progress=False)
    np.testing.assert_allclose(np.mean(result.returns), controller, atol=1.0)


def test_returns_from_starts_plays_the_episodes_that_tt_eval_plays():
    # scripts/maze_starts.py scores the controller over tt-eval's seeds 0, 1, ... with it.
    from trajectory_transformer.evaluation import evaluate

    controller = pointmaze.WaypointController(pointmaze.MAZES["umaze"], 0.0)
    starts = pointmaze.returns_from_starts("umaze", {"controller": controller}, range(3))
    agent = pointmaze.BehaviourAgent("umaze", noise=0.0)
    result = evaluate(agent, vector_eval_env("umaze", 2), 3, seed=0, progress=False)
    np.testing.assert_allclose(np.mean(result.returns), starts["controller"], atol=1.0)


def test_a_controller_plays_the_same_episodes_alike_when_it_played_them_before():
    # Its rows' state would carry the last episode's waypoint into a new one toward the same
    # goal: the rollout has each row start afresh.
    controller = pointmaze.WaypointController(pointmaze.MAZES["umaze"], 0.0)
    policies = {"controller": controller}
    first = pointmaze.returns_from_starts("umaze", policies, range(2))["controller"]
    again = pointmaze.returns_from_starts("umaze", policies, range(2))["controller"]
    np.testing.assert_allclose(again, first, atol=1e-9)


def test_a_behaviour_episode_plays_alike_in_any_slot_and_the_seed_draws_its_noise():
    from trajectory_transformer.evaluation import evaluate

    def returns(num_envs: int, seed: int) -> list[float]:
        agent = suites.behaviour_agent("pointmaze/umaze-v0", seed)
        env = vector_eval_env("umaze", num_envs)
        return evaluate(agent, env, 3, seed=5, progress=False).returns

    one_slot = returns(1, seed=0)
    np.testing.assert_allclose(returns(3, seed=0), one_slot, atol=1e-9)
    assert not np.allclose(returns(3, seed=1), one_slot)


def test_only_a_dataset_of_one_playable_policy_has_a_behaviour_agent():
    assert isinstance(suites.behaviour_agent("pointmaze/large-v0"), pointmaze.BehaviourAgent)
    with pytest.raises(ValueError, match="pointmaze/umaze-v0"):
        suites.behaviour_agent("hopper/medium-replay-v0")


def test_a_tiny_build_is_a_dict_dataset_of_episodes_that_end_at_their_goal():
    dataset = build(seed=3)
    assert dataset.total_episodes == 3
    assert dataset.observation_space == pointmaze.OBSERVATION_SPACE
    episodes = list(dataset.iterate_episodes())
    for episode in episodes:
        n = len(episode.rewards)
        assert episode.observations["observation"].shape == (n + 1, 4)
        np.testing.assert_array_equal(episode.rewards[:-1], 0.0)
        assert episode.rewards[-1] == 1.0
        assert not episode.terminations.any()
        assert episode.truncations[-1] and not episode.truncations[:-1].any()
        goal = episode.observations["desired_goal"]
        np.testing.assert_array_equal(goal[:-1], np.broadcast_to(goal[0], goal[:-1].shape))
        reached = np.linalg.norm(episode.observations["achieved_goal"][-1] - goal[0])
        assert reached <= pointmaze.GOAL_RADIUS
    # One continuing trajectory: each episode starts where the last one reached its goal,
    # with the next goal (already in the last one's final observation).
    for before, after in itertools.pairwise(episodes):
        for key in ("achieved_goal", "desired_goal", "observation"):
            np.testing.assert_array_equal(after.observations[key][0], before.observations[key][-1])
        assert (
            np.linalg.norm(
                after.observations["desired_goal"][0] - before.observations["desired_goal"][0]
            )
            > pointmaze.GOAL_RADIUS
        )
    seeds = [m.get("seed") for m in dataset.storage.get_episode_metadata(range(3))]
    assert seeds[0] == 3 * collect.SEED_BLOCK + collect.KIND_BLOCK and seeds[1:] == [None, None]


def test_the_metadata_holds_the_recipe_the_reference_scores_and_the_evaluation_env():
    dataset = build()
    metadata = dataset.storage.metadata
    recipe = metadata["recipe"]
    assert recipe["continuing_task"] is True and recipe["reset_target"] is True
    assert recipe["action_noise_std"] == pointmaze.NOISE and recipe["terminations"] == 0
    assert "truncation at the step that reaches the goal" in recipe["episode_end"]
    assert recipe["evaluation"]["reset_target"] is False
    low, high = pointmaze.reference_scores("umaze", 0, REFERENCE_EPISODES)
    np.testing.assert_allclose([metadata["ref_min_score"], metadata["ref_max_score"]], [low, high])
    assert metadata["num_episodes_average_score"] == REFERENCE_EPISODES
    behaviour = metadata["behaviour_policy"]
    np.testing.assert_allclose(behaviour["return"], pointmaze.behaviour_score("umaze", 0, 2))
    assert metadata["requirements"] == ["gymnasium-robotics>=1.4"]
    for words in ("continuing_task=True", "reset_target=False", "truncation", "behaviour"):
        assert words in metadata["description"]
    eval_env = gym.envs.registration.EnvSpec.from_json(metadata["eval_env_spec"])
    assert eval_env.kwargs["reset_target"] is False and eval_env.max_episode_steps == 300
    assert eval_env.kwargs["maze_map"][1][1] == "g"
    assert dataset.spec.env_spec.kwargs["reset_target"] is True


def test_reference_scores_rank_random_below_the_noisy_below_the_clean_controller():
    low, high = pointmaze.reference_scores("umaze", 0, 6)
    behaviour = pointmaze.behaviour_score("umaze", 0, 6)
    # Typical values over 50 episodes: 10, 175 and 137; wide margins for any CPU's arithmetic.
    assert low < 60 < 100 < high
    assert low < behaviour <= high + 20


def test_deterministic_given_a_seed(tmp_path, monkeypatch):
    def build_in(folder: str, seed: int) -> list:
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / folder))
        return list(build(seed=seed).iterate_episodes())

    first, again, other = build_in("a", 0), build_in("b", 0), build_in("c", 1)
    for a, b in zip(first, again, strict=True):
        for key in a.observations:
            np.testing.assert_allclose(
                a.observations[key], b.observations[key], rtol=1e-6, atol=1e-8
            )
        np.testing.assert_allclose(a.actions, b.actions, rtol=1e-6, atol=1e-8)
        np.testing.assert_array_equal(a.rewards, b.rewards)
    assert not np.allclose(
        first[0].observations["desired_goal"][0], other[0].observations["desired_goal"][0]
    )


def test_the_trajectory_replays_from_its_reset_seed_in_a_plain_env():
    """Observations, rewards and goal changes at every index belong together: the stored
    actions, replayed from the first episode's reset seed, give the stored trajectory."""
    dataset = build(episodes=2)
    episodes = list(dataset.iterate_episodes())
    (first,) = dataset.storage.get_episode_metadata([0])
    seed = first["seed"]
    maze = pointmaze.MAZES["umaze"]
    env = pointmaze.ShowCurrentGoal(gym.make(pointmaze.collection_env(maze, 10_000)))
    obs, _ = env.reset(seed=seed)
    for episode in episodes:
        for key in obs:
            np.testing.assert_allclose(episode.observations[key][0], obs[key], atol=1e-8)
        for t, action in enumerate(episode.actions):
            obs, reward, *_ = env.step(action)
            assert reward == episode.rewards[t]
            for key in obs:
                np.testing.assert_allclose(
                    episode.observations[key][t + 1], obs[key], rtol=1e-6, atol=1e-8
                )


def test_the_stream_is_cut_at_each_goal_and_its_unfinished_end_dropped():
    rewards = np.array([0, 0, 1, 0, 1, 0, 0], dtype=np.float64)
    n = len(rewards)
    stream = collect.Rollout(
        (7,),
        (np.arange(n + 1, dtype=np.float64)[:, None],),
        (np.zeros((n, 2), dtype=np.float32),),
        (rewards,),
        (np.zeros(n, dtype=bool),),
        (np.eye(n, dtype=bool)[-1],),
    )
    episodes = pointmaze.split_at_goals(stream)
    assert episodes.seeds == (7, None)
    assert [o[:, 0].tolist() for o in episodes.observations] == [[0, 1, 2, 3], [3, 4, 5]]
    assert [t.tolist() for t in episodes.truncations] == [[False, False, True], [False, True]]
    assert not any(t.any() for t in episodes.terminations)


def test_training_builds_it_on_first_use_and_its_eval_env_fits(monkeypatch):
    small = dataclasses.replace(suite(), reference_episodes=2)
    monkeypatch.setattr(suites, "SUITES", (small,))
    monkeypatch.setitem(pointmaze.TRANSITIONS, "umaze", 3000)
    episodes, info = load_episodes("pointmaze/umaze-v0")
    assert info.observation_layout == (
        ("achieved_goal", (2,)),
        ("desired_goal", (2,)),
        ("observation", (4,)),
    )
    assert (info.observation_dim, info.action_dim) == (8, 2)
    assert info.eval_env_id == "PointMaze_UMaze-v3"
    assert not episodes.terminated.any() and episodes.truncated.sum() == episodes.num_episodes
    np.testing.assert_allclose(episodes.episode_returns(), 1.0)
    assert 2000 < episodes.num_transitions <= 3000  # ten trajectories less their unfinished ends
    env = make_vector_env(info, 2)
    check_env_matches(info, env)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 8)
    env.close()


def test_the_registry_holds_the_three_mazes():
    assert set(suites.EMBEDDED_DATASETS) >= IDS
    assert all(suites.suite_of(d) in pointmaze.SUITES for d in IDS)
    assert suites.EMBEDDED_DATASETS["pointmaze/medium-v0"].startswith("PointMaze_Medium-v3")
