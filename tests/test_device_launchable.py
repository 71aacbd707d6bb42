"""Large graphs get executables launchable from the device, and the handler still launches them from the host.

Tests internals (listed in tests/README.md): ``internals.native_replay().set_device_launch_nodes``
(the threshold, lowered here so a graph of a few dozen kernels qualifies), ``set_max_executables``
(one executable, so every new input address rewrites it in place), ``internals.counters`` and
``internals.describe_graph``.

Why: ``cudaGraphLaunch`` of a normal executable costs host time per node (7-12 ns on the H100,
~1.2 ms at 100k kernels); one instantiated with ``cudaGraphInstantiateFlagDeviceLaunch`` costs a
small constant (ffi/device_graph.h). Results are checked exactly against numpy on fresh random
inputs, through XLA ops before and after the replay, with the static output poisoned first.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgraph  # noqa: E402
from internals import counters, describe_graph, native_replay  # noqa: E402
from kernels import ADD_ONE  # noqa: E402

N = 1024
KERNELS = 40


def test_the_threshold_is_four_thousand_kernels_and_can_be_changed():
    p = native_replay()
    previous = p.set_device_launch_nodes(16)
    try:
        assert previous == 4096
        assert p.set_device_launch_nodes(-1) == 16
    finally:
        p.set_device_launch_nodes(previous)


def _chain(kernels):
    add_one = jaxgraph.Kernel(ADD_ONE, "add_one")
    add_one.handle  # noqa: B018 - load before capture
    x_s, y_s = jaxgraph.empty(N), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        add_one[N // 256, 256](y_s, x_s, N)
        for _ in range(kernels - 1):
            add_one[N // 256, 256](y_s, y_s, N)
    return g, x_s, y_s


@pytest.mark.gpu
def test_a_large_graph_replays_exactly_from_device_launchable_executables(rng):
    p = native_replay()
    previous = p.set_device_launch_nodes(16)  # "large": at least 16 kernels, for this test
    try:
        g, x_s, y_s = _chain(KERNELS)
        step = jaxgraph.replayable(g, [x_s], [y_s])
        small_g, small_x, small_y = _chain(8)
        small = jaxgraph.replayable(small_g, [small_x], [small_y])
    finally:
        p.set_device_launch_nodes(previous)
    info = describe_graph(step.graph_id, g.device)
    assert info.device_launchable and info.launch_note == "", info
    assert not describe_graph(small.graph_id, small_g.device).device_launchable  # 8 < 16 kernels
    y_s.fill_(np.float32(np.nan))  # a replay that does nothing cannot pass
    f = jax.jit(lambda x: step(x - 5.0) * 2.0 + 1.0)  # XLA reads what the graph wrote, in order
    before = counters()
    for call in range(6):  # fresh executables, one per new input address
        x = rng.integers(-1000, 1000, N).astype(np.float32)
        got = np.asarray(f(jnp.asarray(x)))
        np.testing.assert_array_equal(got, (x - 5.0 + KERNELS) * 2.0 + 1.0, err_msg=f"call {call}")
    # One executable: each new input address rewrites its one site in place (or replaces the
    # executable with a fresh one where that pays: exec_cache.h), then it is launched.
    # (The replay's operand there is XLA's temporary, at one address: here the inputs themselves.)
    p.set_max_executables(step.graph_id, g.device, 1)
    direct = jax.jit(step)
    hosts = [rng.integers(-1000, 1000, N).astype(np.float32) for _ in range(6)]
    xs = [jnp.asarray(h) for h in hosts]  # all alive: six input addresses
    middle = counters()
    for call, (h, x) in enumerate(zip(hosts, xs)):
        np.testing.assert_array_equal(np.asarray(direct(x)), h + KERNELS, err_msg=f"rewritten, call {call}")
    after = counters()
    assert after["launch"] - before["launch"] >= 12, (before, after)
    changed = {k: after[k] - middle[k] for k in ("rebind", "instantiate")}
    assert changed["rebind"] + changed["instantiate"] >= 5, changed  # every new address was written somewhere
    print("with one executable:", changed)
    assert describe_graph(step.graph_id, g.device).device_launchable
