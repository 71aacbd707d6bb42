"""Kernels, references and helpers shared by the graph and generator tests.

The replay counters' change over jitted calls whose result addresses alternate
(``alternate_calls``) comes from ``jaxgraph.diagnostics.counters``.
"""

import json
import os
import subprocess
import sys
import types

import numpy as np

import jaxgraph
from support.kernel_sources import (ADD, AXPB, AXPY_OUT, BLOCK_SUM, BLOCK_SUM_DYNAMIC, INC, SAXPY, SCALAR_TYPES, SCALE, SQUARE,
                     SUM_DIFF)

BLOCK = 256

N = 4096  # elements of the graph tests' arrays (test_graphs*.py), random_floats' default

GRAPH_KERNELS = AXPB + SCALE + ADD + BLOCK_SUM

KERNEL_NAMES = ("axpb", "scale", "add", "block_sum")

# The JAX interop tests' kernels (test_jax_gpu.py, test_jax_kernel_call.py).
JAX_SRC = AXPY_OUT + SAXPY + SUM_DIFF + AXPB + INC + SQUARE + SCALAR_TYPES + BLOCK_SUM_DYNAMIC

JAX_KERNEL_NAMES = ("axpy_out<float>", "axpy_out<double>", "axpy_out<int>", "saxpy", "sum_diff", "axpb",
                    "inc", "square", "square_bwd", "scalars", "block_sum_dynamic")


def jax_gpus():
    """JAX's local GPU devices, for tests that run only where jaxgraph sees a CUDA device.

    There, a JAX without a GPU backend is a broken install (no ``jax[cuda13]``):
    the test fails saying so, never skips.
    """
    import jax
    import pytest

    try:
        return jax.local_devices(backend="gpu")
    except RuntimeError as exc:
        pytest.fail(f"JAX has no GPU backend on this GPU machine ({jaxgraph.device_count()} CUDA device(s)): "
                    f"install JAX with CUDA (pip install 'jax[cuda13]'); {exc}", pytrace=False)


def load_kernels():
    """Compile and load the test kernels (loading before capture keeps it out of the graph)."""
    ks = {name: jaxgraph.Kernel(GRAPH_KERNELS, name) for name in KERNEL_NAMES}
    for k in ks.values():
        k.handle  # noqa: B018 - loads the library now
    return types.SimpleNamespace(**ks)


def random_floats(rng, n=N):
    """``n`` fresh standard-normal float32 values (``rng`` is unseeded: new inputs every run)."""
    return rng.standard_normal(n, dtype=np.float32)


def jax_kernels():
    """The JAX interop tests' kernels by name (``JAX_SRC``, compiled on first use)."""
    return {name: jaxgraph.Kernel(JAX_SRC, name) for name in JAX_KERNEL_NAMES}


def blocks(n):
    return (n + BLOCK - 1) // BLOCK


def capture_scale(k, rng, a):
    """A CUDAGraph of one kernel, y = a * x, captured on fresh arrays: ``(data, x, y, g)``, ``data`` the
    host copy of ``x``; nothing else keeps them alive."""
    data = random_floats(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](y, x, a, N)
    return data, x, y, g


def poison(array):
    """Fill with NaN so an output the graph failed to write is caught."""
    array.fill_(np.float32(np.nan))


def replay_and_check(g, outputs, expected, rtol=1e-6, atol=0.0):
    """Poison ``outputs`` with NaN, replay ``g`` and compare each output with its expected values.

    ``outputs`` and ``expected`` are one array or sequences of them; ``rtol=0``
    asks for exact equality.
    """
    if not isinstance(outputs, (list, tuple)):
        outputs, expected = (outputs,), (expected,)
    for out in outputs:
        poison(out)
    g.replay()
    for out, want in zip(outputs, expected):
        np.testing.assert_allclose(out.numpy(), want, rtol=rtol, atol=atol)


class NullBuffer:
    """A foreign device buffer at address 0 (CUDA Array Interface v3): never read, written or launched."""

    def __init__(self, shape, dtype):
        self.__cuda_array_interface__ = {"data": (0, False), "shape": tuple(shape),
                                         "typestr": np.dtype(dtype).str, "version": 3}


def null_array(shape=(4,), dtype=np.float32):
    """A DeviceArray at address 0 made by the public ``jaxgraph.asarray`` (no device needed),
    for argument checks that must fail before anything touches it."""
    return jaxgraph.asarray(NullBuffer(shape, dtype))


def free_device_bytes():
    """Free device memory (after all work finished), from cuMemGetInfo."""
    jaxgraph.synchronize()  # also makes the device's primary context current on this thread
    return int(driver_call("cuMemGetInfo")[0])


def driver_call(name, *args):
    """``cuda.bindings.driver.<name>(*args)``'s values; a CUresult other than success fails the test."""
    from cuda.bindings import driver

    err, *values = getattr(driver, name)(*args)
    assert err == driver.CUresult.CUDA_SUCCESS, f"{name}: {err}"
    return values


def path_calls(before: dict, after: dict) -> dict:
    """Calls per native replay path between two ``jaxgraph.diagnostics.counters()`` snapshots.

    One key per :class:`jaxgraph.ReplayPath` that the extension counts, so a test asserts
    exactly which path ran: ``path_calls(b, a) == {"launch": 4, "splice_nodes": 0, ...}``;
    ``before={}`` reads ``after`` as a change already taken.
    """
    paths = [p.value for p in jaxgraph.ReplayPath if p is not jaxgraph.ReplayPath.HOST_CALLBACK]
    return {p: after[p] - before.get(p, 0) for p in paths}


def launched(calls: int) -> dict:
    """``path_calls`` of ``calls`` calls that each launched the graph on XLA's stream (no command buffer)."""
    return {"launch": calls, "splice_nodes": 0, "splice_whole": 0, "uncaptured_launch": 0}


def alternate_calls(f, xj, calls=12, settle=6):
    """Call ``f(xj)`` ``calls`` times, each result alive while XLA allocates the next (so result
    addresses alternate); return the last result, the result addresses seen and the counters'
    change over the calls after ``settle``."""
    from jaxgraph.diagnostics import counters

    out, seen, before = None, set(), None
    for i in range(calls):
        if i == settle:
            before = counters()
        out = f(xj)
        seen.add(out.unsafe_buffer_pointer())
    after = counters()
    return out, seen, {key: after[key] - before[key] for key in after}


def assert_switched_and_copied_by_nodes(step, device, call, calls=4):
    """A large graph's two static buffers (one array, in and out) switched to copying: they are
    ``COPIED_BY_COST``, copied by the two copy nodes of its one executable, and each of ``calls``
    more calls (``call(i)`` returns the result and numpy's) is exact, launches, copies by those
    nodes alone and rewrites or makes nothing. Returns the counters before those calls."""
    from jaxgraph.diagnostics import counters, describe_graph

    rows = step.bindings[device]
    assert [r.mode for r in rows] == [jaxgraph.BindingMode.COPIED_BY_COST] * 2, rows
    info = describe_graph(step.graph_id, device)
    assert info.copy_nodes == 2 and info.executables == 1, info
    before = counters()
    for i in range(calls):
        got, want = call(i)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"copied, call {i}")
    change = {k: v - before[k] for k, v in counters().items()}
    assert change["launch"] == calls and change["node_copy"] == 2 * calls and change["copy"] == 0, change
    assert change["rebind"] == 0 and change["instantiate"] == 0, change  # nothing bound left to rewrite or make
    return before


MiB = 1 << 20


# ---------------------------------------------------------------------------
# Philox-4x32-10 in numpy: the reference for jaxgraph.Generator
# ---------------------------------------------------------------------------


_MASK = np.uint64(0xFFFFFFFF)


def philox4x32_10(ctr, key):
    """Philox-4x32-10 of counters ``ctr`` (..., 4) under ``key`` (2,), as uint32 (..., 4)."""
    ctr = np.asarray(ctr, dtype=np.uint64).reshape(-1, 4)
    c0, c1, c2, c3 = (ctr[:, i].copy() for i in range(4))
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(0x9E3779B9)) & _MASK
            k1 = (k1 + np.uint64(0xBB67AE85)) & _MASK
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _MASK,
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _MASK)
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def philox_words(seed, offset, n):
    """The 32-bit word behind element ``i < n`` of draw ``offset`` with ``seed``."""
    nblocks = (n + 3) // 4
    j = np.arange(nblocks, dtype=np.uint64)
    ctr = np.stack([j & _MASK, j >> np.uint64(32),
                    np.full(nblocks, offset & 0xFFFFFFFF, np.uint64),
                    np.full(nblocks, offset >> 32, np.uint64)], axis=1)
    key = (seed & 0xFFFFFFFF, seed >> 32)
    return philox4x32_10(ctr, key)


def ref_uniform(seed, offset, n):
    """What ``Generator.uniform`` writes at draw ``offset`` (exactly)."""
    words = philox_words(seed, offset, n).reshape(-1)[:n]
    return (words >> 8).astype(np.float32) * np.float32(2.0 ** -24)


def ref_normal(seed, offset, n):
    """What ``Generator.normal`` writes at draw ``offset`` (to float32 rounding)."""
    words = philox_words(seed, offset, n)                    # (blocks, 4)
    i = np.arange(n)
    block, c = i >> 2, i & 3
    pair = c >> 1
    a = words[block, 2 * pair].astype(np.float64)
    b = words[block, 2 * pair + 1].astype(np.float64)
    u1 = (np.floor(a / 256) + 1) * 2.0 ** -24
    u2 = np.floor(b / 256) * 2.0 ** -24
    radius = np.sqrt(-2.0 * np.log(u1))
    return np.where(c & 1, radius * np.sin(2 * np.pi * u2), radius * np.cos(2 * np.pi * u2))


# ---------------------------------------------------------------------------
# XLA command buffers on and off, in fresh processes (XLA reads XLA_FLAGS once)
# ---------------------------------------------------------------------------

XLA_MODES = {
    "off": "--xla_gpu_enable_command_buffer=",
    "on": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
    "defaults": None,  # XLA_FLAGS unset: JAX's own command-buffer settings
}


TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # on a worker's path: it imports support.*


def run_xla_worker(worker, src, tmp_path, mode, seed, paths=()):
    """Run ``worker`` (a script taking ``src.cu seed out.npy``) with ``mode``'s XLA flags; return
    the array it saved and the JSON it printed after ``REPORT ``. ``tests/`` and ``paths`` are on
    its import path."""
    (tmp_path / "src.cu").write_text(src)
    out = tmp_path / f"{mode}.npy"
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONPATH=os.pathsep.join([TESTS, *paths, os.environ.get("PYTHONPATH", "")]))
    env.pop("XLA_FLAGS", None)
    if XLA_MODES[mode] is not None:
        env["XLA_FLAGS"] = XLA_MODES[mode]
    proc = subprocess.run([sys.executable, "-c", worker, str(tmp_path / "src.cu"), str(seed), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"worker ({mode}) failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    (line,) = [l for l in proc.stdout.splitlines() if l.startswith("REPORT ")]
    return np.load(out), json.loads(line[len("REPORT "):])


def cupy_stream(cupy, stream):
    """CuPy's view of jaxgraph ``stream``: ``Stream.from_external`` (CuPy 14+, through ``__cuda_stream__``).

    CuPy before 14 has only ``ExternalStream`` (deprecated since), used there alone.
    """
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(stream)
    return cupy.cuda.ExternalStream(int(stream), stream.device)


def on_device(device, make):
    """``make()`` with ``device`` current, then device 0 current again."""
    jaxgraph.set_device(device)
    try:
        return make()
    finally:
        jaxgraph.set_device(0)
