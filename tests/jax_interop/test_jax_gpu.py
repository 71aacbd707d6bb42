"""JAX interop on the GPU: graph replay inside jit, checked against numpy.

Every test draws fresh random inputs. Command buffers on and off are compared
in subprocesses (XLA_FLAGS must be set before JAX starts), which also prove
that the replay is spliced into XLA's own CUDA graph when it records one.
``Kernel.jax_call`` is in test_jax_kernel_call.py.

Calls per replay path in each XLA setting, and graphs leaving the native tables, are read
through ``jaxgraph.diagnostics`` (``counters``, ``native_module("replay")``).
"""

import gc
import os
import textwrap

import numpy as np
import pytest

# Leave device memory to jaxgraph's allocations too (set before JAX's backend starts).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgraph  # noqa: E402
from support.graph_helpers import JAX_SRC, jax_kernels, launched, path_calls, run_xla_worker  # noqa: E402

pytestmark = pytest.mark.gpu

N = 4096


@pytest.fixture(scope="module")
def kernels():
    return jax_kernels()


def capture_chain(kernels, a=2.0, b=0.0, launches=100, n=N):
    """Capture ``launches`` kernels on static arrays: y = a x + b, then y += 1 (launches - 1) times."""
    x_s, y_s = jaxgraph.zeros(n, np.float32), jaxgraph.zeros(n, np.float32)
    blocks = (n + 255) // 256
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        kernels["axpb"][blocks, 256](y_s, x_s, a, b, n)
        for _ in range(launches - 1):
            kernels["inc"][blocks, 256](y_s, n)
    return g, x_s, y_s


def chain_ref(x, a=2.0, b=0.0, launches=100):
    y = np.float32(a) * x.astype(np.float32) + np.float32(b)
    for _ in range(launches - 1):
        y = y + np.float32(1)
    return y


# ---------------------------------------------------------------------------
# Graph replay in jit (via="ffi")
# ---------------------------------------------------------------------------


def test_replay_in_jit_matches_numpy_with_fresh_inputs_each_call(kernels, rng):
    g, x_s, y_s = capture_chain(kernels)
    step = jaxgraph.replayable(g, inputs=[x_s], outputs=[y_s])
    f = jax.jit(step)
    for _ in range(5):  # new input buffers every call
        x = rng.standard_normal(N).astype(np.float32)
        y_s.fill_(np.nan)  # poison the static output: the replay must rewrite it
        jaxgraph.synchronize()
        np.testing.assert_allclose(np.asarray(f(jnp.asarray(x))), chain_ref(x), rtol=1e-6, atol=1e-5)
    x = rng.standard_normal(N).astype(np.float32)
    np.testing.assert_allclose(np.asarray(step(x)), chain_ref(x), rtol=1e-6, atol=1e-5)  # eager


def test_replay_composed_with_xla_ops_before_and_after(kernels, rng):
    g, x_s, y_s = capture_chain(kernels, a=0.5, b=-3.0)
    step = jaxgraph.replayable(g, [x_s], [y_s])

    @jax.jit
    def f(x, w):
        h = step(x * w + 1.0)          # XLA fusion -> replay
        return jnp.tanh(h) * w, h.sum()  # replay -> XLA fusions

    for _ in range(3):
        x, w = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
        h = chain_ref(x * w + 1, a=0.5, b=-3.0)
        out, total = f(x, w)
        np.testing.assert_allclose(np.asarray(out), np.tanh(h) * w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(float(total), h.sum(dtype=np.float64), rtol=1e-4)


def test_1000_replays_in_fori_loop_and_scan(kernels, rng):
    g, x_s, y_s = capture_chain(kernels, a=1.0, b=1.0)  # y = x + 100, exact for these integers
    step = jaxgraph.replayable(g, [x_s], [y_s])
    x = rng.integers(-1000, 1000, N).astype(np.float32)
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, 1000, lambda i, v: step(v), x))
    out = loop(x)
    np.testing.assert_array_equal(np.asarray(jax.block_until_ready(out)), x + 100_000)

    def body(v, _):
        v = step(v)
        return v, v[0]

    last, firsts = jax.jit(lambda x: jax.lax.scan(body, x, length=50))(x)
    np.testing.assert_array_equal(np.asarray(last), x + 5_000)
    np.testing.assert_array_equal(np.asarray(firsts), x[0] + 100 * np.arange(1, 51, dtype=np.float32))


def test_replay_with_two_inputs_and_two_outputs(kernels, rng):
    n = 3000
    a_s, b_s = jaxgraph.zeros(n, np.float32), jaxgraph.zeros(n, np.float32)
    s_s, d_s = jaxgraph.zeros(n, np.float32), jaxgraph.zeros(n, np.float32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        kernels["sum_diff"][(n + 255) // 256, 256](s_s, d_s, a_s, b_s, n)
    step = jaxgraph.replayable(g, [a_s, b_s], [s_s, d_s])
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    s, d = jax.jit(lambda a, b: step(b, a))(a, b)  # argument order is the static inputs' order
    np.testing.assert_allclose(np.asarray(s), b + a, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(d), b - a, rtol=1e-6)


def test_replay_survives_retracing_and_block_until_ready(kernels, rng):
    g, x_s, y_s = capture_chain(kernels, launches=10)
    step = jaxgraph.replayable(g, [x_s], [y_s])
    f = jax.jit(lambda x, k: step(x) * k, static_argnums=1)
    x = rng.standard_normal(N).astype(np.float32)
    for k in (1.0, 2.0, 3.0):  # each k is a new trace of the same replayable
        out = jax.block_until_ready(f(x, k))
        np.testing.assert_allclose(np.asarray(out), chain_ref(x, launches=10) * np.float32(k), rtol=1e-6, atol=1e-5)


def test_replay_under_vmap_runs_once_per_element(kernels, rng):
    g, x_s, y_s = capture_chain(kernels, launches=5)
    step = jaxgraph.replayable(g, [x_s], [y_s])
    xs = rng.standard_normal((4, N)).astype(np.float32)
    out = jax.jit(jax.vmap(step))(xs)
    np.testing.assert_allclose(np.asarray(out), np.stack([chain_ref(x, launches=5) for x in xs]),
                               rtol=1e-6, atol=1e-5)


def test_replay_grad_through_a_captured_backward_graph(kernels, rng):
    n = 2048
    blocks = (n + 255) // 256
    x_s, y_s = jaxgraph.zeros(n, np.float32), jaxgraph.zeros(n, np.float32)
    gf = jaxgraph.CUDAGraph()
    with jaxgraph.graph(gf):
        kernels["square"][blocks, 256](y_s, x_s, n)
    bx, by, bg, bdx = (jaxgraph.zeros(n, np.float32) for _ in range(4))
    gb = jaxgraph.CUDAGraph()
    with jaxgraph.graph(gb):
        kernels["square_bwd"][blocks, 256](bdx, bx, by, bg, n)
    backward = jaxgraph.replayable(gb, [bx, by, bg], [bdx])
    square = jaxgraph.replayable(gf, [x_s], [y_s], backward=backward)

    x, w = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    loss = lambda x: jnp.sum(jnp.sin(square(x)) * w)
    value, grad = jax.jit(jax.value_and_grad(loss))(x)
    np.testing.assert_allclose(float(value), np.sum(np.sin(x * x) * w, dtype=np.float64), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(grad), 2 * x * np.cos(x * x) * w, rtol=1e-4, atol=1e-5)


def test_reset_graph_is_a_clear_error_never_a_stale_launch(kernels, rng):
    from jaxgraph.diagnostics import native_module

    replay = native_module("replay")
    g, x_s, y_s = capture_chain(kernels, launches=3)
    gc.collect()
    step = jaxgraph.replayable(g, [x_s], [y_s])
    live = replay.live_graphs()
    f = jax.jit(step)
    x = rng.standard_normal(N).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), chain_ref(x, launches=3), rtol=1e-6, atol=1e-5)
    g.reset()
    assert not step.alive and replay.live_graphs() == live - 1
    with pytest.raises(RuntimeError, match="was reset or destroyed"):
        jax.jit(lambda x: step(x) + 1)(x)  # a new trace refuses at once
    # The compiled function reaches the handler, which refuses (command buffers
    # are off for a single-op function under default flags; see the subprocess test).
    with pytest.raises(Exception, match="jaxgraph_replay: graph .* was reset or destroyed"):
        jax.block_until_ready(f(jnp.asarray(rng.standard_normal(N).astype(np.float32))))


def test_collected_replayable_unregisters_its_graph(kernels):
    from jaxgraph.diagnostics import native_module

    replay = native_module("replay")
    g, x_s, y_s = capture_chain(kernels, launches=2)
    gc.collect()  # let replayables of earlier tests go first
    live = replay.live_graphs()
    step = jaxgraph.replayable(g, [x_s], [y_s])
    assert replay.live_graphs() == live + 1 and step.devices == (g.device,)
    del step  # no reference cycle: gone at once, no gc needed
    assert replay.live_graphs() == live


def test_graph_on_another_device_is_a_clear_error(kernels, rng):
    if len(jax.devices("gpu")) < 2 or jaxgraph.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    g, x_s, y_s = capture_chain(kernels, launches=2)  # on device 0
    step = jaxgraph.replayable(g, [x_s], [y_s])
    x = jax.device_put(rng.standard_normal(N).astype(np.float32), jax.devices("gpu")[1])
    with pytest.raises(Exception, match="was not captured for device 1"):
        jax.block_until_ready(jax.jit(step)(x))
    # Registering a capture made on device 1 makes the same function work there.
    jaxgraph.set_device(1)
    try:
        g1, x1, y1 = capture_chain(kernels, launches=2)
    finally:
        jaxgraph.set_device(0)
    step.add_device(g1, [x1], [y1])
    np.testing.assert_allclose(np.asarray(jax.jit(step)(x)), chain_ref(np.asarray(x), launches=2), rtol=1e-6)


# ---------------------------------------------------------------------------
# XLA command buffers on and off, in fresh processes
# ---------------------------------------------------------------------------

WORKER = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    import jax, jax.numpy as jnp
    import jaxgraph
    from jaxgraph.diagnostics import counters

    src, seed, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    n = 4096
    axpb, inc, saxpy = (jaxgraph.Kernel(open(src).read(), k) for k in ("axpb", "inc", "saxpy"))
    x_s, y_s = jaxgraph.zeros(n, np.float32), jaxgraph.zeros(n, np.float32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        axpb[16, 256](y_s, x_s, 2.0, 0.0, n)
        for _ in range(99):
            inc[16, 256](y_s, n)
    step = jaxgraph.replayable(g, [x_s], [y_s])

    @jax.jit
    def f(x, z):
        h = step(x * 0.5 + 1.0)                                   # fusion -> replay
        h = saxpy.jax_call(h, z, 3.0, n, inout=("y",))            # -> kernel call
        return jnp.tanh(h) - 1.0                                  # -> fusion

    rng = np.random.default_rng(seed)
    results = []
    seen = [counters()]  # the counters after each phase: f, direct, copied
    for _ in range(4):  # fresh input buffers each call
        x, z = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        results.append(np.asarray(f(jnp.asarray(x), jnp.asarray(z))))
    # The replay bound straight to the function's parameter, rotating over inputs:
    # XLA re-records its command buffer with each new address.
    seen.append(counters())
    direct = jax.jit(step)
    inputs = [jnp.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(3)]
    for i in range(6):
        got = np.asarray(direct(inputs[i % 3]))
        want = 2 * np.asarray(inputs[i % 3]) + 99
        if not np.allclose(got, want, rtol=1e-5, atol=1e-4):
            raise SystemExit(f"direct replay {i} wrong: got {got[:3]}, want {want[:3]}")
    # bind="copy": no kernel argument is read, so the graph goes in whole (a child
    # graph) with every buffer copied; it must agree too.
    seen.append(counters())
    copied = jax.jit(jaxgraph.replayable(g, [x_s], [y_s], bind="copy"))
    for i in range(6):
        got = np.asarray(copied(inputs[i % 3]))
        if not np.allclose(got, 2 * np.asarray(inputs[i % 3]) + 99, rtol=1e-5, atol=1e-4):
            raise SystemExit(f"bind='copy' replay {i} wrong: got {got[:3]}")
    seen.append(counters())
    report = {"phases": dict(zip(("f", "direct", "copied"), ({p: b[p] - a[p] for p in b} for a, b in zip(seen, seen[1:]))))}
    g.reset()
    try:
        jax.block_until_ready(f(jnp.asarray(x + 1), jnp.asarray(z)))
        report["after_reset"] = "ran"
    except Exception as exc:
        report["after_reset"] = str(exc)
    np.save(out_path, np.stack(results))
    print("REPORT " + json.dumps(report))
''')

def run_worker(tmp_path, mode, seed):
    return run_xla_worker(WORKER, JAX_SRC, tmp_path, mode, seed)


def test_command_buffers_on_and_off_agree_and_the_replay_is_spliced(tmp_path, rng):
    seed = int(rng.integers(2**31))
    off, off_report = run_worker(tmp_path, "off", seed)
    on, on_report = run_worker(tmp_path, "on", seed)

    data = np.random.default_rng(seed)
    for got in (off, on):
        for i in range(4):
            x, z = data.standard_normal(N).astype(np.float32), data.standard_normal(N).astype(np.float32)
            h = chain_ref(x * np.float32(0.5) + np.float32(1))
            np.testing.assert_allclose(got[i], np.tanh(np.float32(3) * z + h) - 1, rtol=1e-5, atol=1e-5)
        data = np.random.default_rng(seed)
    np.testing.assert_array_equal(on, off)

    # Off: every call (4 of f, 6 direct, 6 copied) launches the graph on XLA's stream; nothing is spliced.
    off_phases = {name: path_calls({}, change) for name, change in off_report["phases"].items()}
    assert off_phases == {"f": launched(4), "direct": launched(6), "copied": launched(6)}, off_report
    assert off_report["phases"]["copied"]["copy"] > 0 and off_report["phases"]["f"]["copy"] == 0, off_report
    assert "was reset or destroyed" in off_report["after_reset"]
    # On: XLA recorded the replay into its command buffer, bound node by node; bind="copy" reads no
    # kernel argument, so that graph goes in whole, as one child graph.
    on = {name: path_calls({}, change) for name, change in on_report["phases"].items()}
    for name, path in (("f", "splice_nodes"), ("direct", "splice_nodes"), ("copied", "splice_whole")):
        other = "splice_whole" if path == "splice_nodes" else "splice_nodes"
        assert on[name][path] > 0 and on[name][other] == on[name]["uncaptured_launch"] == 0, (name, on_report)
