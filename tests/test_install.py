"""A non-editable install works without the source tree: the wheel carries the Hydra configs
and the pretrained checkpoints."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import TINY_TRAINING, create_dataset

REPO = Path(__file__).resolve().parents[1]
# What a wheel is not built from: version control, virtual environments, run outputs, builds.
BUILD_LEFTOVERS = (".git", ".venv*", "outputs", "multirun", "build", "site", "*.egg-info")
BUILD_LEFTOVERS += ("__pycache__",)


def run(*command: str | os.PathLike, cwd: Path, env: dict | None = None):
    return subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the sources, so that no build folder lands in (or comes from) the
    # checkout.
    source = out / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
    pip_wheel = ("pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, source)
    built = run(sys.executable, "-m", *pip_wheel, cwd=out)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("trajectory_transformer-*.whl")
    return path


def test_the_wheel_carries_every_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = REPO / "configs"
    expected = {
        "trajectory_transformer/configs/" + path.relative_to(configs).as_posix()
        for path in configs.rglob("*.yaml")
    }
    assert len(expected) > 20
    assert expected <= names, sorted(expected - names)
    assert "trajectory_transformer/model/decode/csrc/cpu_kernels.cpp" in names
    pretrained = {
        "trajectory_transformer/pretrained/" + path.name
        for path in (REPO / "pretrained").iterdir()
        if path.suffix in (".json", ".pt")
    }
    assert "trajectory_transformer/pretrained/manifest.json" in pretrained
    assert pretrained <= names, sorted(pretrained - names)


def test_installed_wheel_runs_the_clis_outside_the_checkout(wheel, tmp_path, minari_dir):
    venv = tmp_path / "venv"
    made = run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path)
    # The dependencies come from this environment, through a plain path entry: the .pth files
    # of this environment (among them the editable install of the checkout) are not run there.
    Path(site.stdout.strip(), "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    installed = run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-deps",
        "--no-index",
        wheel,
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"TT_NATIVE_KERNELS": "0", "WANDB_MODE": "disabled"}
    where = run(
        python, "-c", "import trajectory_transformer as t; print(t.__file__)", cwd=elsewhere
    )
    installed_package = Path(where.stdout.strip()).parent
    assert installed_package.is_relative_to(venv), where.stdout + where.stderr
    # The Hopper suite's behaviour policies ship as package data.
    for name in ("expert.pt", "medium.pt", "README.md"):
        assert (installed_package / "suites" / "policies" / "hopper" / name).is_file(), name

    for cli in ("tt-eval", "tt-collect"):  # tt-train runs below
        helped = run(venv / "bin" / cli, "--help", cwd=elsewhere, env=env)
        assert helped.returncode == 0, f"{cli}: {helped.stderr[-2000:]}"
        assert "== Config ==" in helped.stdout

    create_dataset("test/tiny-v0")
    trained = run(
        venv / "bin" / "tt-train",
        "dataset=pendulum-medium",  # a config group, read from the installed package
        *TINY_TRAINING,
        "trainer.max_steps=2",
        "hydra.run.dir=run",
        cwd=elsewhere,
        env=env,
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "trained 2 steps" in trained.stdout
    assert (elsewhere / "run" / "checkpoint.pt").is_file()
