"""The replay handler's executables (ffi/replay/exec_cache.h): one replayable, many call sites and address sets.

Which executable a call takes, and what making, rewriting, replacing and refreshing
executables cost, are not in the public API: they come through ``jaxgraph.diagnostics``
(``native_module("replay")``'s ``policy_fresh_pays`` and ``set_max_executables``,
``counters``, ``describe_graph``).

One replayable of a chain of 100 ``add_one`` kernels (its output held by 199
kernel arguments, as in the benchmark harness) is called as a program calls
it: from a jitted loop on a fixed input (XLA's result alternates between
buffers), on rotating inputs, from ten call sites in one jit and between XLA
ops. Every result is checked exactly against numpy (integer-valued floats on
fresh random inputs), and every result buffer is poisoned (NaN) once checked,
so a replay that wrote elsewhere cannot pass on a stale value. Once each
address set has its executable, a second round of the same calls makes,
rewrites, replaces and copies nothing. With the cache held small, calls
replace executables (afresh or rewritten in place) and stay exact.
"""

import collections
import os
import textwrap

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgraph  # noqa: E402
from jaxgraph import BindingMode  # noqa: E402
from support.graph_helpers import launched, path_calls, run_xla_worker  # noqa: E402
from jaxgraph.diagnostics import counters, describe_graph, native_module  # noqa: E402
from support.kernel_sources import ADD_ONE, AXPB  # noqa: E402

N = 4096
B = N // 256
KERNELS = 100  # the chain: y = x + 1, then y = y + 1 in place (the output has 2 * KERNELS - 1 sites)
SRC = ADD_ONE + AXPB


# ---------------------------------------------------------------------------
# The decisions, on the CPU
# ---------------------------------------------------------------------------


def test_a_fresh_executable_pays_against_the_lasting_slowdown_of_a_rewrite():
    p = native_module("replay")
    # Replacing an executable: 100 kernels rewritten in place (199 sites) run ~0.23 us slower per launch.
    assert p.policy_fresh_pays(200_000.0, 200_000.0, 100, 1.0)        # no dearer than the rewrite alone
    assert not p.policy_fresh_pays(300_000.0, 50_000.0, 100, 1.0)     # replaced again after one launch
    assert p.policy_fresh_pays(300_000.0, 50_000.0, 100, 20.0)        # executables here live 20 launches
    # Refreshing one rewritten in place (nothing to rewrite now): rent the slowdown until it pays.
    assert not p.policy_fresh_pays(100_000.0, 0.0, 1, 100.0)          # one slow kernel, 100 launches: 23 us
    assert p.policy_fresh_pays(100_000.0, 0.0, 1, 1000.0)             # 1000 launches: 233 us
    assert not p.policy_fresh_pays(1000.0, 0.0, 0, 1e9)               # nothing updated: nothing to gain


def test_a_graph_keeps_many_small_executables_and_one_huge_one():
    p = native_module("replay")
    assert p.policy_exec_budget(2 << 20, 100) == 64           # 2 MB each: 64 fill the 128 MB budget
    assert p.policy_exec_budget(230 << 10, 100) == 256        # 100 kernels as measured: the most the cache keeps
    assert p.policy_exec_budget(8 << 20, 4000) == 16
    assert p.policy_exec_budget(1 << 20, 4096) == 1           # thousands of kernels: one, whatever it weighs
    assert p.policy_exec_budget(23 << 20, 10_000) == 1        # 10k kernels (22 MB each, as measured)
    assert p.policy_exec_budget(220 << 20, 100_000) == 1      # 100k kernels: one
    # A measurement below 2 KB a kernel (the driver reused memory freed executables left) is not believed.
    assert p.policy_exec_budget(0, 2000) == 32 and p.policy_exec_budget(0, 100) == 256


def test_limiting_the_executables_of_an_unknown_graph_says_so():
    with pytest.raises(ValueError, match="is not live on device"):
        native_module("replay").set_max_executables(10**9, 0, 2)


# ---------------------------------------------------------------------------
# The handler, on the GPU
# ---------------------------------------------------------------------------

WORKER = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    import jax, jax.numpy as jnp
    import jaxgraph
    from jaxgraph import diagnostics

    src, seed, out_path = open(sys.argv[1]).read(), int(sys.argv[2]), sys.argv[3]
    n, kernels = 4096, KERNELS
    add_one, axpb = jaxgraph.Kernel(src, "add_one"), jaxgraph.Kernel(src, "axpb")
    add_one.handle, axpb.handle
    x_s, y_s = jaxgraph.empty(n), jaxgraph.empty(n)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        add_one[16, 256](y_s, x_s, n)
        for _ in range(kernels - 1):
            add_one[16, 256](y_s, y_s, n)
    step = jaxgraph.replayable(g, [x_s], [y_s])
    # The cap, whatever registration measured: one executable's device memory is read from the
    # free memory around making it, which another process on the GPU can disturb.
    measured_max = diagnostics.describe_graph(step.graph_id, g.device).max_executables
    diagnostics.native_module("replay").set_max_executables(step.graph_id, g.device, 64)
    x_s.fill_(np.nan)
    y_s.fill_(np.nan)
    rng = np.random.default_rng(seed)
    hosts = [rng.integers(-1000, 1000, n).astype(np.float32) for _ in range(10)]
    xs = [jnp.asarray(h) for h in hosts]
    failures, report = [], {"bindings": [str(b) for b in step.bindings[g.device]], "rounds": []}

    def check(name, out, want):
        got = np.asarray(out)
        bad = np.flatnonzero(got != want)
        if bad.size:
            failures.append(f"{name}: {bad.size} of {n} differ, e.g. [{bad[0]}] got {got[bad[0]]}, want {want[bad[0]]}")
        axpb[16, 256](out, out, 0.0, np.nan, n)  # poisoned: the next result in this buffer must be written
        jaxgraph.synchronize()

    def mixed_ref(h):
        for r in range(3):
            h = (h * np.float32(2) - np.float32(3) if r else h) + np.float32(kernels)
        return h

    one = jax.jit(step)
    ten = jax.jit(lambda *a: tuple(step(x) for x in a))
    mixed = jax.jit(lambda x: step(step(step(x) * 2.0 - 3.0) * 2.0 - 3.0))

    def calls(r):
        out = None
        for i in range(6):  # a jitted loop on a fixed input: XLA's result alternates between buffers
            out = one(xs[0])
            check(f"round {r} loop {i}", out, hosts[0] + kernels)
        del out
        for i in range(1, 9):  # rotating inputs
            check(f"round {r} rotating {i}", one(xs[i]), hosts[i] + kernels)
        for i, out in enumerate(ten(*xs)):  # ten call sites in one jit
            check(f"round {r} site {i}", out, hosts[i] + kernels)
        for i in range(3):  # three replays between XLA ops
            check(f"round {r} mixed {i}", mixed(xs[i]), mixed_ref(hosts[i]))

    for r in range(4):
        before = diagnostics.counters()
        calls(r)
        after = diagnostics.counters()
        report["rounds"].append({k: after[k] - before[k] for k in after if not k.endswith("_ns")})
    info = diagnostics.describe_graph(step.graph_id, g.device)
    report["executables"], report["max_executables"] = info.executables, info.max_executables
    report["measured_max_executables"], report["exec_device_bytes"] = measured_max, info.exec_device_bytes
    report["instantiate_ns"], report["rewrite_ns_per_site"] = info.instantiate_ns, info.rewrite_ns_per_site
    report["bindings_after"] = [str(b) for b in step.bindings[g.device]]
    report["failures"] = failures
    np.save(out_path, np.zeros(1))
    print("REPORT " + json.dumps(report))
''').replace("KERNELS", str(KERNELS))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["off", "defaults"])
def test_one_replayable_at_many_call_sites_settles_on_its_executables(tmp_path, rng, mode):
    _, report = run_xla_worker(WORKER, SRC, tmp_path, mode, int(rng.integers(2**31)))
    print(mode, {k: v for k, v in report.items() if k != "rounds"})
    for r, change in enumerate(report["rounds"]):
        print(mode, "round", r, change)
    assert report["failures"] == [], report["failures"]
    bound = ["input 0 bound (1 site)", f"output 0 bound ({2 * KERNELS - 1} sites)"]
    assert report["bindings"] == bound and report["bindings_after"] == bound, report
    last = report["rounds"][-1]
    # Every address set has its executable: nothing made, rewritten, replaced or copied.
    for counter in ("instantiate", "rebind", "evict", "refresh", "copy", "to_copy"):
        assert last[counter] == 0, (counter, report["rounds"])
    assert report["instantiate_ns"] > 0, report
    if mode == "off":
        # 6 + 8 + 10 + 3 x 3 replays, each a launch; more address sets than the old cache of four.
        assert last["launch"] == last["handler_calls"] == 33, last
        assert 4 < report["executables"] <= report["max_executables"], report


@pytest.fixture(scope="module")
def chain():
    kernels = {name: jaxgraph.Kernel(SRC, name) for name in ("add_one", "axpb")}
    for kernel in kernels.values():
        kernel.handle  # noqa: B018 - load before capture
    x_s, y_s = jaxgraph.empty(N), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        kernels["add_one"][B, 256](y_s, x_s, N)
        for _ in range(KERNELS - 1):
            kernels["add_one"][B, 256](y_s, y_s, N)
    return g, x_s, y_s, kernels["axpb"]


@pytest.mark.gpu
def test_a_full_cache_replaces_executables_and_stays_exact(chain, rng):
    g, x_s, y_s, axpb = chain
    step = jaxgraph.replayable(g, [x_s], [y_s])
    x_s.fill_(np.float32(np.nan))
    y_s.fill_(np.float32(np.nan))
    measured = describe_graph(step.graph_id, g.device).max_executables
    assert native_module("replay").set_max_executables(step.graph_id, g.device, 3) == measured  # the previous limit
    f = jax.jit(step)
    hosts = [rng.integers(-1000, 1000, N).astype(np.float32) for _ in range(6)]
    xs = [jnp.asarray(h) for h in hosts]
    held = collections.deque(maxlen=4)  # the last results alive: XLA's result address moves too

    def call(i, name):
        out = f(xs[i])
        np.testing.assert_array_equal(np.asarray(out), hosts[i] + KERNELS, err_msg=name)
        axpb[B, 256](out, out, 0.0, np.float32(np.nan), N)  # poisoned once checked
        jaxgraph.synchronize()
        held.append(out)

    before = counters()
    for c in range(36):  # six inputs and moving results through three executables: replacements
        call(c % 6, f"thrash call {c}")
    thrash = {key: value - before[key] for key, value in counters().items()}
    print("thrash", thrash, describe_graph(step.graph_id, g.device))
    assert path_calls({}, thrash) == launched(36), thrash
    assert thrash["evict"] > 0 and thrash["instantiate"] + thrash["rebind"] >= thrash["evict"], thrash
    held = collections.deque(maxlen=1)
    for c in range(40):  # settles on two inputs, the previous result alive: two address sets (or four)
        call(c % 2, f"settling call {c}")
    settled = counters()
    for c in range(8):
        call(c % 2, f"settled call {c}")
    change = {key: value - settled[key] for key, value in counters().items()}
    print("settled", change, step.bindings[g.device])
    info = describe_graph(step.graph_id, g.device)
    assert info.executables <= 3 and info.max_executables == 3, info
    copied = [row for row in step.bindings[g.device] if row.mode is BindingMode.COPIED_BY_COST]
    assert change["rebind"] == 0 and change["copy"] == 8 * len(copied), (change, copied)
    assert path_calls({}, change) == launched(8), change
