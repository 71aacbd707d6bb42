"""Graphs with conditional nodes replayed inside jax.jit (GPU).

CUDA can neither clone such a graph nor put it in another graph, so the
replayable launches the template's own executable on XLA's stream through
``jaxgraph_replay_uncaptured``, which XLA keeps out of its command buffers.
The graphs (IF/ELSE, WHILE, a WHILE holding an IF, SWITCH) are built by hand
in ``support/conditional_helpers.py``; every call draws fresh inputs, so kernels
inside the bodies are rebound between calls, and every expected result comes
from numpy. Static arrays are poisoned first: a bound buffer is never touched.

Tests internals (listed in tests/README.md): ``internals.spec_replayable``; a conditional graph
forced onto the command-buffer target. Calls per replay path and whether the CUDAGraph's own
executable is shared come from ``jaxgraph.diagnostics`` (``counters``, ``describe_graph``).
"""

import json
import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from support import conditional_helpers as cs  # noqa: E402
import jaxgraph  # noqa: E402
from jaxgraph import BindingMode, ReplayPath  # noqa: E402
from jaxgraph.diagnostics import counters, describe_graph  # noqa: E402
from support.graph_helpers import launched, path_calls  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def k():
    return cs.load_kernels()


def check_jitted(step, name, ref, rng, trips=4):
    """The jitted step against numpy on ``trips`` sets of fresh inputs for graph ``name``."""
    f = jax.jit(step)
    for trip in range(trips):
        values = cs.random_inputs(name, rng, trip)
        np.testing.assert_allclose(np.asarray(f(*values)), ref(*values), rtol=1e-6, atol=1e-5)


def poison(arrays):
    for a in arrays:
        a.fill_(np.float32(np.nan) if a.dtype == np.float32 else -7)


@pytest.mark.parametrize("name", list(cs.GRAPHS))
def test_conditional_graph_binds_its_bodies_and_replays_in_jit(k, rng, name):
    g, cond, inputs, outputs, ref = cs.GRAPHS[name](k)
    step = cs.replayable(g, inputs, outputs, cond)
    assert step.replay_paths == (ReplayPath.UNCAPTURED_LAUNCH,)
    assert "paths=uncaptured_launch" in repr(step)
    rows = step.bindings[g.device]
    info = describe_graph(step.graph_id, g.device)
    print(name, repr(step), info)
    # x is read inside the bodies, the control values by set_condition at the top: all found.
    assert rows[0].sites >= 1 and rows[-1].sites >= 1
    # Bound, unless the entry launches the CUDAGraph's own executable (CUDA made no second
    # one): that one is never rebound, so every buffer is copied.
    shared = info.borrowed_exec
    assert all(r.mode is (BindingMode.COPIED if shared else BindingMode.BOUND) for r in rows), rows
    poison(inputs + outputs)
    f = jax.jit(lambda *a: step(*a) + 0.0)
    before = counters()
    calls = 5
    for trip in range(calls):
        values = cs.random_inputs(name, rng, trip)
        for fn in (f, step):  # jitted, and eagerly
            got = np.asarray(fn(*[jnp.asarray(v) for v in values]))
            np.testing.assert_allclose(got, ref(*values), rtol=1e-6, atol=1e-5, err_msg=f"{name} trip {trip}")
    after = counters()
    assert path_calls(before, after) == dict(launched(0), uncaptured_launch=2 * calls), (before, after)
    if shared:
        assert after["copy"] > before["copy"] and after["rebind"] == before["rebind"], (before, after)
        return
    assert after["copy"] == before["copy"], "a bound buffer was copied"
    assert after["rebind"] > before["rebind"], "new addresses must rebind kernels inside the bodies"
    assert np.isnan(outputs[0].numpy()).all(), "the static output was written: it is bound"


@pytest.mark.parametrize("name", list(cs.USER_GRAPHS))
def test_the_users_path_capture_api_then_replayable(k, rng, name):
    build, inputs_of = cs.USER_GRAPHS[name]
    g, _, inputs, outputs, ref = build(k)
    step = jaxgraph.replayable(g, inputs, outputs)
    info = describe_graph(step.graph_id, g.device)
    print(name, repr(step), info)
    assert step.replay_paths == (ReplayPath.UNCAPTURED_LAUNCH,)
    if info.borrowed_exec:  # the CUDAGraph's own executable: never rebound, so every buffer is copied
        rows = step.bindings[g.device]
        assert all(r.mode is BindingMode.COPIED and "one executable" in r.reason for r in rows), rows
        if g._keep_graph:
            with pytest.raises(RuntimeError, match="launches this graph's executable itself"):
                g.instantiate()
    before = counters()
    f = jax.jit(lambda *a: step(*a) * 1.0)
    for trip in range(5):
        values = cs.random_inputs(inputs_of, rng, trip)
        for fn in (f, step):
            got = np.asarray(fn(*[jnp.asarray(v) for v in values]))
            np.testing.assert_allclose(got, ref(*values), rtol=1e-6, atol=1e-5, err_msg=f"{name} trip {trip}")
    assert path_calls(before, counters()) == dict(launched(0), uncaptured_launch=10)


def test_the_cuda_graph_still_replays_its_static_arrays_after_jitted_calls(k, rng):
    g, cond, inputs, outputs, ref = cs.if_else_graph(k)
    step = cs.replayable(g, inputs, outputs, cond)
    check_jitted(step, "if_else", ref, rng, trips=3)
    for trip in range(2):  # the template and any shared executable point at the static arrays again
        values = cs.random_inputs("if_else", rng, trip)
        for a, v in zip(inputs, values):
            a.copy_(v)
        outputs[0].fill_(np.float32(np.nan))
        g.replay()
        np.testing.assert_allclose(outputs[0].numpy(), ref(*values), rtol=1e-6, atol=1e-6)


def test_without_the_bodies_every_buffer_is_copied_or_the_driver_lists_them(k, rng):
    g, cond, inputs, outputs, ref = cs.while_graph(k)
    step = cs.replayable(g, inputs, outputs, cond, bodies=False)
    rows = step.bindings[g.device]
    print("no bodies given:", rows)
    # Where the driver cannot list a node's bodies, nothing is bound; where it can, x is.
    if rows[0].mode is BindingMode.COPIED:
        assert "conditional nodes whose bodies jaxgraph cannot read" in rows[0].reason
    check_jitted(step, "while", ref, rng)


def test_bind_copy_replays_a_conditional_graph_through_the_static_arrays(k, rng):
    g, cond, inputs, outputs, ref = cs.nested_graph(k)
    step = cs.replayable(g, inputs, outputs, cond, bind="copy")
    assert all(r.mode is BindingMode.COPIED for r in step.bindings[g.device])
    check_jitted(step, "nested", ref, rng)


def test_a_reset_retires_the_conditional_replayable_before_the_template_goes(k, rng):
    g, cond, inputs, outputs, ref = cs.if_else_graph(k)
    step = cs.replayable(g, inputs, outputs, cond)
    f = jax.jit(step)
    values = cs.random_inputs("if_else", rng, 1)
    np.testing.assert_allclose(np.asarray(f(*values)), ref(*values), rtol=1e-6, atol=1e-6)
    g.reset()
    assert not step.alive and step.replay_paths == ()
    with pytest.raises(RuntimeError, match="was reset or destroyed"):
        step(*values)
    with pytest.raises(Exception, match="was reset or destroyed"):
        jax.block_until_ready(f(*values))


def test_the_replayable_keeps_a_conditional_graph_alive(k, rng):
    def build():
        g, cond, inputs, outputs, ref = cs.if_else_graph(k)
        return cs.replayable(g, inputs, outputs, cond), ref  # the graph goes out of scope

    step, ref = build()
    import gc

    gc.collect()
    assert step.alive
    values = cs.random_inputs("if_else", rng, 0)
    np.testing.assert_allclose(np.asarray(jax.jit(step)(*values)), ref(*values), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------
# XLA's command buffers: off, on, JAX defaults (one process each)
# ----------------------------------------------------------------------------

WORKER = r'''
import json, sys
import numpy as np
import jax, jax.numpy as jnp
from support import conditional_helpers as cs
import jaxgraph
from jaxgraph.diagnostics import counters
from support.internals import spec_replayable

k = cs.load_kernels()
rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else None)
report = {}


def check(name, replay, ref, inputs_of):
    # XLA ops around the replay, so command buffers have fusions to record.
    f = jax.jit(lambda x, *c: jnp.tanh(replay(x * 2.0, *c)) + x)
    for trip in range(5):
        x, *c = cs.random_inputs(inputs_of, rng, trip)
        got = np.asarray(f(x, *c))
        want = np.tanh(ref(np.float32(2) * x, *c)) + x
        if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            raise SystemExit(f"{name} trip {trip} wrong: got {got[:3]}, want {want[:3]}")
    report[name] = "ok"


for name in ("if_else", "while", "nested"):
    g, cond, inputs, outputs, ref = cs.GRAPHS[name](k)
    step = cs.replayable(g, inputs, outputs, cond)
    check(name, step, ref, name)
nested_step, nested_ref = step, ref  # the last hand-made graph: forced onto the recorded target below
for name, (build, inputs_of) in cs.USER_GRAPHS.items():
    g, _, inputs, outputs, ref = build(k)
    check(name, jaxgraph.replayable(g, inputs, outputs), ref, inputs_of)
report["counters"] = counters()
print("PARTIAL " + json.dumps(report), flush=True)  # seen even if what follows kills the process
# The same graph lowered to the command-buffer target: recorded by XLA when
# its command buffers are on, where the handler must refuse it clearly.
forced = spec_replayable(nested_step.in_shapes, nested_step.out_shapes, nested_step.graph_id)
g_forced = jax.jit(lambda x, *c: jnp.tanh(forced(x * 2.0, *c)) + x)
report["forced"] = "ran"
try:
    for trip in range(6):  # XLA may record its command buffer only after a first run
        x, *c = cs.random_inputs("nested", rng, trip)
        got = np.asarray(g_forced(x, *c))
        if not np.allclose(got, np.tanh(nested_ref(np.float32(2) * x, *c)) + x, atol=1e-5):
            report["forced"] = f"wrong at trip {trip}"
            break
except Exception as exc:
    report["forced"] = str(exc)[:600]
report["forced_counters"] = counters()
print("REPORT " + json.dumps(report))
'''


@pytest.mark.parametrize("mode", list(cs.XLA_MODES))
def test_conditional_replay_under_xla_command_buffer_settings(tmp_path, rng, mode):
    stdout = cs.run_worker(WORKER, mode, tmp_path)
    (line,) = [l for l in stdout.splitlines() if l.startswith("REPORT ")]
    report = json.loads(line[len("REPORT "):])
    print(mode, report)
    assert report["if_else"] == report["while"] == report["nested"] == "ok"
    assert report["user_if"] == report["user_while"] == "ok", report
    # 5 calls of each of the 5 graphs, every one launched outside XLA's command buffers.
    assert path_calls({}, report["counters"]) == dict(launched(0), uncaptured_launch=25), report
    # Forced onto the recorded target: right where XLA launches it, a clear error where it
    # records it into its command buffer (never a crash, never a wrong result).
    forced = report["forced"]
    assert forced == "ran" or ("conditional nodes" in forced and "command buffer" in forced), report
    if mode == "off":
        assert forced == "ran", report


def test_a_shared_executable_is_never_replaced_or_rebound_under_a_replayable(k, rng):
    # keep_graph=True: the user instantiates; CUDA then makes no second executable of a
    # graph with conditional nodes, so the replayable launches the CUDAGraph's own.
    x, pred, y = jaxgraph.zeros(cs.N), jaxgraph.zeros(1, np.int32), jaxgraph.zeros(cs.N)
    g = jaxgraph.CUDAGraph(keep_graph=True)
    with jaxgraph.graph(g):
        k.axpb[cs.GRID, cs.BLOCK](y, x, -1.0, 0.0, cs.N)
        with jaxgraph.if_then(pred):
            k.axpb[cs.GRID, cs.BLOCK](y, x, 2.0, 1.0, cs.N)
    g.instantiate()
    step = jaxgraph.replayable(g, [x, pred], [y])
    info = describe_graph(step.graph_id, g.device)
    print("keep_graph=True:", info, step.bindings[g.device])
    check_jitted(step, "if_else", cs.ref_if_else, rng, trips=3)
    if not info.borrowed_exec:
        pytest.skip("this driver made the replayable an executable of its own: nothing is shared")
    assert all(r.mode is BindingMode.COPIED for r in step.bindings[g.device])
    with pytest.raises(RuntimeError, match="launches this graph's executable itself"):
        g.instantiate()
    values = cs.random_inputs("if_else", rng, 7)  # the CUDAGraph's replays still see its static arrays
    for a, v in zip((x, pred), values):
        a.copy_(v)
    y.fill_(np.float32(np.nan))
    g.replay()
    np.testing.assert_allclose(y.numpy(), cs.ref_if_else(*values), rtol=1e-6, atol=1e-6)
    step.close()
    g.instantiate()  # nobody shares it now
    g.replay()
    np.testing.assert_allclose(y.numpy(), cs.ref_if_else(*values), rtol=1e-6, atol=1e-6)
