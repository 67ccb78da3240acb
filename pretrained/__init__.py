"""Pretrained checkpoints, installed as `trajectory_transformer.pretrained`.

One planning model per embedded dataset, named by its dataset id, listed in `manifest.json`
with where it came from (dataset fingerprint, training command, commit, wall time) and the
scores it reached (planner and BC, with their evaluation commands). The files live here, at
the top of the repository; `pyproject.toml` maps this folder into the package, so that they
are found however the package was installed. Load one with
`tt-eval checkpoint=pretrained:<dataset id>` or `BeamPlanner.from_pretrained("<dataset id>")`;
`python scripts/pretrained.py add <run dir>` adds one from a finished training run.
"""
