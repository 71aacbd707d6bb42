"""benchmarks/probes/launch_wrapper_probe.cu builds with nvcc (relocatable device code, linked with the
CUDA device runtime) and, without a GPU, stops at its first CUDA call naming it."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import HAS_GPU

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "launch_wrapper_probe.cu"
# Only the nvcc on PATH: a toolkit hidden from PATH (as CI hides it) is not there for this run.
NVCC = shutil.which("nvcc")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc is not on PATH (the probe is plain CUDA C++ built by nvcc; a toolkit off PATH is not used)")
    binary = tmp_path_factory.mktemp("probe") / "launch_wrapper_probe"
    # The command line the probe's header gives, for sm_90.
    cmd = [NVCC, "-O2", "-std=c++17", "-arch=sm_90", "-rdc=true", str(PROBE), "-lcudadevrt", "-o", str(binary)]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    return binary


def test_the_probe_builds_with_the_device_runtime(probe):
    assert probe.stat().st_size > 0 and os.access(probe, os.X_OK)


@pytest.mark.skipif(HAS_GPU, reason="checks the failure on a machine without a GPU")
def test_without_a_gpu_the_probe_names_the_call_that_failed(probe):
    out = subprocess.run([str(probe), "bg=none", "100:3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "cudaStreamCreate" in out.stderr and "->" in out.stderr, out.stderr
