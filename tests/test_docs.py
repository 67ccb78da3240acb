"""The documentation: every key described, the configuration reference as the code writes it, a
short README, and relative links that lead to files."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import config_reference
import pytest
import render_results

ROOT = Path(__file__).resolve().parent.parent
README_MOST_LINES = 250
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_every_key_of_every_command_has_a_description():
    missing = config_reference.missing_descriptions()
    assert not missing, (
        "config fields without a docstring (a string literal right after the field): "
        + ", ".join(missing)
    )


def test_the_configuration_reference_is_what_the_code_writes():
    page = config_reference.PAGE
    assert page.is_file(), f"{page} is missing: run python scripts/config_reference.py"
    assert page.read_text() == config_reference.render(), (
        f"{page.relative_to(ROOT)} is stale: run python scripts/config_reference.py (or make docs)"
    )


def test_the_reference_names_every_key_with_its_range():
    text = config_reference.render()
    for key, allowed in (
        ("trainer.batch_size", "at least 1"),
        ("trainer.schedule", "one of cosine, wsd, schedule_free"),
        ("planner.cdf_act", "in (0, 1] or None"),
        ("dataset.n_bins", "in [2, "),
        ("critic.expectile", "in (0, 1)"),
        ("eval.num_envs", "in [1, "),
        ("compare.alpha", "in (0, 1)"),
    ):
        row = next(line for line in text.splitlines() if line.startswith(f"| `{key}` |"))
        assert allowed in row, row
    assert "| `compare.agents.<name>.eval` |" in text


def test_the_reference_gives_the_default_recipes_values():
    """The default recipe sets keys of several groups: each shows its value there."""
    text = config_reference.render()
    for key, value in (("dataset.discretizer", "uniform"), ("trainer.learning_rate", "3e-3")):
        row = next(line for line in text.splitlines() if line.startswith(f"| `{key}` |"))
        assert f"(`{value}` in `recipe=precise`)" in row, row


def test_the_readme_is_a_landing_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MOST_LINES, f"README.md has {len(lines)} lines"


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_relative_link_leads_to_a_file():
    broken = []
    for path in markdown_files():
        if not path.is_file():
            continue
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code is not links
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor on the same page
            file = target.split("#", 1)[0]
            if not (path.parent / file).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_python_api_reference_renders_every_exported_name():
    import trajectory_transformer

    page = (ROOT / "docs" / "reference" / "python-api.md").read_text()
    rendered = set(re.findall(r"^::: trajectory_transformer\.(\w+)\s*$", page, flags=re.M))
    missing = sorted(set(trajectory_transformer.__all__) - rendered)
    assert not missing, (
        "exported names without a `::: trajectory_transformer.<name>` block in "
        "docs/reference/python-api.md: " + ", ".join(missing)
    )


def test_every_results_table_is_written_from_its_record():
    """A results table edited by hand, not through its record, fails."""
    script = ROOT / "scripts" / "render_results.py"
    checked = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    pages = [p for p in markdown_files() if p.is_file() and "<!-- results:" in p.read_text()]
    assert ROOT / "README.md" in pages and len(pages) > 5


def test_a_marker_asking_for_the_note_writes_it_below_the_table(tmp_path):
    """`note="yes"`: what the measuring script says of the whole table (a check's wall time)
    is shown with it, from the record, where a record without one is an error."""
    records = tmp_path / "records"
    (records / "check").mkdir(parents=True)
    record = {"columns": ["dataset", "score"], "rows": [["a", "1.0"]], "note": "In 9 minutes."}
    (records / "check" / "scores.json").write_text(render_results.format_record(record))
    page = '<!-- results: check/scores note="yes" -->\nold\n<!-- /results -->\n'
    text, changed = render_results.render_page(page, records)
    assert text.split("\n")[1:6] == [
        "| dataset | score |",
        "|---|---|",
        "| a | 1.0 |",
        "",
        "In 9 minutes.",
    ]
    assert changed == ['check/scores note="yes"']
    assert render_results.render_page(text, records) == (text, [])
    (records / "check" / "scores.json").write_text(
        render_results.format_record({key: record[key] for key in ("columns", "rows")})
    )
    render_results.load.cache_clear()
    with pytest.raises(render_results.RecordError, match="no note"):
        render_results.render_page(page, records)
