"""A large graph's copy nodes and their address ring (ffi/replay/copy_nodes.h, ffi/replay/copy_ring.h, jaxgraph/_graphs/copy_ring.py).

A graph of thousands of kernels copies its copied buffers by kernel nodes of its one executable;
each call's XLA addresses reach them through a ring of entries in pinned host memory, so a call
whose buffers alternate makes no CUDA call but the launch. Checked here: the kernels compile on
the CPU; calls queued past the ring's size wait for the device and stay exact, including a graph
retired with calls in flight; the same on a second device; a bound buffer whose address keeps
missing switches to copying without a new executable, and from then on a call rewrites nothing.

Tests internals (listed in tests/README.md): ``_graphs.copy_ring.ring_kernels`` (compiled on the CPU).
Through ``jaxgraph.diagnostics``: ``native_module("replay").set_device_launch_nodes`` (lowered so a graph
of a few dozen kernels qualifies), ``set_copy_ring_slots`` (a ring of two entries),
``set_max_executables``, ``counters`` and ``describe_graph``.
"""

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgraph  # noqa: E402
from support.graph_helpers import assert_switched_and_copied_by_nodes, driver_call  # noqa: E402
from jaxgraph.diagnostics import counters, describe_graph, native_module  # noqa: E402
from support.kernel_sources import ADD_ONE, SPIN_ADD_ONE  # noqa: E402

N = 1024


def test_the_copy_node_kernels_compile_to_cubin_without_a_device():
    from jaxgraph._graphs.copy_ring import ring_kernels

    kernels = ring_kernels("sm_90")
    assert sorted(kernels) == ["jaxgraph_ring_advance", "jaxgraph_ring_copy"]
    for k in kernels.values():
        assert k.cubin[:4] == b"\x7fELF" and k.arch == "sm_90", k


def test_the_ring_size_is_a_thousand_calls_and_must_be_positive():
    p = native_module("replay")
    previous = p.set_copy_ring_slots(8)
    try:
        assert previous == 1024
        with pytest.raises(ValueError, match="copy ring slots must be >= 1, got 0"):
            p.set_copy_ring_slots(0)
        assert p.set_copy_ring_slots(previous) == 8
    finally:
        p.set_copy_ring_slots(previous)


def test_no_device_wide_synchronize_where_a_graph_or_its_ring_is_destroyed():
    # A graph's destructor may run under the graph table's exclusive lock or on XLA's handler
    # thread: a device-wide synchronize there deadlocks with a psum in flight (device 0 waits for
    # device 1, whose handler waits for the lock). The ring only joins the retired rings there;
    # a sweep, holding no lock, frees those whose calls have finished.
    import re

    ffi = Path(__file__).resolve().parents[2] / "ffi"
    for path in sorted(ffi.rglob("*.[ch]*")):
        text = path.read_text()
        for call in ("cudaDeviceSynchronize", "cuCtxSynchronize", "DeviceSynchronize"):
            assert call not in text, f"{path.name} calls {call}"
    ring = next(ffi.rglob("copy_ring.h")).read_text()
    release = re.search(r"inline void CopyRing::Release\(int device\) \{(.*?)\n\}", ring, re.S).group(1)
    assert not re.search(r"\bcu[A-Z]|\bcuda[A-Z]", release), release  # no CUDA call at all: a list push
    sweep = re.search(r"inline size_t SweepRetiredRings\(\) \{(.*?)\n\}", ring, re.S).group(1)
    locked, freeing = sweep.split("if (finished.empty())")
    assert "lock_guard" in locked and "cudaFree" not in locked and "lock" not in freeing, sweep


HOLD_UNTIL = r"""
extern "C" __global__ void hold_until(unsigned long long flag_address, long long cycles) {
  volatile int* flag = (volatile int*)flag_address;  // pinned host memory: [released, gave up]
  long long start = clock64();
  while (flag[0] == 0) {
    if (clock64() - start > cycles) { flag[1] = 1; return; }
  }
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", [20, 4096], ids=["threshold_lowered", "4096_kernels"])
def test_retiring_a_large_graph_waits_for_no_other_stream_s_work(kernels, rng):
    # Other work holds the device (a kernel on another stream that runs until the host releases
    # it); retiring a graph with copy nodes and its ring must not wait for it under the table's
    # lock: a thread that needs the table (as another device's handler would) goes on at once.
    # 4096 kernels: the default threshold (kDeviceLaunchNodes), no knob.
    import ctypes
    import threading
    import time

    from cuda.bindings import driver as drv

    if kernels == 4096:
        g, x_s, y_s, step = _spin_chain(kernels, 0)
    else:
        g, x_s, y_s, step = _large(lambda: _spin_chain(kernels, 1000))
    assert describe_graph(step.graph_id, g.device).copy_nodes == 2
    f = jax.jit(step)
    x0 = rng.integers(-1000, 1000, N).astype(np.float32)
    y = f(jnp.asarray(x0))
    np.testing.assert_array_equal(np.asarray(y), x0 + kernels)  # the ring was used
    flags = drv.CU_MEMHOSTALLOC_DEVICEMAP | drv.CU_MEMHOSTALLOC_PORTABLE
    host = int(driver_call("cuMemHostAlloc", 8, flags)[0])
    ctypes.memset(host, 0, 8)
    flag = (ctypes.c_int32 * 2).from_address(host)
    address = int(driver_call("cuMemHostGetDevicePointer", host, 0)[0])
    hold = jaxgraph.Kernel(HOLD_UNTIL, "hold_until")
    other = jaxgraph.Stream()
    hold[1, 1, 0, other](address, 40_000_000_000)  # gives up by itself after ~20 s (then flag[1] = 1)
    try:
        closer = threading.Thread(target=step.close, daemon=True)
        closer.start()
        time.sleep(0.5)  # the close reaches the table
        looked = []
        looker = threading.Thread(target=lambda: looked.append(native_module("replay").live_graphs()), daemon=True)
        start = time.monotonic()
        looker.start()
        looker.join(10)
        took = time.monotonic() - start
    finally:
        flag[0] = 1  # release the held kernel
        other.synchronize()
    closer.join(60)
    looker.join(60)
    assert flag[1] == 0, "the held kernel gave up: something waited for it while holding what this test needed"
    assert looked and took < 10, took
    assert not closer.is_alive()
    del f, step
    assert native_module("replay").sweep_copy_rings() == 0 and native_module("replay").retired_copy_rings() == 0
    driver_call("cuMemFreeHost", host)


def _large(capture, slots=None):
    """A replayable of `capture()`'s graph, device-launchable from 16 kernels, its ring of `slots` entries."""
    p = native_module("replay")
    launch_nodes = p.set_device_launch_nodes(16)
    ring = p.set_copy_ring_slots(slots) if slots else None
    try:
        return capture()
    finally:
        p.set_device_launch_nodes(launch_nodes)
        if ring is not None:
            p.set_copy_ring_slots(ring)


def _spin_chain(kernels, cycles):
    """A chain of `kernels` spin_add_one kernels, x -> y, both copied (bind="copy"), on the current device."""
    spin = jaxgraph.Kernel(SPIN_ADD_ONE, "spin_add_one")
    spin.handle  # noqa: B018 - load before capture
    x_s, y_s = jaxgraph.empty(N), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        spin[N // 256, 256](y_s, x_s, cycles, N)
        for _ in range(kernels - 1):
            spin[N // 256, 256](y_s, y_s, cycles, N)
    return g, x_s, y_s, jaxgraph.replayable(g, [x_s], [y_s], bind="copy")


@pytest.mark.gpu
def test_calls_queued_past_the_ring_wait_for_the_device_and_stay_exact(rng):
    kernels, cycles = 24, 30_000  # ~17 us a kernel: ~0.4 ms a call, far more than the host's
    g, x_s, y_s, step = _large(lambda: _spin_chain(kernels, cycles), slots=2)
    info = describe_graph(step.graph_id, g.device)
    assert info.device_launchable and info.copy_nodes == 2, info
    x_s.fill_(np.float32(np.nan)), y_s.fill_(np.float32(np.nan))
    f = jax.jit(step)
    x0 = rng.integers(-1000, 1000, N).astype(np.float32)
    before = counters()
    outs, x = [], jnp.asarray(x0)
    for _ in range(12):  # all held: every call writes a new buffer, read from the previous one
        x = f(x)
        outs.append(x)
    for c, out in enumerate(outs):
        np.testing.assert_array_equal(np.asarray(out), x0 + (c + 1) * kernels, err_msg=f"call {c}")
    change = {k: v - before[k] for k, v in counters().items()}
    assert change["launch"] == 12 and change["node_copy"] == 24 and change["copy"] == 0, change
    assert change["ring_wait"] >= 1, change  # two entries, twelve calls queued: the host waited
    # Retired with calls in flight: the ring's memory outlives them, their results stay exact.
    outs, x = [], jnp.asarray(x0)
    for _ in range(6):
        x = f(x)
        outs.append(x)
    step.close()
    del f, step
    for c, out in enumerate(outs):
        np.testing.assert_array_equal(np.asarray(out), x0 + (c + 1) * kernels, err_msg=f"retired, call {c}")
    # Its calls done, the ring is freed by the next sweep (nothing waited for the device to free it).
    assert native_module("replay").sweep_copy_rings() == 0 and native_module("replay").retired_copy_rings() == 0


@pytest.mark.gpu
def test_copy_nodes_work_on_a_second_device(rng):
    # The ring's counter is allocated on the graph's device, its kernels loaded in that device's
    # context; its pinned entries are reachable from every device.
    if len(jax.devices("gpu")) < 2 or jaxgraph.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    kernels = 20
    jaxgraph.set_device(1)
    try:
        g, x_s, y_s, step = _large(lambda: _spin_chain(kernels, 1000))
    finally:
        jaxgraph.set_device(0)
    assert g.device == 1
    info = describe_graph(step.graph_id, 1)
    assert info.device_launchable and info.copy_nodes == 2, info
    f = jax.jit(step)
    x0 = rng.integers(-1000, 1000, N).astype(np.float32)
    x = jax.device_put(x0, jax.devices("gpu")[1])
    before = counters()
    for call in range(6):  # x = f(x) on device 1: XLA alternates its buffers there
        x = f(x)
        np.testing.assert_array_equal(np.asarray(x), x0 + (call + 1) * kernels, err_msg=f"call {call}")
    change = {k: v - before[k] for k, v in counters().items()}
    assert change["launch"] == 6 and change["node_copy"] == 12 and change["copy"] == 0, change


@pytest.mark.gpu
def test_a_one_site_buffer_that_keeps_missing_switches_to_copying_with_no_new_executable(rng):
    # One kernel reads the input, one writes the output: one site each. With one executable and
    # XLA alternating its buffers (x = f(x)), every call misses; rewriting a site costs more than
    # storing an address for the copy nodes the executable has had since registration.
    from jaxgraph import BindingMode

    kernels = 20

    def capture():
        add_one = jaxgraph.Kernel(ADD_ONE, "add_one")
        add_one.handle  # noqa: B018 - load before capture
        x_s, t, y_s = jaxgraph.empty(N), jaxgraph.empty(N), jaxgraph.empty(N)
        g = jaxgraph.CUDAGraph()
        with jaxgraph.graph(g):
            add_one[N // 256, 256](t, x_s, N)
            for _ in range(kernels - 2):
                add_one[N // 256, 256](t, t, N)
            add_one[N // 256, 256](y_s, t, N)
        return g, x_s, y_s, jaxgraph.replayable(g, [x_s], [y_s])

    g, x_s, y_s, step = _large(capture)
    assert [r.mode for r in step.bindings[g.device]] == [BindingMode.BOUND] * 2
    native_module("replay").set_max_executables(step.graph_id, g.device, 1)
    made = counters()["instantiate"]
    y_s.fill_(np.float32(np.nan))
    f = jax.jit(step)
    x0 = rng.integers(-1000, 1000, N).astype(np.float32)
    x = jnp.asarray(x0)
    for call in range(16):
        x = f(x)
        np.testing.assert_array_equal(np.asarray(x), x0 + (call + 1) * kernels, err_msg=f"call {call}")

    def fed(call):  # each result the next call's input, as above
        nonlocal x
        x = f(x)
        return x, x0 + (call + 17) * kernels

    before = assert_switched_and_copied_by_nodes(step, g.device, fed)
    print("executables made while alternating:", before["instantiate"] - made)
