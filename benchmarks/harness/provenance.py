"""Where a result came from: the commit, the package versions, the device as nvidia-smi names it.

Every results file records these; the harness (``run.py``), the benchmarks beside it
(``large_graphs.py``, ``scaling_gpus.py``, ``scaling_processes.py``, ``gray_scott_bench.py``) and
the probes (``probes/micro.py``) take them from here.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["DISTRIBUTIONS", "ROOT", "command_output", "git_commit", "git_from", "nvidia_smi", "versions"]

ROOT = Path(__file__).resolve().parents[2]

DISTRIBUTIONS = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "cuda-bindings", "cuda-core",
                 "nvidia-cuda-nvrtc", "torch", "cupy-cuda13x", "cupy-cuda12x", "numpy", "matplotlib", "jaxgraph")


def command_output(cmd: list[str]) -> str | None:
    """A command's stripped stdout, or ``None`` when it is missing or fails."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def git_commit() -> str | None:
    """The commit measured: ``JAXGRAPH_GIT`` where set (a copy of the tree may carry a stale .git), else git's."""
    return os.environ.get("JAXGRAPH_GIT") or command_output(["git", "-C", str(ROOT), "describe", "--always",
                                                             "--dirty"])


def git_from() -> str:
    """Which of the two :func:`git_commit` read."""
    return "JAXGRAPH_GIT" if os.environ.get("JAXGRAPH_GIT") else "git describe --always --dirty"


def versions(distributions: tuple[str, ...] = DISTRIBUTIONS, python: bool = True) -> dict[str, str]:
    """Each installed distribution's version (those not installed are left out), after Python's."""
    found = {"python": sys.version.split()[0]} if python else {}
    for dist in distributions:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def nvidia_smi() -> str | None:
    """nvidia-smi's line for the first GPU, ``"<name>, <driver version>"``, or ``None`` without nvidia-smi."""
    smi = command_output(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    return smi.splitlines()[0] if smi else None
