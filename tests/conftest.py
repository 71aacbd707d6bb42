"""Shared fixtures: GPU tests are marked ``gpu`` and skip where no CUDA device exists."""

import os

import jax
import numpy as np
import pytest

import jaxgraph

# Keep compiled cubins of the test run out of the user's cache unless asked.
os.environ.setdefault("JAXGRAPH_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".jaxgraph_cache"))

HAS_GPU = jaxgraph.device_count() > 0

# jax.enable_x64 is jax 0.8's name for jax.experimental.enable_x64 (gone in 0.9);
# jaxgraph supports jax 0.6 and up.
if hasattr(jax, "enable_x64"):
    enable_x64 = jax.enable_x64
else:
    from jax.experimental import enable_x64


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
