"""Every notebook runs top to bottom (papermill) on a tiny configuration."""

from __future__ import annotations

from pathlib import Path

import nbformat
import papermill
import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))

# Per notebook, the parameters that make it tiny; the checkpoint comes from the fixture.
TINY = {
    "visualize_plans": {
        "PLANNER": {"beam_width": 4, "horizon": 2, "context_transitions": 1},
        "PLAN_STEPS": [0, 3],
        "SHOW_STEP": 3,
        "MAX_EPISODE_STEPS": 6,
        "MAZE_PLANNER": {"beam_width": 4, "horizon": 2, "context_transitions": 1},
        "MAZE_PLAN_STEPS": [0, 3],
    },
    "model_diagnostics": {"WINDOWS": 8, "CONTEXT_TRANSITIONS": 1},
}


def test_every_notebook_is_covered_and_committed_without_outputs():
    assert {path.stem for path in NOTEBOOKS} == set(TINY)
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert all(not cell.outputs and cell.execution_count is None for cell in code), path
        assert "parameters" in code[0].metadata.get("tags", []), f"{path}: parameters cell"


def execute(path: Path, parameters: dict, tmp_path: Path):
    """The notebook run top to bottom with `parameters`; raises PapermillExecutionError naming
    the cell that failed."""
    return papermill.execute_notebook(
        str(path),
        str(tmp_path / path.name),
        parameters=parameters,
        cwd=str(path.parent),
        kernel_name="python3",
        progress_bar=False,
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs(path, tiny_checkpoint, tmp_path, request):
    parameters = {"CHECKPOINT": str(tiny_checkpoint), "RUN_DIR": str(tmp_path), **TINY[path.stem]}
    if path.stem == "visualize_plans":  # its maze episode
        parameters["MAZE_CHECKPOINT"] = str(request.getfixturevalue("maze_checkpoint"))
    executed = execute(path, parameters, tmp_path)
    figures = [
        output
        for cell in executed.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]
    assert len(figures) >= 3, "the notebook shows its figures"
    if path.stem == "visualize_plans":  # the maze figure closes it
        last = [cell for cell in executed.cells if cell.cell_type == "code"][-1]
        assert "plot_maze_plans" in last.source
        assert any("image/png" in output.get("data", {}) for output in last.outputs)


def test_the_plans_notebook_runs_on_its_default_pretrained_checkpoints(tmp_path):
    path = next(path for path in NOTEBOOKS if path.stem == "visualize_plans")
    parameters = {"RUN_DIR": str(tmp_path), **TINY["visualize_plans"]}  # checkpoints as they are
    executed = execute(path, parameters, tmp_path)
    text = "".join(
        output.get("text", "")
        for cell in executed.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )
    assert "pendulum/medium-expert-v0" in text and "pointmaze/umaze-v0" in text
