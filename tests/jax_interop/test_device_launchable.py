"""Large graphs get executables launchable from the device, and the handler still launches them from the host;
their copied buffers are copied by copy nodes of the executable (ffi/replay/copy_nodes.h; their address ring:
tests/jax_interop/test_copy_ring.py).

Through ``jaxgraph.diagnostics``: ``native_module("replay").set_device_launch_nodes`` (the threshold,
lowered here so a graph of a few dozen kernels qualifies), ``set_max_executables`` (one executable, so
every new input address rewrites it in place), ``counters`` and ``describe_graph``.

Why: ``cudaGraphLaunch`` of a normal executable costs host time per node (7-12 ns on the H100,
~1.2 ms at 100k kernels); one instantiated with ``cudaGraphInstantiateFlagDeviceLaunch`` costs a
small constant (ffi/replay/device_graph.h). Results are checked exactly against numpy on fresh random
inputs, through XLA ops before and after the replay, with the static output poisoned first.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgraph  # noqa: E402
from support.graph_helpers import assert_switched_and_copied_by_nodes  # noqa: E402
from jaxgraph.diagnostics import counters, describe_graph, native_module  # noqa: E402
from support.kernel_sources import ADD_ONE  # noqa: E402

N = 1024
KERNELS = 40


def test_the_threshold_is_four_thousand_kernels_and_can_be_changed():
    p = native_module("replay")
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
    p = native_module("replay")
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
    changed = {k: after[k] - middle[k] for k in ("rebind", "instantiate", "node_copy")}
    # Every new address was written somewhere, or (once it kept missing) the input switched to
    # copying and its copy node took it: either way something per call.
    assert changed["rebind"] + changed["instantiate"] + changed["node_copy"] >= 6, changed
    print("with one executable:", changed)
    assert describe_graph(step.graph_id, g.device).device_launchable


# ---------------------------------------------------------------------------
# Copied buffers of such graphs: copied by copy nodes of the executable
# ---------------------------------------------------------------------------


COPY_WORKER = r'''
import json, sys
import numpy as np
import jax, jax.numpy as jnp
import jaxgraph
from jaxgraph.diagnostics import counters, describe_graph, native_module, set_capture_policy

from test_device_launchable import KERNELS, N, _chain  # this file's chain (its folder is on the path)

seed, out_path = int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(seed)
g, x_s, y_s = _chain(KERNELS)
native_module("replay").set_device_launch_nodes(16)  # "large" from 16 kernels, for this test
report, failures = {}, []

def check(what, out, want):
    got = np.asarray(out)
    if not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)
        failures.append(f"{what}: {bad.size} of {N} differ, e.g. got {got[bad[0]]}, want {want[bad[0]]}")

def counted(phase, fn):
    before = counters()
    fn()
    after = counters()
    report[phase] = {k: after[k] - before[k] for k in after if not k.endswith("_ns")}

for policy in ("bind", "whole"):
    previous = set_capture_policy(policy)
    try:
        step = jaxgraph.replayable(g, [x_s], [y_s], bind="copy")
        info = describe_graph(step.graph_id, g.device)
        report[f"{policy}_info"] = [info.device_launchable, info.copy_nodes]
        f = jax.jit(lambda x: step(x))
        mixed = jax.jit(lambda x: step(step(x) * 2.0 - 3.0) + 1.0)  # XLA ops between: a command buffer under "on"
        hosts = [rng.integers(-1000, 1000, N).astype(np.float32) for _ in range(4)]
        arrays = [jnp.asarray(h) for h in hosts]

        def loops():
            x_s.fill_(np.float32(np.nan)); y_s.fill_(np.float32(np.nan))
            held = []
            for i in range(8):  # rotating inputs, results held: new addresses on every call
                held.append(f(arrays[i % 4]))
                check(f"{policy} call {i}", held[-1], hosts[i % 4] + KERNELS)
            x = arrays[0]
            for i in range(6):  # x = f(x): XLA's buffers alternate
                x = f(x)
            check(f"{policy} feedback", x, hosts[0] + 6 * KERNELS)

        def mixed_calls():
            for i in range(6):
                want = (hosts[i % 4] + KERNELS) * np.float32(2) - np.float32(3) + KERNELS + 1
                check(f"{policy} mixed {i}", mixed(arrays[i % 4]), want)

        counted(f"{policy}_loops", loops)
        counted(f"{policy}_mixed", mixed_calls)
    finally:
        set_capture_policy(previous)
report["failures"] = failures
np.save(out_path, np.zeros(1))
print("REPORT " + json.dumps(report))
'''


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["off", "on"])
def test_copied_buffers_of_a_large_graph_are_copied_by_nodes_of_its_executable(tmp_path, rng, mode):
    # bind="copy": both static arrays copied on every call; the graph is device-launchable, so the
    # copies are copy nodes of its executable (no cudaMemcpyAsync on a launch), which read each
    # call's buffers from the graph's address ring. Under XLA's recording (mode "on", the mixed function) they copy on the
    # stream as before, around the graph's nodes or a clone of it without the copy nodes (whole).
    from support.graph_helpers import run_xla_worker

    _, report = run_xla_worker(COPY_WORKER, ADD_ONE, tmp_path, mode, int(rng.integers(2**31)),
                               paths=[os.path.dirname(__file__)])
    print(mode, report)
    assert report["failures"] == [], report["failures"]
    for policy in ("bind", "whole"):
        assert report[f"{policy}_info"] == [True, 2], report
        loops, mixed = report[f"{policy}_loops"], report[f"{policy}_mixed"]
        if mode == "off":  # every replay a launch: in and out by nodes, aimed at each call's buffers
            assert loops["launch"] == loops["handler_calls"] == 14, loops
            assert loops["copy"] == 0 and loops["node_copy"] == 2 * 14, loops
            assert mixed["launch"] == 12 and mixed["copy"] == 0 and mixed["node_copy"] == 24, mixed
        else:  # recorded by XLA: the copies go on its stream, into the recording
            for phase in (loops, mixed):  # (a call before XLA records is a launch: copied by nodes)
                spliced = phase["splice_whole"] + (phase["splice_nodes"] if policy == "bind" else 0)
                assert spliced >= 1 and phase["copy"] >= 2 * spliced, phase
                assert phase["node_copy"] == 2 * phase["launch"], phase


@pytest.mark.gpu
def test_a_buffer_switched_to_copying_is_copied_by_the_copy_nodes_of_its_executable(rng):
    # State updated in place by every kernel (2 x 40 sites), one executable, a new address on every
    # call: rewriting 80 arguments per call costs more than copying, so the buffer switches; the
    # graph being device-launchable, its executable has had copy nodes since registration, and
    # they copy it from then on.
    from jaxgraph import BindingMode

    p = native_module("replay")
    previous = p.set_device_launch_nodes(16)
    try:
        add_one = jaxgraph.Kernel(ADD_ONE, "add_one")
        add_one.handle  # noqa: B018 - load before capture
        s = jaxgraph.empty(N)
        g = jaxgraph.CUDAGraph()
        with jaxgraph.graph(g):
            for _ in range(KERNELS):
                add_one[N // 256, 256](s, s, N)
        step = jaxgraph.replayable(g, [s], [s])
    finally:
        p.set_device_launch_nodes(previous)
    assert [r.mode for r in step.bindings[g.device]] == [BindingMode.BOUND] * 2
    p.set_max_executables(step.graph_id, g.device, 1)
    s.fill_(np.float32(np.nan))
    f, outs = jax.jit(step), []
    for call in range(24):
        x = rng.integers(-1000, 1000, N).astype(np.float32)
        outs.append(f(jnp.asarray(x)))  # held: the next call gets new buffers
        np.testing.assert_array_equal(np.asarray(outs[-1]), x + KERNELS, err_msg=f"call {call}")

    def fresh(call):
        x = rng.integers(-1000, 1000, N).astype(np.float32)
        outs.append(f(jnp.asarray(x)))  # held, as above
        return outs[-1], x + KERNELS

    assert_switched_and_copied_by_nodes(step, g.device, fresh)
