"""The one-question probes of benchmarks/ run end to end: on the GPU with tiny arguments, checking
their results against numpy as they go; without one they say so and exit cleanly.

Their figures are read by hand (tests/GPU_RESULTS.md); what is tested here is that each still runs
and prints what its docstring promises.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HAS_GPU

ROOT = Path(__file__).resolve().parents[2]

PROBES = {  # script: (tiny arguments, a line it prints on the GPU)
    "floor_probe.py": (["--n", "100", "--rounds", "1", "--launches", "2"], "N=100 jit: the replay handler keeps"),
    "placement_probe.py": (["--n", "10", "--buffers", "2", "--rounds", "1", "--launches", "2"],
                           "buffers JAX allocated"),
    "matched_floor_probe.py": (["--n", "100", "--rounds", "1", "--ms", "1"], "jit_loop / raw_xla"),
    "stamp_probe.py": (["--n", "100", "--calls", "20", "--rounds", "1"], "fori_loop: "),
    "stop_probe.py": (["--steps", "50", "--rounds", "1", "--launches", "1"], "over the floor (median)"),
    "gray_scott_tiles.py": (["--grids", "48", "--steps", "3", "--substeps", "5", "--repeats", "1", "--out", "{tmp}"],
                            "TILING 48="),
    "ode_geometry.py": (["--sizes", "40,300", "--geometries", "64x1", "--t-end", "0.5", "--repeats", "1"],
                        "N=   300     64x1 (  7 blocks): loop"),
    "xla_while_probe.py": (["--n", "12", "--max-iter", "3", "--timeout", "60", "--variants", "jacobi"],
                           "jacobi: ended, count"),
}


@pytest.mark.parametrize("script", sorted(PROBES))
def test_probe_runs(script, tmp_path):
    args, expected = PROBES[script]
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probes" / script), *args], capture_output=True,
                            text=True, env=env, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert (expected if HAS_GPU else f"{script} needs a CUDA GPU: none found") in output, output
