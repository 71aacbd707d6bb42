"""Shared fixtures: GPU tests are marked ``gpu`` and skip where no CUDA device exists.

On the GPU machine, ``JAXGRAPH_REQUIRE_GPU=1`` (set by ``tests/gpu_check.sh``)
turns "no CUDA device" into a failed session: a broken driver or binding must
not pass as a run whose GPU tests all skipped.
"""

import os
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxgraph

# Keep compiled cubins of the test run out of the user's cache unless asked.
os.environ.setdefault("JAXGRAPH_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".jaxgraph_cache"))

HAS_GPU = jaxgraph.device_count() > 0
REQUIRE_GPU = os.environ.get("JAXGRAPH_REQUIRE_GPU", "").strip() not in ("", "0")

# jax.enable_x64 is jax 0.8's name for jax.experimental.enable_x64 (gone in 0.9);
# jaxgraph supports jax 0.6 and up.
if hasattr(jax, "enable_x64"):
    enable_x64 = jax.enable_x64
else:
    from jax.experimental import enable_x64


def example(name: str):
    """``examples/<name>.py`` as a module, loaded as the benchmarks load it (``benchmarks/harness/example_loader.py``)."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)  # `benchmarks` is a package at the repository root
    from benchmarks.harness.example_loader import load

    return load(name)


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    if REQUIRE_GPU:
        pytest.exit(f"JAXGRAPH_REQUIRE_GPU is set but jaxgraph finds no CUDA device ({no_gpu_reason()}), so "
                    "every GPU test would skip. Fix the driver or cuda-bindings (check nvidia-smi and "
                    "python3 -c 'import jaxgraph; print(jaxgraph.device_count())'), or unset "
                    "JAXGRAPH_REQUIRE_GPU to run only the CPU tests", returncode=pytest.ExitCode.TESTS_FAILED)
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def no_gpu_reason() -> str:
    """Why jaxgraph sees no CUDA device: the error CUDA's initialisation gives."""
    try:
        jaxgraph.set_device(0)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return f"jaxgraph.device_count() is {jaxgraph.device_count()}"


@pytest.fixture
def rng():
    """A fresh, unseeded generator: every run checks new random inputs."""
    return np.random.default_rng()


@pytest.fixture
def side_stream():
    """A new non-blocking stream, closed after the test."""
    s = jaxgraph.Stream()
    yield s
    s.synchronize()
    s.close()
