"""Write a tt-compare run's tables as results records: its agents (scores and what a seed
cost), their scores per training seed, and its decisions, read from the `agents.csv`,
`compare.json` and `decisions.csv` that tt-compare writes in its run directory at the end of
every run (finished, or stopped by `stop_after`).

    python scripts/record_comparison.py <tt-compare run dir> \\
        --record docs/results/records/comparisons/goals-pointmaze-umaze \\
        --machine "2 cores of an AMD EPYC (x86_64), beside ..."

writes `<record>-agents.json`, `<record>-seeds.json` and `<record>-decisions.json` (and, where
the env reports reaching a goal, `<record>-goals.json`: each seed's goals reached, how long they
were held and when first reached, from its evaluation's `results.json`), with the tt-compare
command (from the run's `.hydra/overrides.yaml`, less its run directory), the
machine as given (what ran beside it belongs there), and the dates its evaluations finished. A
page shows them with `<!-- results: comparisons/goals-pointmaze-umaze-agents -->`
(scripts/render_results.py), and another table can name their cells, so that a score is
written once.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import shlex
from pathlib import Path

import yaml
from render_results import format_record

from trajectory_transformer.comparison.protocol import DECISION_WORDS, evaluation_dir

AGENT_COLUMNS = [
    "agent",
    "seeds",
    "mean",
    "IQM",
    "IQM 95% CI",
    "model training (min)",
    "critic training (min)",
    "evaluation (min)",
    "planning per env-step (ms)",
]
GOAL_COLUMNS = ["agent", "seed", "reached", "held", "first reached (step)"]
DECISION_COLUMNS = ["comparison", "mean 1", "mean 2", "mean 1 - mean 2", "decision", "P(1 > 2)"]
DECISIONS = DECISION_WORDS | {"larger": "**larger**"}
"""How each of AdaStop's decisions reads in a table (as tt-compare's report says it, a win in
bold)."""
PLACE_OVERRIDES = ("hydra.run.dir=", "hydra.mode=", "hydra.sweep.dir=")
"""Overrides that say where a run was written, not what ran: left out of the command."""


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise SystemExit(
            f"error: no {path.name} in {path.parent}: tt-compare writes it when a run ends "
            "(finished, or stopped with stop_after=<interims>)"
        )
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def shown(value: str, digits: int) -> str:
    """A CSV number at `digits` decimals; `-` for a cost the agent does not have."""
    return "-" if value in ("", "None") else f"{float(value):.{digits}f}"


def agent_rows(rows: list[dict[str, str]]) -> list[list[str]]:
    return [
        [
            row["name"],
            row["seeds"],
            shown(row["mean"], 1),
            shown(row["iqm"], 1),
            f"[{float(row['iqm_low']):.1f}, {float(row['iqm_high']):.1f}]",
            shown(row["model_minutes"], 1),
            shown(row["critic_minutes"], 1),
            shown(row["evaluation_minutes"], 1),
            shown(row["planning_ms"], 1),
        ]
        for row in rows
    ]


def decision_rows(rows: list[dict[str, str]]) -> list[list[str]]:
    table = []
    for row in rows:
        decision = DECISIONS.get(row["decision"], row["decision"])
        interims = int(row["interims"])
        table.append(
            [
                row["comparison"],
                shown(row["mean_1"], 1),
                shown(row["mean_2"], 1),
                f"{float(row['mean_difference']):+.1f}",
                f"{decision} after {interims} interim{'s' if interims != 1 else ''}",
                f"{float(row['probability_of_improvement']):.2f}",
            ]
        )
    return table


def scores_by_agent(scores: list[dict[str, dict[str, float]]]) -> dict[str, dict[int, float]]:
    """Each agent's score per training seed over the interims (`compare.json`'s `scores`)."""
    by_agent: dict[str, dict[int, float]] = {}
    for interim in scores:
        for agent, by_seed in interim.items():
            by_agent.setdefault(agent, {}).update({int(s): v for s, v in by_seed.items()})
    return by_agent


def seed_columns_and_rows(by_agent: dict[str, dict[int, float]]) -> tuple[list, list]:
    """Each agent's score per training seed; `-` for a seed an agent did not play (its
    comparisons decided before that interim)."""
    seeds = sorted({seed for by_seed in by_agent.values() for seed in by_seed})
    columns = ["agent", *(f"seed {seed}" for seed in seeds)]
    rows = [
        [agent, *(f"{by_seed[seed]:.1f}" if seed in by_seed else "-" for seed in seeds)]
        for agent, by_seed in by_agent.items()
    ]
    return columns, rows


def goal_rows(run_dir: Path, seeds: dict[str, list[int]]) -> list[list[str]]:
    """Per agent and training seed it played (`seeds`, in order), as its evaluation's
    `results.json` says: the episodes that reached their goal, the share of the steps after the
    first arrival spent at it (mean over those episodes), and the mean step of that arrival.
    None of them where the env reports no goal (`reached_fraction` absent)."""
    rows = []
    for agent, played in seeds.items():
        for seed in played:
            path = evaluation_dir(run_dir, agent, seed) / "results.json"
            if not path.is_file():
                continue
            result = json.loads(path.read_text())
            if result.get("reached_fraction") is None:
                continue
            reached = sum(step is not None for step in result["first_success_steps"])
            held, first = result["stayed_fraction"], result["first_success_step_mean"]
            rows.append(
                [
                    agent,
                    str(seed),
                    f"{reached} of {len(result['lengths'])}",
                    "-" if held is None else f"{held:.0%}",
                    "-" if first is None else f"{first:.0f}",
                ]
            )
    return rows


def command_of(run_dir: Path) -> str:
    """The tt-compare command that made `run_dir`, as its Hydra overrides record it."""
    hydra = yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]
    overrides = [*hydra["overrides"]["task"], *hydra["overrides"]["hydra"]]
    kept = [o for o in overrides if not o.startswith(PLACE_OVERRIDES)]
    return shlex.join(["tt-compare", *kept])


def evaluation_dates(run_dir: Path, scores: dict[str, dict[int, float]]) -> list[str]:
    """The days on which the run's evaluations of `scores` (each agent's per training seed)
    finished: their results' modification dates."""
    stamps = {
        datetime.date.fromtimestamp(path.stat().st_mtime).isoformat()
        for agent, by_seed in scores.items()
        for seed in by_seed
        if (path := evaluation_dir(run_dir, agent, seed) / "results.json").is_file()
    }
    return sorted(stamps)


def write_records(run_dir: Path, record: Path, machine: str, commit: str | None) -> list[Path]:
    state = json.loads((run_dir / "compare.json").read_text())
    dataset = state["spec"]["dataset"]
    by_agent = scores_by_agent(state["scores"])
    provenance = {
        "commands": [command_of(run_dir)],
        "machines": [machine],
        "dates": evaluation_dates(run_dir, by_agent),
    }
    if commit:
        provenance["commits"] = [commit]
    unit = "normalised score" if state.get("normalized") else "return"
    agents = read_rows(run_dir / "agents.csv")
    tables = {
        "agents": (
            f"{dataset}: each agent's {unit} over its training seeds",
            AGENT_COLUMNS,
            agent_rows(agents),
        ),
        "seeds": (
            f"{dataset}: each agent's {unit} per training seed",
            *seed_columns_and_rows(by_agent),
        ),
        "decisions": (
            f"{dataset}: AdaStop's decisions",
            DECISION_COLUMNS,
            decision_rows(read_rows(run_dir / "decisions.csv")),
        ),
    }
    played = {row["name"]: sorted(by_agent.get(row["name"], {})) for row in agents}
    if goals := goal_rows(run_dir, played):
        tables["goals"] = (
            f"{dataset}: each agent's goals reached and held, per training seed",
            GOAL_COLUMNS,
            goals,
        )
    written = []
    for kind, (title, columns, rows) in tables.items():
        path = record.with_name(f"{record.name}-{kind}.json")
        kept = json.loads(path.read_text()) if path.is_file() else {}
        content = {
            "title": kept.get("title", title),
            **({"page": kept["page"]} if "page" in kept else {}),
            "provenance": provenance,
            "columns": columns,
            "rows": rows,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(format_record(content))
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a tt-compare run directory")
    parser.add_argument(
        "--record",
        type=Path,
        required=True,
        help="docs/results/records/<name>: writes <name>-agents.json, -seeds.json, -decisions.json "
        "(and -goals.json where the env reports reaching a goal)",
    )
    parser.add_argument(
        "--machine", required=True, help="where it ran, and what ran beside it (as pages say)"
    )
    parser.add_argument("--commit", help="the commit whose code ran it")
    args = parser.parse_args()
    for path in write_records(args.run_dir, args.record, args.machine, args.commit):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
