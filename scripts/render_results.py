"""Write the results tables of the README and the documentation from their records.

A record is a JSON file under docs/results/records/, named by its path there without `.json`
(`planner-scores/pendulum` is docs/results/records/planner-scores/pendulum.json). It holds one
table, `columns` and `rows` (cells are strings or numbers, written as they are), and what is
known of where its figures came from (`provenance`: the commands, machine and date that the
page states):

    {"title": "Pendulum", "page": "docs/results/planner-scores.md",
     "provenance": {"commands": ["..."], "machines": ["2-core CPU"], "dates": ["2026-11-23"]},
     "columns": ["dataset", "dataset mean", "BC", "planner"],
     "rows": [["pendulum/medium-v0", "46.2", "45.3 ± 0.9", "99.3 ± 0.5"], ...]}

A page holds a table between two markers, and everything between them is written from the
record:

    <!-- results: planner-scores/pendulum -->
    | dataset | dataset mean | BC | planner |
    ...

    <!-- /results -->

The opening marker may select columns and rows, by name (a row by its first cell) or by index
from 0, separated by `;`: `<!-- results: planner-scores/pendulum columns="dataset;BC"
rows="pendulum/medium-v0" -->`; `note="yes"` writes the record's `note` (what the measuring
script says of the whole table, such as its wall time) below the table. A record's cell may
instead name a cell of another record, so that one figure has one source wherever it is shown
(the README's headline table is such a view):

    {"record": "planner-scores/pendulum", "row": "pendulum/medium-replay-v0", "column": "BC"}

with optional `"match"` (a regular expression: the cell becomes its first group, or the whole
match) and `"bold"` (true: the figure in bold; false: without the bold it has at its source);
`{"format": "{0} s ({1})", "cells": [<cell>, <cell>]}` joins several. A column or row named
`planner` also finds one named `planner (...)`.

    python scripts/render_results.py            # rewrite every marked table
    python scripts/render_results.py --check    # exit 1, naming the tables, if a page differs

mkdocs runs it as a hook (`on_pre_build`, mkdocs.yml) before every build; tests/test_docs.py
checks that the committed pages are what it writes, so a table edited by hand fails. To change
a figure, change its record (scripts/results_table.py --record writes one) and run this.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "docs" / "results" / "records"

BLOCK = re.compile(
    r"^<!-- results: (?P<name>[\w./-]+)(?P<options>[^\n]*?) -->\n(?P<body>.*?)^<!-- /results -->$",
    re.M | re.S,
)
OPTION = re.compile(r'(\w+)="([^"]*)"')
BOLD = re.compile(r"^\*\*(.*)\*\*$", re.S)


class RecordError(ValueError):
    """A record, a cell reference or a marker that cannot be rendered."""


def pages(root: Path = ROOT) -> list[Path]:
    """The pages that may hold marked tables: the README and every page of the site."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


@functools.cache
def load(name: str, records: Path = RECORDS) -> dict:
    path = records / f"{name}.json"
    if not path.is_file():
        raise RecordError(f"no record {name!r} ({path.relative_to(ROOT)} is missing)")
    record = json.loads(path.read_text())
    for key in ("columns", "rows"):
        if key not in record:
            raise RecordError(f"record {name!r} has no {key!r}")
    return record


def format_record(record: dict) -> str:
    """A record as JSON, one row to a line (how every record is stored)."""
    head = {key: value for key, value in record.items() if key != "rows"}
    text = json.dumps(head, indent=2, ensure_ascii=False)[:-2]
    rows = ",\n".join(f"    {json.dumps(row, ensure_ascii=False)}" for row in record["rows"])
    return f'{text},\n  "rows": [\n{rows}\n  ]\n}}\n'


def write_measured(
    path: Path, title: str, script: str, note: str, columns: list[str], rows: list[list]
) -> None:
    """Write the record at `path` as measured now by `script` (scripts/<script>, with this
    process's arguments): its command, this machine's cores, today's date. A record already
    there keeps its own title and page."""
    record = {"title": title}
    if path.is_file():  # a re-measurement keeps what the record says of itself
        kept = json.loads(path.read_text())
        record.update({key: value for key, value in kept.items() if key in ("title", "page")})
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    record["provenance"] = {
        "commands": [shlex.join(["python", f"scripts/{script}", *sys.argv[1:]])],
        "machines": [f"{cores}-core {platform.machine()} CPU, {platform.system()}"],
        "dates": [datetime.date.today().isoformat()],
    }
    record["note"] = note
    record["columns"] = columns
    record["rows"] = rows
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_record(record))


def _find(names: list[str], wanted: str | int, what: str, name: str) -> int:
    """The index of `wanted` (an index, a name, or a name that `name (...)` extends)."""
    if isinstance(wanted, int) or (isinstance(wanted, str) and wanted.isdigit()):
        index = int(wanted)
        if not 0 <= index < len(names):
            raise RecordError(f"record {name!r} has no {what} {index}")
        return index
    exact = [i for i, n in enumerate(names) if n == wanted]
    found = exact or [i for i, n in enumerate(names) if n.startswith(f"{wanted} (")]
    if len(found) != 1:
        some = "several" if found else "no"
        raise RecordError(f"record {name!r} has {some} {what} {wanted!r}")
    return found[0]


def text_of(cell: object, records: Path = RECORDS) -> str:
    """A cell as the table shows it: a string as it is, a number in its shortest form, a
    reference to another record's cell that cell."""
    if isinstance(cell, str):
        return cell
    if isinstance(cell, bool) or cell is None:
        raise RecordError(f"a cell must be a string, a number or a reference, not {cell!r}")
    if isinstance(cell, int | float):
        return str(cell)
    if isinstance(cell, dict) and "format" in cell:
        return cell["format"].format(*(text_of(c, records) for c in cell.get("cells", [])))
    if isinstance(cell, dict) and "record" in cell:
        source = load(cell["record"], records)
        row = _find(
            [text_of(r[0], records) for r in source["rows"]], cell["row"], "row", cell["record"]
        )
        column = _find(source["columns"], cell["column"], "column", cell["record"])
        text = text_of(source["rows"][row][column], records)
        if "bold" in cell:
            text = BOLD.sub(r"\1", text)
        if "match" in cell:
            found = re.search(cell["match"], text)
            if not found:
                raise RecordError(f"{cell['match']!r} is not in {text!r} ({cell['record']})")
            text = found.group(1) if found.groups() else found.group(0)
        return f"**{text}**" if cell.get("bold") else text
    raise RecordError(f"a cell must be a string, a number or a reference, not {cell!r}")


def _line(cells: list[str]) -> str:
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def table(
    name: str, columns: str | None = None, rows: str | None = None, records: Path = RECORDS
) -> str:
    """The markdown table of record `name`, with the `;`-separated columns and rows selected."""
    record = load(name, records)
    names = list(record["columns"])
    body = [[text_of(cell, records) for cell in row] for row in record["rows"]]
    for row in body:
        if len(row) != len(names):
            raise RecordError(
                f"record {name!r}: a row of {len(row)} cells under {len(names)} columns"
            )
    if rows is not None:
        keys = [row[0] for row in body]
        body = [body[_find(keys, key, "row", name)] for key in rows.split(";")]
    if columns is not None:
        picked = [_find(names, column, "column", name) for column in columns.split(";")]
        names = [names[i] for i in picked]
        body = [[row[i] for i in picked] for row in body]
    align = record.get("align") or ["---"] * len(names)
    if columns is not None and record.get("align"):
        align = [record["align"][i] for i in picked]
    lines = [_line(names), "|" + "|".join(align) + "|", *(_line(row) for row in body)]
    return "\n".join(lines) + "\n"


def render_page(text: str, records: Path = RECORDS) -> tuple[str, list[str]]:
    """The page with every marked table written from its record, and the names of the tables
    that changed."""
    changed = []

    def block(match: re.Match) -> str:
        options = dict(OPTION.findall(match["options"]))
        unknown = set(options) - {"columns", "rows", "note"}
        if unknown:
            raise RecordError(f"unknown marker options {sorted(unknown)} for {match['name']}")
        body = table(match["name"], options.get("columns"), options.get("rows"), records) + "\n"
        if options.get("note") == "yes":
            note = load(match["name"], records).get("note")
            if not note:
                raise RecordError(f'record {match["name"]!r} has no note to show (note="yes")')
            body += f"{note}\n\n"
        if body != match["body"]:
            changed.append(match["name"] + match["options"])
        return f"<!-- results: {match['name']}{match['options']} -->\n{body}<!-- /results -->"

    return BLOCK.sub(block, text), changed


def render_all(root: Path = ROOT, write: bool = True) -> dict[Path, list[str]]:
    """Every page whose tables differ from their records, with those tables; written unless
    `write` is false."""
    load.cache_clear()
    stale = {}
    for page in pages(root):
        text = page.read_text()
        if "<!-- results:" not in text:
            continue
        try:
            new, changed = render_page(text, root / "docs" / "results" / "records")
        except RecordError as error:
            raise RecordError(f"{page.relative_to(root)}: {error}") from None
        if changed:
            stale[page] = changed
            if write:
                page.write_text(new)
    return stale


def on_pre_build(config: object, **kwargs: object) -> None:
    """mkdocs hook: the tables of the records being built (pages written only when they
    changed, so that `mkdocs serve` does not rebuild for ever)."""
    render_all(Path(config["docs_dir"]).resolve().parent)  # type: ignore[index]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1, naming the tables, if a page differs"
    )
    args = parser.parse_args()
    try:
        stale = render_all(write=not args.check)
    except RecordError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for page, names in stale.items():
        for name in names:
            verb = "differs from" if args.check else "written from"
            print(f"{page.relative_to(ROOT)}: table {verb} record {name}")
    if args.check and stale:
        print("run python scripts/render_results.py (or make results-tables)")
        return 1
    if not stale:
        print("every results table is its record's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
