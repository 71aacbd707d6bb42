"""benchmarks/probes/handler_parts_probe.py on the CPU: it parses its options and, without a GPU, says so."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HAS_GPU

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "handler_parts_probe.py"


def run(*args):
    return subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=120)


def test_the_probe_documents_its_options():
    out = run("--help")
    assert out.returncode == 0, out.stderr
    assert "--with-jax" in out.stdout and "--sizes" in out.stdout


@pytest.mark.skipif(HAS_GPU, reason="checks the message on a machine without a GPU")
def test_without_a_gpu_the_probe_says_it_needs_one():
    out = run("--sizes", "10", "--calls", "2")
    assert out.returncode == 1
    assert "no CUDA device: the probe needs a GPU" in out.stderr
