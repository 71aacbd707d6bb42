"""Replays inside jit while XLA's buffers move, under each XLA command-buffer setting.

A jitted function called in a loop (``out = f(x)``) gets a new output buffer
while the previous output is still alive, so XLA's result address alternates
between calls; holding every output gives a new address each call; rotating
inputs moves the operand too. Under command buffers XLA records the replay
into its own CUDA graph once (the handler splices the graph's nodes) and must
then follow those moves. Every result here is checked exactly against numpy
(integer-valued floats), with the graph's static arrays poisoned first, and
the replay counters say which path the calls took, under each capture policy
(which buffers a recording copies): ``jaxgraph.diagnostics.counters`` and
``set_capture_policy``. Each setting runs in its own process (XLA reads XLA_FLAGS
once).
"""

import textwrap

import pytest

from support.graph_helpers import run_xla_worker

pytestmark = pytest.mark.gpu

KERNELS = 64  # in the graph: y = x + 1, then y = y + 1 in place (the output has 2 * KERNELS - 1 sites)

SRC = r"""
extern "C" __global__ void add_one(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
"""

WORKER = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    import jax, jax.numpy as jnp
    import jaxgraph
    from jaxgraph import diagnostics

    src, seed, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    n, kernels = 4096, KERNELS
    add_one = jaxgraph.Kernel(open(src).read(), "add_one")
    x_s, y_s = jaxgraph.zeros(n, np.float32), jaxgraph.zeros(n, np.float32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        add_one[16, 256](y_s, x_s, n)
        for _ in range(kernels - 1):
            add_one[16, 256](y_s, y_s, n)
    step = jaxgraph.replayable(g, [x_s], [y_s])
    rng = np.random.default_rng(seed)
    failures, report = [], {"bindings": [str(b) for b in step.bindings[g.device]]}

    def fresh():
        return rng.integers(-1000, 1000, n).astype(np.float32)

    def check(name, got, want):
        got = np.asarray(got)
        bad = np.flatnonzero(got != want)
        if bad.size:
            i = int(bad[0])
            failures.append(f"{name}: {bad.size} of {n} differ, e.g. [{i}] got {got[i]}, want {want[i]}")

    def poison():  # a replay that skipped the graph, or copied a stale static array, cannot pass
        x_s.fill_(np.nan)
        y_s.fill_(np.nan)
        jaxgraph.synchronize()

    def counted(name, body):
        before = diagnostics.counters()
        body()
        after = diagnostics.counters()
        report[name] = {k: after[k] - before[k] for k in after if k != "handler_ns"}

    # 1. One fixed input, the previous output held: XLA's result alternates between buffers.
    f = jax.jit(lambda x: step(x))
    poison()
    xh = fresh()
    x = jnp.asarray(xh)
    addresses = []

    def alternating(calls, first):
        out = None
        for i in range(calls):
            out = f(x)
            addresses.append(out.unsafe_buffer_pointer())
            check(f"fixed input, call {first + i}", out, xh + kernels)

    counted("alternating_first", lambda: alternating(10, 0))
    counted("alternating_steady", lambda: alternating(30, 10))
    report["alternating_addresses"] = len(set(addresses))

    # 2. Every output held: a new result address on every call.
    held = []
    counted("held", lambda: held.extend(f(x) for _ in range(8)))
    report["held_addresses"] = len({o.unsafe_buffer_pointer() for o in held})
    for i, out in enumerate(held):
        check(f"held output {i}", out, xh + kernels)

    # 3. Rotating over three inputs, the previous output held.
    hosts = [fresh() for _ in range(3)]
    arrays = [jnp.asarray(h) for h in hosts]

    def rotating():
        for i in range(12):
            check(f"rotating call {i}", f(arrays[i % 3]), hosts[i % 3] + kernels)

    counted("rotating", rotating)

    # 4. Three replays between XLA ops in one jit (what JAX's defaults record as a command buffer).
    def stages(x):
        for r in range(3):
            if r:
                x = x * 2.0 - 3.0
            x = step(x)
        return x

    mixed = jax.jit(stages)

    def mixed_calls():
        out = None
        for i in range(12):
            out = mixed(arrays[i % 3])
            want = hosts[i % 3]
            for r in range(3):
                want = (want * np.float32(2) - np.float32(3) if r else want) + np.float32(kernels)
            check(f"mixed call {i}", out, want)

    poison()
    counted("mixed", mixed_calls)

    # 5. The other ways of splicing (capture policies), each on a replayable of its own
    #    (a graph keeps the policy it was first recorded with).
    for policy in ("bind", "copy", "whole", "auto"):
        previous = diagnostics.set_capture_policy(policy)
        try:
            step = jaxgraph.replayable(g, [x_s], [y_s])
            # New function objects: jax reuses the trace of a function it jitted before.
            f, mixed = jax.jit(lambda x: step(x)), jax.jit(lambda x: stages(x))
            poison()
            addresses.clear()
            counted(f"{policy}_alternating", lambda: alternating(8, 0))
            counted(f"{policy}_mixed", mixed_calls)
        finally:
            diagnostics.set_capture_policy(previous)
    report["failures"] = failures
    np.save(out_path, np.zeros(1))
    print("REPORT " + json.dumps(report))
''').replace("KERNELS", str(KERNELS))


@pytest.mark.parametrize("mode", ["off", "on", "defaults"])
def test_replays_follow_xla_buffers_that_move(tmp_path, rng, mode):
    _, report = run_xla_worker(WORKER, SRC, tmp_path, mode, int(rng.integers(2**31)))
    assert report["failures"] == [], report["failures"]
    assert report["bindings"] == ["input 0 bound (1 site)", f"output 0 bound ({2 * KERNELS - 1} sites)"]
    # XLA's result really moved: between two buffers in a loop, a new one per held output.
    assert report["alternating_addresses"] >= 2 and report["held_addresses"] == 8, report
    calls = {"alternating_first": 10, "alternating_steady": 30, "held": 8, "rotating": 12, "mixed": 36}
    if mode == "off":
        # No command buffer: every replay is a launch of an executable bound to XLA's buffers.
        for phase, n in calls.items():
            assert report[phase]["launch"] == report[phase]["handler_calls"] == n, (phase, report[phase])
            assert report[phase]["splice_nodes"] == report[phase]["splice_whole"] == 0
        return
    # Mixed: three replays and XLA ops make a command buffer under both settings. By default (the
    # "bind" capture policy) the graph's nodes go into XLA's graph one by one, bound to XLA's
    # buffers (a buffer the launches before, under JAX's defaults, switched to copying stays
    # copied: bind_policy.h).
    m = report["mixed"]
    assert m["splice_nodes"] >= 3 and m["splice_whole"] == 0, m
    # Each policy: "bind" copies nothing, "copy" both buffers around nodes at the static arrays,
    # "auto" the output only, "whole" splices one child graph with both copied.
    copies_per_splice = {"bind": 0, "copy": 2, "auto": 1, "whole": 2}
    for policy, copies in copies_per_splice.items():
        m = report[f"{policy}_mixed"]
        splices = m["splice_whole"] if policy == "whole" else m["splice_nodes"]
        other = m["splice_nodes"] if policy == "whole" else m["splice_whole"]
        assert splices >= 3 and other == 0 and m["copy"] == copies * splices, (policy, m)
    if mode == "on":
        # A lone replay is recorded too; once recorded, XLA follows its moving buffers without
        # calling the handler on every call (jax 0.11.2): the steady calls cost no handler work.
        first = report["alternating_first"]
        assert first["splice_nodes"] >= 1 and first["splice_whole"] == 0, first
        assert report["alternating_steady"]["handler_calls"] <= 3, report["alternating_steady"]
        assert report["whole_alternating"]["splice_whole"] >= 1, report["whole_alternating"]
