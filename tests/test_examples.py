"""Every example in examples/ runs to completion, and its own check passes.

Each example compares what it computed with a numpy reference and prints a
line containing "matches" when it does (and raises when it does not). Without
a GPU an example says so in one line and exits 0; the kernels it can compile
without one are still compiled.
"""

import os
import pathlib
import subprocess
import sys

import pytest

import jaxgraph

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_and_checks_itself(path):
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env,
                            timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    if jaxgraph.device_count() > 0:
        assert "matches" in output, output
    else:
        assert "none found" in output, output
