"""One TensorFlow in the environment `make install` builds: the `tf` extra's tensorflow-cpu, never
the full `tensorflow` wheel beside it (which overwrites its files and prints CUDA errors on a CPU
machine). tf-keras and tensorflow-serving-api declare that wheel, so the Makefile installs them
without dependencies (NO_DEPS); `pip check` then lists exactly those two, and nothing else.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[;=<>!~]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _needs(dist: str) -> set[str]:
    """The distributions ``dist`` requires whatever extras are asked for."""
    return {_name(r) for r in importlib.metadata.requires(dist) or () if "extra ==" not in r}


def _no_deps() -> list[str]:
    line = re.search(r"^NO_DEPS := (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    return [_name(word.strip('"')) for word in line.split()]


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_no_extra_asks_for_the_full_tensorflow_wheel():
    """No requirement of an extra names `tensorflow`, or installs something that does."""
    for extra, requirements in PROJECT["optional-dependencies"].items():
        for requirement in requirements:
            name = _name(requirement)
            assert name != "tensorflow", (extra, requirement)
            if _installed(name):
                assert "tensorflow" not in _needs(name), f"{extra}: {name} requires the full tensorflow wheel"


def test_the_makefiles_no_deps_packages_are_those_that_ask_for_it():
    """Each NO_DEPS package needs `tensorflow` (hence --no-deps) and nothing the extras leave out."""
    for name in _no_deps():
        if not _installed(name):
            pytest.skip(f"{name} is not installed here (make install installs it)")
        needs = _needs(name)
        assert "tensorflow" in needs, f"{name} does not need the full tensorflow wheel: install it normally"
        assert all(_installed(n) for n in needs - {"tensorflow"}), (name, needs)


def test_one_tensorflow_distribution():
    providers = importlib.metadata.packages_distributions().get("tensorflow", [])
    if not providers:
        pytest.skip("TensorFlow is not installed")
    assert len(set(providers)) == 1, (f"the `tensorflow` module comes from {sorted(set(providers))}: one overwrites "
                                      "the other's files (make install makes it tensorflow-cpu alone)")


def test_pip_check_lists_only_the_no_deps_packages():
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    if "No module named pip" in result.stderr:
        pytest.skip("no pip in this environment")
    for line in result.stdout.splitlines():
        if not line.strip() or line.startswith("No broken requirements"):
            continue
        known = re.fullmatch(r"(\S+) \S+ requires tensorflow, which is not installed\.", line)
        assert known and _name(known.group(1)) in _no_deps(), line


def test_importing_tensorflow_prints_no_cuda_errors():
    """As a user runs the Quick start (TensorFlow's log level as it comes)."""
    pytest.importorskip("tensorflow")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-c", "import tensorflow, tf_keras"], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert "cuInit" not in result.stderr and "cuda" not in result.stderr.lower(), result.stderr
