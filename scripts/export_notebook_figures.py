"""Write the figures of an executed notebook as PNG files (for the figures in `docs/`).

    papermill notebooks/visualize_plans.ipynb /tmp/plans.ipynb --cwd notebooks
    python scripts/export_notebook_figures.py /tmp/plans.ipynb docs/ --prefix visualize_plans

Each image output becomes `<prefix>_<n>.png`, n counting the notebook's figures from 1.
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import nbformat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebook", type=Path, help="an executed .ipynb (outputs kept)")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--prefix", default=None, help="file name prefix (default: its stem)")
    parser.add_argument("--only", type=int, nargs="*", help="figure numbers to write")
    args = parser.parse_args()
    notebook = nbformat.read(args.notebook, as_version=4)
    prefix = args.prefix or args.notebook.stem
    args.directory.mkdir(parents=True, exist_ok=True)
    images = [
        output["data"]["image/png"]
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    if not images:
        raise SystemExit(f"{args.notebook} holds no figures: was it executed?")
    for number, image in enumerate(images, start=1):
        if args.only and number not in args.only:
            continue
        path = args.directory / f"{prefix}_{number}.png"
        path.write_bytes(base64.b64decode(image))
        print(path)


if __name__ == "__main__":
    main()
