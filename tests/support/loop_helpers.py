"""Shared by the graphed-loop tests (no tests here): numpy's reference of ``kernel_sources.LOOP_STEP``'s step, and
a jit check run in a fresh process under one of ``graph_helpers.XLA_MODES`` (XLA reads XLA_FLAGS once)."""

import os
import subprocess
import sys

import numpy as np

from support.graph_helpers import XLA_MODES


def ref(x, b, steps):
    x = x.astype(np.float32).copy()
    for _ in range(steps):
        x = np.float32(0.5) * x + b
    return x


_WORKER = r"""
import sys, numpy as np
sys.path[:0] = sys.argv[1:]  # this folder, and tests/ (the shared modules)
import {module} as t
t.{check}(t.{kernels}(), np.random.default_rng())
print("JIT OK")
"""


def run_jit_worker(module, check, kernels, mode):
    """``module.check(module.kernels(), rng)`` in a fresh process with ``XLA_MODES[mode]`` as XLA_FLAGS
    (unset for None), printing "JIT OK" at the end: the finished process."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env.pop("XLA_FLAGS", None)
    if XLA_MODES[mode] is not None:
        env["XLA_FLAGS"] = XLA_MODES[mode]
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jax_interop")  # the test modules
    worker = _WORKER.format(module=module, check=check, kernels=kernels)
    return subprocess.run([sys.executable, "-c", worker, here, os.path.dirname(here)], env=env,
                          capture_output=True, text=True, timeout=300)
