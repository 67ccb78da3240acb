"""`python -m trajectory_transformer.train ...` is the same as `tt-train ...`; from Python,
`train_in_subprocess` runs it the same way (a notebook or a script that wants a checkpoint)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def train_in_subprocess(
    run_dir: str | os.PathLike, overrides: Sequence[str] = (), reuse: bool = True
) -> Path:
    """Run tt-train with Hydra `overrides` in a fresh process (as a notebook or script would)
    and return its checkpoint. With `reuse`, a checkpoint already in `run_dir` is returned
    without training, so re-running a notebook does not train again."""
    checkpoint = Path(run_dir) / "checkpoint.pt"
    if reuse and checkpoint.exists():
        print(f"using the checkpoint trained before: {checkpoint}")
        return checkpoint
    command = [sys.executable, "-m", "trajectory_transformer.train", *overrides]
    command.append(f"hydra.run.dir={run_dir}")
    print("running", " ".join(command[2:]))
    done = subprocess.run(command, capture_output=True, text=True)
    print(done.stdout, end="")  # the run's summary; the progress bar went to its stderr
    if done.returncode != 0:
        raise RuntimeError(f"tt-train failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return checkpoint


if __name__ == "__main__":
    from trajectory_transformer.cli.train import main

    main()
