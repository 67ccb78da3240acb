"""The critic's values along real episodes of the critic-scored search: where it helps, where not.

Plays episodes of a model checkpoint's beam search with `planner.value=critic` (the critic of
the same dataset scores each beam by Q of its last planned transition), one env at a time, and
records at every step:
- the critic's V(s_t) of the real state and Q(s_t, a_t) of the executed action;
- the spread of the final beams' scores (the best minus the worst): how much the critic
  tells the candidates apart;
- the Q that the chosen plan gave its last transition, made of imagined states and actions
  H - 1 steps ahead, and the critic's Q of the state (binned, as the plan's states are) and
  action really met at that step (where the episode lasts that long): the gap between the two
  is the model's error as the critic sees it, which the search cannot see.

It writes `trace.csv` (one row per step), `summary.json` (per episode: return, V at the start,
the mean and spread of that gap, and how well the imagined Q ranks the real one) and
`critic_trace.png` (V, Q and the imagined and real Q along the best and the worst episode).

    python scripts/critic_trace.py --checkpoint run/checkpoint.pt --critic critic/critic.pt \\
        --episodes 10 --out trace/ planner.horizon=5
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
import torch

from trajectory_transformer.cli.common import planner_settings
from trajectory_transformer.evaluation import make_env, record_episode
from trajectory_transformer.planning import BeamPlanner


def critic_planner_settings(checkpoint: str, critic: str, overrides: list[str]) -> dict:
    """The planner settings tt-eval would use with these overrides, scoring with the critic."""
    forced = ["planner.value=critic", f"planner.critic={critic}"]
    return planner_settings([f"checkpoint={checkpoint}", *overrides, *forced])


def episode_env(planner: BeamPlanner, max_episode_steps: int | None = None):
    """The env thunk of the planner's dataset, and the most steps an episode of it plays."""
    limit = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    thunk = make_env(planner.dataset, **limit)
    env = thunk()
    longest = env.spec.max_episode_steps or 10_000
    env.close()
    return thunk, longest


def trace_episode(planner: BeamPlanner, thunk, longest: int, seed: int):
    """One episode's rows: the critic's values of what was real and what was planned."""
    record = record_episode(planner, thunk, seed=seed, plan_steps=range(longest))  # every search
    critic, H = planner.critic, planner.config.horizon
    device = planner.device
    observations = torch.as_tensor(
        np.array(record.observations[:-1]), device=device, dtype=torch.float32
    )
    actions = torch.as_tensor(np.array(record.actions), device=device, dtype=torch.float32)
    # The plan's states are bin values: the real ones binned too, so that the gap between
    # imagined and real is the model's error alone, not the discretisation's.
    disc, O = planner.discretizer, planner.observation_dim  # noqa: E741
    binned = disc.decode(disc.encode(observations, slice(0, O)), slice(0, O))
    with torch.no_grad():
        v = critic.value(observations).cpu().numpy()
        q = critic.q(observations, actions).cpu().numpy()
        q_binned = critic.q(binned, actions).cpu().numpy()
    steps = len(record.actions)
    rows = [
        dict(
            seed=seed,
            step=t,
            reward=float(record.rewards[t]),
            v=float(v[t]),
            q_executed=float(q[t]),
            plan_score=float("nan"),
            beam_score_spread=float("nan"),
            q_imagined=float("nan"),
            q_real=float("nan"),
        )
        for t in range(steps)
    ]
    for t, snapshot in record.plans.items():
        best = snapshot.best
        scores = snapshot.plan.scores[0]
        rows[t]["plan_score"] = float(scores[best])
        rows[t]["beam_score_spread"] = float(scores.max() - scores.min())
        if t + H - 1 < steps:  # the plan's last transition, really met H - 1 steps later
            rows[t]["q_imagined"] = float(snapshot.plan.values[0, best, H - 1])
            rows[t]["q_real"] = float(q_binned[t + H - 1])
    return rows


def summarise(rows: list[dict]) -> dict:
    rewards = np.array([r["reward"] for r in rows])
    imagined = np.array([r["q_imagined"] for r in rows])
    real = np.array([r["q_real"] for r in rows])
    known = ~np.isnan(imagined)
    gap = imagined[known] - real[known]
    ranks = (
        float(np.corrcoef(imagined[known], real[known])[0, 1])
        if known.sum() > 2 and real[known].std() > 0 and imagined[known].std() > 0
        else float("nan")
    )
    return dict(
        seed=rows[0]["seed"],
        steps=len(rows),
        episode_return=float(rewards.sum()),
        steps_rewarded=int((rewards > 0).sum()),
        v_start=rows[0]["v"],
        v_end=rows[-1]["v"],
        beam_score_spread_median=float(np.nanmedian([r["beam_score_spread"] for r in rows])),
        imagined_minus_real_mean=float(gap.mean()) if gap.size else float("nan"),
        imagined_minus_real_std=float(gap.std()) if gap.size else float("nan"),
        imagined_real_correlation=ranks,
    )


def plot(traces: dict[int, list[dict]], summaries: list[dict], path: Path, horizon: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(summaries, key=lambda s: s["episode_return"])
    chosen = [ordered[-1]] if len(ordered) == 1 else [ordered[-1], ordered[0]]
    fig, axes = plt.subplots(len(chosen), 1, figsize=(10, 3.6 * len(chosen)), squeeze=False)
    for ax, summary in zip(axes[:, 0], chosen, strict=True):
        rows = traces[summary["seed"]]
        t = np.array([r["step"] for r in rows])
        ax.plot(t, [r["v"] for r in rows], label="V(s_t), real state")
        ax.plot(t, [r["q_executed"] for r in rows], label="Q(s_t, a_t), executed", alpha=0.7)
        imagined = np.array([r["q_imagined"] for r in rows])
        known = ~np.isnan(imagined)
        ax.plot(
            t[known] + horizon - 1,
            imagined[known],
            ".",
            markersize=3,
            label=f"Q the plan gave step t+{horizon - 1} (imagined)",
        )
        rewarded = t[np.array([r["reward"] for r in rows]) > 0]
        if rewarded.size:
            ax.plot(rewarded, np.full(rewarded.size, ax.get_ylim()[0]), "|", label="reward > 0")
        kind = "best" if summary is chosen[0] else "worst"
        ax.set_title(
            f"{kind} episode (seed {summary['seed']}): return {summary['episode_return']:.1f}, "
            f"imagined - real Q {summary['imagined_minus_real_mean']:+.2f} "
            f"± {summary['imagined_minus_real_std']:.2f}"
        )
        ax.set_xlabel("env step")
        ax.set_ylabel("critic value (its reward units)")
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the model's checkpoint.pt")
    parser.add_argument("--critic", required=True, help="the critic.pt of the same dataset")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="first episode seed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--max-episode-steps", type=int, default=None, help="cut episodes here (default: the env's)"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("overrides", nargs="*", help="tt-eval planner overrides (planner=paper)")
    args = parser.parse_args()
    settings = critic_planner_settings(args.checkpoint, args.critic, args.overrides)
    planner = BeamPlanner.from_checkpoint(args.checkpoint, device=args.device, **settings)
    args.out.mkdir(parents=True, exist_ok=True)
    thunk, longest = episode_env(planner, args.max_episode_steps)
    traces, summaries = {}, []
    for seed in range(args.seed, args.seed + args.episodes):
        traces[seed] = trace_episode(planner, thunk, longest, seed)
        summaries.append(summarise(traces[seed]))
        print(json.dumps(summaries[-1]), flush=True)
    with open(args.out / "trace.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(traces[args.seed][0]))
        writer.writeheader()
        for rows in traces.values():
            writer.writerows(rows)
    (args.out / "summary.json").write_text(json.dumps(summaries, indent=1))
    plot(traces, summaries, args.out / "critic_trace.png", planner.config.horizon)
    print(f"wrote {args.out / 'trace.csv'}, {args.out / 'summary.json'}, critic_trace.png")


if __name__ == "__main__":
    main()
