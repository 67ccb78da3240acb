"""Does a goal-conditioned model's value rank states by how far they are from the goal?

    python scripts/goal_value_ranking.py <run dir, model.pt, pretrained:<id> or critic.pt> ... \
        [--labels <name> ...] --record planner-scores/<name>

Along the dataset's own episodes that reach their goal (the last reward positive: a
goal-reaching dataset's episodes end there), pairs of states `horizon` steps apart are drawn
(`--pairs` in all, from `--seed`), and each state's value is what the search would read there:
the model's expected value token after the state and its most likely action, with no context
(`BeamPlanner`, horizon 1, one beam, greedy). A search of `horizon` transitions prefers the
later state of a pair only where the value rises from the earlier one, as the controller that
made the data is always getting closer. The table gives, for each model and by steps left to
the goal, the share of pairs whose value rises, and the mean value against the data's own
value target (`episodes.joint_transitions`: the discounted reward-to-go), which tells a value
that is right on average but too imprecise to rank from one that is wrong. Models of one
dataset are valued on the same pairs.

A critic (`critic.pt` of tt-train-critic) is valued by its V(s). Trained on hindsight goals
(`critic.relabel_goals`), arriving is worth staying at the goal for good, 1 / (1 - discount)
of a model's value: its mean value is given times (1 - discount), in the model's units.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from render_results import RECORDS, write_measured

from trajectory_transformer import BeamPlanner
from trajectory_transformer.checkpoint import value_targets_of
from trajectory_transformer.critic.model import CRITIC_FORMAT, IQLCritic, load_critic
from trajectory_transformer.data.episodes import Episodes, joint_transitions
from trajectory_transformer.data.minari_source import load_episodes

BUCKETS = (0, 30, 80, 160, 300)
"""Lower edges of the steps-left buckets (the last one open)."""
BATCH = 512


def draw_pairs(
    starts: np.ndarray,
    lengths: np.ndarray,
    reached: np.ndarray,
    horizon: int,
    pairs: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`pairs` rows (t, t + horizon) of transitions within episodes that reach their goal and
    hold more than `horizon` transitions, drawn uniformly over such rows; and each pair's steps
    left from t to the episode's end."""
    eligible = np.flatnonzero(reached & (lengths > horizon))
    if len(eligible) == 0:
        raise SystemExit(
            f"no episode both reaches its goal and holds more than {horizon} transitions"
        )
    per_episode = lengths[eligible] - horizon  # first rows each episode can pair
    rng = np.random.default_rng(seed)
    choice = rng.choice(int(per_episode.sum()), size=pairs, replace=pairs > per_episode.sum())
    ends = np.cumsum(per_episode)
    episode = np.searchsorted(ends, choice, side="right")
    offset = choice - (ends - per_episode)[episode]
    first = starts[eligible][episode] + offset
    left = lengths[eligible][episode] - offset
    return np.stack([first, first + horizon], axis=1), left


def values_at(planner: BeamPlanner, observations: np.ndarray) -> np.ndarray:
    """The search's value at each observation: the expected value token after it and the
    model's most likely action, with no context."""
    out = []
    for begin in range(0, len(observations), BATCH):
        batch = torch.as_tensor(observations[begin : begin + BATCH], dtype=torch.float32)
        planner.reset(len(batch), seed=0)
        out.append(planner.plan(batch).values[:, 0, 0])
    return torch.cat(out).cpu().numpy()


def ranking_rows(
    value_now: np.ndarray, value_later: np.ndarray, truth: np.ndarray, left: np.ndarray
) -> list[list[str]]:
    """One row per bucket of steps left (`BUCKETS`, from `left`, each pair's first state): the
    pairs in it, the share whose value rises, the mean value now and its target (`truth`)."""
    rows = []
    for low, high in zip(BUCKETS, (*BUCKETS[1:], None), strict=True):
        chosen = (left >= low) & (left < high if high is not None else True)
        if not chosen.any():
            continue
        rises = float((value_later[chosen] > value_now[chosen]).mean())
        label = f"{low}-{high}" if high is not None else f"{low} or more"
        rows.append(
            [
                label,
                f"{int(chosen.sum()):,}",
                f"{100 * rises:.0f}%",
                f"{value_now[chosen].mean():.3f}",
                f"{truth[chosen].mean():.3f}",
            ]
        )
    return rows


def write_record(name: str, rows: list[list[str]], horizon: int) -> Path:
    """The table as the results record `name` (docs/results/records/<name>.json)."""
    path = RECORDS / f"{name}.json"
    columns = [
        "model",
        "steps left to the goal",
        "pairs",
        f"value rises over {horizon} steps",
        "mean value",
        "mean value target",
    ]
    note = "The dataset's own episodes and goals; the same pairs for every model."
    title = "How the value ranks states on the way to the goal"
    write_measured(path, title, "goal_value_ranking.py", note, columns, rows)
    return path


def critic_values_at(critic: IQLCritic, observations: np.ndarray) -> np.ndarray:
    """The critic's V at each observation."""
    with torch.no_grad():
        return critic.value(torch.as_tensor(observations, dtype=torch.float32)).numpy()


def is_critic(checkpoint: str) -> bool:
    path = Path(checkpoint)
    if not path.is_file():
        return False
    return torch.load(path, map_location="cpu", weights_only=True).get("kind") == CRITIC_FORMAT


def ranking_of(
    checkpoint: str, horizon: int, pairs: int, seed: int, episodes_of: Callable[[str], Episodes]
) -> list[list[str]]:
    """The table's rows for one checkpoint, on its own dataset's episodes (`episodes_of(id)`)."""
    if is_critic(checkpoint):
        loaded = load_critic(checkpoint, "cpu")
        dataset_id, critic = loaded.dataset.dataset_id, loaded.critic
        discount, penalty = critic.discount, critic.terminal_penalty
        to_model = 1.0 - discount if loaded.config["critic"].get("relabel_goals", 0.0) else 1.0
        value_of = lambda obs: to_model * critic_values_at(critic, obs)  # noqa: E731
    else:
        planner = BeamPlanner.from_checkpoint(
            checkpoint,
            horizon=1,
            beam_width=1,
            n_expand=1,
            context_transitions=0,
            deterministic=True,
            # A pretrained maze model comes with its hold at the goal, which samples actions.
            goal_radius=None,
            goal_velocity=None,
        )
        if planner.dataset is None:
            raise SystemExit(f"{checkpoint} records no dataset to draw the episodes from")
        dataset_id = planner.dataset.dataset_id
        discount, penalty = value_targets_of(planner.training_config)
        value_of = functools.partial(values_at, planner)
    episodes = episodes_of(dataset_id)
    reached = episodes.rewards[episodes.starts + episodes.lengths - 1] > 0
    rows, left = draw_pairs(episodes.starts, episodes.lengths, reached, horizon, pairs, seed)
    truth = joint_transitions(episodes, discount, penalty)[:, -1]
    now = value_of(episodes.observations[rows[:, 0]])
    later = value_of(episodes.observations[rows[:, 1]])
    return ranking_rows(now, later, truth[rows[:, 0]], left)


def main(argv: list[str] | None = None) -> list[list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkpoints",
        nargs="+",
        help="run dirs, model.pt files, pretrained:<dataset id>, or critic.pt files",
    )
    parser.add_argument("--labels", nargs="+", help="each checkpoint's name in the table")
    parser.add_argument("--horizon", type=int, default=9, help="steps between a pair's states")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", help="write the table as this results record")
    args = parser.parse_args(argv)
    labels = args.labels or args.checkpoints
    if len(labels) != len(args.checkpoints):
        raise SystemExit(f"{len(args.checkpoints)} checkpoints but {len(labels)} --labels")
    # Checkpoints of one dataset share its episodes: read once.
    episodes_of = functools.cache(lambda dataset_id: load_episodes(dataset_id)[0])
    rows = []
    for label, checkpoint in zip(labels, args.checkpoints, strict=True):
        for row in ranking_of(checkpoint, args.horizon, args.pairs, args.seed, episodes_of):
            rows.append([label, *row])
            print(" | ".join(rows[-1]))
    if args.record:
        print(f"wrote {write_record(args.record, rows, args.horizon)}")
    return rows


if __name__ == "__main__":
    main()
