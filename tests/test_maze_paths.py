"""scripts/maze_paths.py: where a maze agent's episodes go, and where the missed ones end."""

from __future__ import annotations

import maze_paths  # scripts/, on pytest's path
import numpy as np
import pytest

# 1 is a wall. Row 1: a dead end (1, 1), then a corridor (1, 2), and a junction (1, 3).
MAZE = [
    [1, 1, 1, 1, 1],
    [1, 0, 0, 0, 1],
    [1, 1, 1, 0, 1],
    [1, 0, 0, 0, 1],
    [1, 1, 1, 1, 1],
]


@pytest.mark.parametrize(
    ("cell", "kind"),
    [((1, 1), "dead end"), ((1, 2), "corridor"), ((1, 3), "corner"), ((2, 3), "corridor")],
)
def test_a_cell_is_named_by_its_open_neighbours(cell, kind):
    assert maze_paths.cell_kind(MAZE, cell) == kind


def test_a_cell_with_three_open_neighbours_is_a_junction():
    maze = [row[:] for row in MAZE]
    maze[0][3] = 0  # (1, 3) opens upwards too
    assert maze_paths.cell_kind(maze, (1, 3)) == "junction"


def test_positions_fall_in_the_cells_of_gymnasium_robotics_coordinates():
    """Unit cells centred on the origin, row 0 at the top, as the maze's own map."""
    assert maze_paths.cell_of(np.array([0.0, 0.0]), 5, 5) == (2, 2)
    assert maze_paths.cell_of(np.array([-1.2, 1.3]), 5, 5) == (1, 1)  # up and to the left
    assert maze_paths.cell_of(np.array([1.1, -1.4]), 5, 5) == (3, 3)


def test_missed_episodes_are_told_apart_by_whether_they_ended_still():
    paths = maze_paths.Paths(slice(0, 2), slice(2, 4))
    goal = np.array([1.0, -1.0])  # in cell (3, 3)
    line = np.linspace([-1.0, 1.0], [1.0, 1.0], 50)  # along row 1, left to right
    paths.goals = {0: goal, 1: goal, 2: goal}
    paths.finished = {
        0: np.vstack([line, np.linspace([1.0, 1.0], goal, 50)]),  # reaches the goal
        1: np.vstack([line, np.repeat([[-1.0, 1.0]], 30, axis=0)]),  # back, pressed still
        2: line,  # still moving when it ends
    }
    reached, still, moving, stopped = maze_paths.outcomes(paths, MAZE, window=20, still=0.1)
    assert (reached, still, moving) == (1, 1, 1)
    assert stopped == {(1, 1): 1}  # the dead end


def test_the_row_and_figure_of_an_untrained_maze_model(maze_checkpoint, tmp_path, capsys):
    search = f"checkpoint={maze_checkpoint} planner=maze planner.horizon=2 planner.beam_width=2"
    figure = tmp_path / "paths.png"
    (row,) = maze_paths.main(
        ["--search", search, "--episodes", "3", "--envs", "2", "--figure", str(figure)]
    )
    assert len(row) == len(maze_paths.COLUMNS)
    assert row[0] == "pointmaze/umaze-v0, 12 bins, discount 0.99"
    assert row[1] == "`planner=maze`, `planner.horizon=2`, `planner.beam_width=2`"
    reached = int(row[3].split(" of ")[0])
    assert row[3].endswith("of 3")
    assert reached + int(row[4]) + int(row[7]) == 3  # every episode counted once
    assert figure.stat().st_size > 0
    assert "|" in capsys.readouterr().out


def test_a_search_names_one_checkpoint():
    with pytest.raises(SystemExit, match="one checkpoint"):
        maze_paths.main(["--search", "planner=maze"])
