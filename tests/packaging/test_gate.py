"""The GPU gate: with ``JAXGRAPH_REQUIRE_GPU=1`` a run that finds no CUDA device fails;
the sharded tests fail where JAX has no GPU backend but a GPU is there.

``tests/gpu_check.sh`` sets the variable, so on the GPU machine a broken driver
or binding fails the run instead of turning every GPU test into a skip. Checked
in a subprocess with ``CUDA_VISIBLE_DEVICES=""``, which hides the GPUs on a GPU
machine too, so this test runs (and means the same) everywhere.
"""

import os
import pathlib
import subprocess
import sys

import jax
import pytest

from support.graph_helpers import jax_gpus

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROBE = "tests/graphs/test_graphs_api.py::test_removable_handle_removes_once_and_is_a_context_manager"


def run_pytest(**env):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", PROBE],
                          cwd=ROOT, env=dict(os.environ, CUDA_VISIBLE_DEVICES="", **env),
                          capture_output=True, text=True, timeout=300)


def test_a_required_gpu_that_is_missing_fails_the_session_with_the_reason():
    result = run_pytest(JAXGRAPH_REQUIRE_GPU="1")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "JAXGRAPH_REQUIRE_GPU is set but jaxgraph finds no CUDA device (CudaUnavailableError: " in output
    assert "every GPU test would skip" in output
    assert " passed" not in output  # the session stopped before running anything


def test_sharded_tests_fail_when_jax_has_no_gpu_backend(monkeypatch):
    def no_backend(backend=None):
        raise RuntimeError(f"Unknown backend {backend}")

    monkeypatch.setattr(jax, "local_devices", no_backend)
    with pytest.raises(pytest.fail.Exception, match=r"JAX has no GPU backend on this GPU machine .*jax\[cuda13\]"):
        jax_gpus()
