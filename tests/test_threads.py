import os
import subprocess
import sys

import pytest
import torch

from trajectory_transformer import threads

USER_VARIABLES = threads.USER_VARIABLES


def test_importing_the_package_first_makes_openmp_threads_spin_briefly_then_sleep():
    # libgomp reads the variables when torch loads; OMP_DISPLAY_ENV prints what it read: the
    # spin count, which overrides the passive policy's 0.
    env = {k: v for k, v in os.environ.items() if k not in USER_VARIABLES}
    env["OMP_DISPLAY_ENV"] = "verbose"
    script = "import trajectory_transformer as t; print('policy', t.threads.wait_policy)"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert f"policy GOMP_SPINCOUNT={threads.SHORT_SPIN}" in done.stdout
    if "OPENMP DISPLAY ENVIRONMENT" not in done.stderr:
        pytest.skip("torch's OpenMP runtime here is not GNU libgomp")
    assert f"GOMP_SPINCOUNT = '{threads.SHORT_SPIN}'" in done.stderr, done.stderr


def test_the_users_choice_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert threads.prefer_short_spin() == "ACTIVE"
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    assert "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")  # a spin count of the user's own
    assert threads.prefer_short_spin() == "GOMP_SPINCOUNT=10000"
    assert "OMP_WAIT_POLICY" not in os.environ


def test_after_torch_has_loaded_the_policy_is_left_alone(monkeypatch):
    for name in USER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert "torch" in sys.modules
    assert threads.prefer_short_spin() is None  # too late to matter, so not pretended
    assert "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delitem(sys.modules, "torch")  # as before torch loads
    assert threads.prefer_short_spin() == f"GOMP_SPINCOUNT={threads.SHORT_SPIN}"
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_threads_fit_the_cpus_this_process_may_use(monkeypatch):
    assert 1 <= threads.available_cpus() <= (os.cpu_count() or 1)
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(threads, "available_cpus", lambda: 1)
        assert threads.fit_threads_to_cpus() == 1
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's count wins
        assert threads.fit_threads_to_cpus() == 2
    finally:
        torch.set_num_threads(before)
