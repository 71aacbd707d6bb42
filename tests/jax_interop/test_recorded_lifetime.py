"""What compiled functions (and XLA's recordings of them) still use after their Kernel or Replayable goes.

A command buffer XLA recorded launches a ``jax_call``'s kernel and a replay's
nodes without calling jaxgraph again (until its buffers move), so:

- a Kernel entered into the launch table keeps its code loaded until the
  process exits: ``f = jax.jit(lambda x: k.jax_call(...))`` keeps working after
  ``k`` is rebound and collected;
- a closed (or collected) Replayable lets go of its graphs, static arrays,
  pools and kernels, so their memory is freed, after the replays already queued
  on XLA's stream; a later call raises the clear "reset or destroyed" error.
  Where a capture recorded the graph, what the recording uses is kept until exit
  instead: it never touches freed memory or unloaded code.

On the CPU: the decisions, with stand-ins for what is kept. On the GPU (each XLA
setting in a fresh process): the real thing, with memory allocated after the
collection checked untouched.

Tests internals (listed in tests/README.md): ``Replayable._keep`` and ``_state`` (``ReplayState.uses``),
``_replayable._KEPT_FOR_RECORDINGS``, ``_kernel_call._load_kernel``, ``_kept_for_xla``,
``internals.spec_replayable``; what is kept for XLA and what is let go.
"""

import gc
import textwrap
import types
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from support.graph_helpers import JAX_SRC, run_xla_worker
from support.internals import spec_replayable
from jaxgraph.diagnostics import native_module as native
from jaxgraph._jax_interop import kernel_call as _kernel_call, replayable as _replayable

F32 = jax.ShapeDtypeStruct((16,), jnp.float32)


class StandIn:
    """Something a replayable or the launch table holds (a static array, a pool, a library)."""


def holding(stand_in):
    """A replayable of no graph that holds ``stand_in`` as it holds a graph's parts."""
    r = spec_replayable((F32,), (F32,), 0)
    r._keep.append((stand_in, (), (), None, ()))
    return r


# ---------------------------------------------------------------------------
# CPU: what is let go and what is kept
# ---------------------------------------------------------------------------


def test_a_closed_replayable_lets_go_of_what_it_held_and_refuses_calls():
    thing = StandIn()
    ref = weakref.ref(thing)
    r = holding(thing)
    del thing
    r.close()
    gc.collect()
    assert ref() is None and r._keep == []  # the caller still holds r: its memory goes all the same
    assert not r.alive
    with pytest.raises(RuntimeError, match="this replayable was closed; build a new one"):
        r(jnp.zeros(16, jnp.float32))
    r.close()  # idempotent


def test_collecting_a_replayable_lets_go_as_close_does():
    thing = StandIn()
    ref = weakref.ref(thing)
    r = holding(thing)
    del thing, r
    gc.collect()
    assert ref() is None


def test_closing_a_callback_replayable_lets_its_host_replay_go_too():
    # via="callback": jitted functions hold the host replay (their pure_callback), so close() makes
    # it drop the graph and the static arrays; a call that reaches it afterwards raises.
    closed = []
    host = types.SimpleNamespace(close=lambda: closed.append(True))
    r = spec_replayable((F32,), (F32,), via="callback", host=host)
    r.close()
    assert closed == [True]
    with pytest.raises(RuntimeError, match="this replayable was closed"):
        r(jnp.zeros(16, jnp.float32))


def test_what_a_recorded_replayable_held_is_kept_until_exit():
    # A stream capture (XLA's command buffer) recorded the graph: the recording replays its nodes
    # without jaxgraph, so its memory must outlive the replayable.
    thing = StandIn()
    ref = weakref.ref(thing)
    r = holding(thing)
    r._state.uses[0] = (True, ())  # as retire() reports a graph that was recorded
    del thing
    kept = len(_replayable._KEPT_FOR_RECORDINGS)
    try:
        r.close()
        gc.collect()
        assert ref() is not None and r._keep == []
        assert len(_replayable._KEPT_FOR_RECORDINGS) == kept + 1
    finally:
        del _replayable._KEPT_FOR_RECORDINGS[kept:]
    gc.collect()
    assert ref() is None


def test_a_kernel_in_the_launch_table_keeps_its_library_after_it_is_collected():
    launch = native("launch")
    library = StandIn()
    ref = weakref.ref(library)
    kid = 1_000_000_000 + int(np.random.default_rng().integers(1 << 20))
    kernel = StandIn()  # a loaded Kernel's attributes, as LoadedCode reads them
    kernel.__dict__.update(name="stand_in", params=(), _library=library, _core=None, _h_kernel=0x1234,
                           _function_address=0x1234, _shared_limits={})
    kernel_ref = weakref.ref(kernel)
    live = launch.live_kernels()
    try:
        _kernel_call._load_kernel(kernel, kid, 0)
        del kernel, library
        gc.collect()
        assert kernel_ref() is None  # the entry does not keep the Kernel alive ...
        assert ref() is not None  # ... but its library: a recorded command buffer may still launch its code
        assert launch.live_kernels() == live + 1  # and the handler still finds it
    finally:
        launch.unregister_kernel(kid)
        _kernel_call._kept_for_xla.pop(kid, None)


# ---------------------------------------------------------------------------
# GPU: jitted functions after their Kernel and Replayable are collected
# ---------------------------------------------------------------------------

WORKER = textwrap.dedent(r'''
    import gc, json, sys, weakref
    import numpy as np
    import jax, jax.numpy as jnp
    import jaxgraph
    from jaxgraph._jax_interop import replayable as _replayable

    src, seed, out_path = open(sys.argv[1]).read(), int(sys.argv[2]), sys.argv[3]
    n = 4096
    rng = np.random.default_rng(seed)
    report, failures = {}, []

    def fresh():
        return jnp.asarray(rng.standard_normal(n).astype(np.float32))

    def outcome(name, call, want):
        """'exact', or 'error' for jaxgraph's clear error; anything else is a failure."""
        try:
            got = np.asarray(call())
        except Exception as exc:  # jax.errors.JaxRuntimeError from the handler
            if "reset or destroyed" not in str(exc):
                failures.append(f"{name}: unexpected error {str(exc)[:400]}")
            return "error"
        if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            failures.append(f"{name}: wrong values")
            return "wrong"
        return "exact"

    # A kernel rebound (a notebook's habit) after the jitted function that calls it ran.
    k = jaxgraph.Kernel(src, "axpb")
    f = jax.jit(lambda x: k.jax_call(jax.ShapeDtypeStruct(x.shape, x.dtype), x, 3.0, 1.0, n))
    x = fresh()
    report["kernel_before"] = outcome("kernel before", lambda: f(x), 3 * np.asarray(x) + 1)
    first = weakref.ref(k)
    k = jaxgraph.Kernel(src, "axpb")
    gc.collect()
    report["kernel_collected"] = first() is None
    report["kernel_after"] = [outcome(f"kernel after {i}", lambda: f(x), 3 * np.asarray(x) + 1) for i in range(3)]
    x2 = fresh()
    report["kernel_after_new_input"] = outcome("kernel after, new input", lambda: f(x2), 3 * np.asarray(x2) + 1)

    # A replayable (every buffer copied through its static arrays, a scratch buffer from its pool)
    # collected after a jitted function ran it; XLA may have recorded it.
    def build():
        axpb = jaxgraph.Kernel(src, "axpb")
        x_s, y_s = jaxgraph.zeros(n), jaxgraph.zeros(n)
        g = jaxgraph.CUDAGraph()
        with jaxgraph.graph(g):
            tmp = jaxgraph.empty(n)
            axpb[n // 256, 256](tmp, x_s, 3.0, 1.0, n)
            axpb[n // 256, 256](y_s, tmp, 1.0, 0.5, n)
        return jaxgraph.replayable(g, [x_s], [y_s], bind="copy")

    step = build()
    h = jax.jit(lambda x: step(x) * 2.0)
    x = fresh()
    want = lambda x: (3 * np.asarray(x) + 1.5) * 2
    report["replay_before"] = outcome("replay before", lambda: h(x), want(x))
    state, ref = step._state, weakref.ref(step)
    del step
    gc.collect()
    report["replay_collected"] = ref() is None
    report["recorded"] = state.recorded
    report["kept_for_recordings"] = len(_replayable._KEPT_FOR_RECORDINGS)
    # Memory allocated now may reuse freed blocks: a replay writing freed memory would change it.
    junk = [jaxgraph.empty(n).fill_(np.float32(-7)) for _ in range(16)]
    jaxgraph.synchronize()
    report["replay_after"] = [outcome(f"replay after {i}", lambda: h(x), want(x)) for i in range(3)]
    x3 = fresh()
    report["replay_after_new_input"] = outcome("replay after, new input", lambda: h(x3), want(x3))
    jax.effects_barrier()
    report["junk_untouched"] = all(bool((j.numpy() == np.float32(-7)).all()) for j in junk)
    report["failures"] = failures
    np.save(out_path, np.asarray(f(x)))
    print("REPORT " + json.dumps(report))
''')


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["off", "on"])
def test_jitted_functions_outlive_their_kernel_and_replayable(mode, tmp_path, rng):
    out, report = run_xla_worker(WORKER, JAX_SRC, tmp_path, mode, int(rng.integers(2**31)))
    print(mode, report)
    assert report["failures"] == [], report
    assert report["kernel_collected"] and report["replay_collected"], report
    # The kernel's code stays loaded: the function keeps working, recorded or not.
    assert report["kernel_before"] == "exact" and report["kernel_after"] == ["exact"] * 3, report
    assert report["kernel_after_new_input"] == "exact", report
    # The replayable: exact while a recording replays, else jaxgraph's clear error; never freed memory.
    assert report["replay_before"] == "exact", report
    assert set(report["replay_after"]) <= {"exact", "error"}, report
    assert report["replay_after_new_input"] in ("exact", "error"), report
    assert report["junk_untouched"], report
    if mode == "off":
        assert not report["recorded"], report
    # Whether XLA records the replay under "on" is XLA's choice (jax 0.11's XLA on an H200 did not, its
    # command buffers formed from thunks): either way, never freed memory. Recorded: the recording replays
    # exact (what it held is kept); not recorded: each call reaches the handler, which refuses clearly.
    if report["recorded"]:
        assert report["kept_for_recordings"] >= 1 and report["replay_after"] == ["exact"] * 3, report
    else:
        assert report["replay_after"] == ["error"] * 3 and report["replay_after_new_input"] == "error", report
    assert (report["kept_for_recordings"] > 0) == (mode == "on"), report
    if mode == "off":  # every call reaches the handler, which refuses the retired graph
        assert report["replay_after"] == ["error"] * 3, report
