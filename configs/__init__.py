"""Hydra configs of tt-train, tt-eval and tt-collect, installed as `trajectory_transformer.configs`.

The YAML files live here, at the top of the repository; `pyproject.toml` maps this folder into
the package, so the CLIs find them as `pkg://trajectory_transformer.configs` however the
package was installed.
"""
