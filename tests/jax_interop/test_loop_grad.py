"""jax.grad through graphed loops, on the CPU: the checkpoint layout, the forward and backward programs run
on a numpy machine against jax.grad of the jnp loop (float64), the control kernels compiled for sm_90,
and the errors raised at trace time before any launch. The device runs are in test_loop_grad_gpu.py.
Tests internals: ``_graphs.checkpoint_loop`` (layout, programs, kernels) and ``_jax_interop.loop_grad``
(its custom_vjp and checks, on a loop object made without a GPU), since the public path needs a device.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from conftest import enable_x64
from jaxgraph._graphs import checkpoint_loop as ck
from jaxgraph._jax_interop import loop_grad
from jaxgraph._jax_interop.graphed_callables import GraphedCallable
from jaxgraph._jax_interop.graphed_loops import GraphedLoop

from support.loop_grad_helpers import loop_ref, machine_gradient
from support.loop_grad_helpers import machine_parts as machine_parts_of


# ----------------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("r,every", [(1, 1), (7, 3), (100, 7), (1000, 31), (32, 32), (5, 8), (64, 8)])
def test_segments_cover_every_step_once_partial_first(r, every):
    segs = ck.segments(r, every)
    steps = [s for _, first, n in segs for s in range(first, first + n)]
    assert steps == list(range(r))
    assert [slot for slot, _, _ in segs] == list(range(len(segs)))
    assert all(n == every for _, _, n in segs[1:])
    assert len(segs) <= ck.checkpoint_layout(r, r, every).slots


@pytest.mark.parametrize("r,want", [(1000, 25), (100, 10), (7, 3), (1, 1), (97, 10), (10**6, 256)])
def test_default_checkpoint_every_is_about_sqrt_r(r, want):
    layout = ck.checkpoint_layout(r, r, None)
    assert layout.every == want
    assert layout.slots == -(-r // want)
    assert layout.states == layout.slots + layout.every


def test_layout_for_a_count_read_on_the_device():
    layout = ck.checkpoint_layout(-1, 1000, None)
    assert (layout.every, layout.slots, layout.fixed) == (32, 32, -1)
    layout = ck.checkpoint_layout(-1, 1000, 7)
    assert (layout.every, layout.slots) == (7, 143)


# ----------------------------------------------------------------------------
# The programs on the numpy machine vs jax.grad of the jnp loop
# ----------------------------------------------------------------------------


def _reference(x0, a, m, ct_y, ct_z, steps):
    with enable_x64(True):
        def loss(x, a):
            y, z = loop_ref(x, a, m, steps)
            return jnp.vdot(y, ct_y) + jnp.vdot(z, ct_z)

        y, z = loop_ref(x0, a, m, steps)
        gx, ga = jax.grad(loss, argnums=(0, 1))(x0, a)
        return np.asarray(y), np.asarray(z), np.asarray(gx), np.asarray(ga)


@pytest.mark.parametrize("steps,every", [(1, 1), (1, 3), (7, 3), (7, 7), (7, 1), (100, 7), (100, None),
                                         (60, 8), (33, 32), (1000, 31)])
@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("retarget", [False, True])
def test_programs_match_jax_grad(rng, steps, every, fixed, retarget):
    n = 5
    x0 = rng.standard_normal(n)
    a = rng.standard_normal(n) * 0.3
    m = rng.integers(0, 3, n).astype(np.float64)
    ct_y, ct_z = rng.standard_normal(n), rng.standard_normal(n)
    y, z, gx, ga = machine_gradient(x0, a, m, ct_y, ct_z, steps, every, fixed=fixed, max_steps=steps + 13,
                                    retarget=retarget)
    ry, rz, rgx, rga = _reference(x0, a, m, ct_y, ct_z, steps)
    np.testing.assert_allclose(y, ry, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(z, rz, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gx, rgx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ga, rga, rtol=1e-10, atol=1e-12)


def test_program_with_rerun_forward_and_float32(rng):
    n = 4
    x0 = rng.standard_normal(n).astype(np.float32)
    a = (rng.standard_normal(n) * 0.3).astype(np.float32)
    m = np.ones(n, np.float32)
    ct_y, ct_z = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    trace = []
    y, z, gx, ga = machine_gradient(x0, a, m, ct_y, ct_z, 23, 5, rerun=True, trace=trace)
    ry, rz, rgx, rga = _reference(x0.astype(np.float64), a.astype(np.float64), m.astype(np.float64),
                                  ct_y.astype(np.float64), ct_z.astype(np.float64), 23)
    np.testing.assert_allclose(gx, rgx, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(ga, rga, rtol=2e-5, atol=2e-5)
    # 23 forward steps, 23 - 5 recomputed (one fewer per segment), 23 again before each backward, 23 backward.
    assert trace.count("backward") == 23
    assert trace.count("step") == 23 + (23 - 5) + 23


def test_program_with_zero_steps_on_the_device_returns_the_cotangents(rng):
    n = 3
    x0, a, m = rng.standard_normal(n), rng.standard_normal(n), np.ones(n)
    ct_y, ct_z = rng.standard_normal(n), rng.standard_normal(n)
    y, z, gx, ga = machine_gradient(x0, a, m, ct_y, ct_z, 0, 4, fixed=False, max_steps=10)
    np.testing.assert_array_equal(y, x0)
    np.testing.assert_array_equal(gx, ct_y)
    np.testing.assert_array_equal(ga, np.zeros(n))


def test_program_beyond_max_steps_gives_nan(rng):
    n = 3
    x0, a, m = rng.standard_normal(n), rng.standard_normal(n), np.ones(n)
    y, z, gx, ga = machine_gradient(x0, a, m, x0, x0, 11, 4, fixed=False, max_steps=10)
    assert np.isnan(y).all() and np.isnan(z).all() and np.isnan(gx).all() and np.isnan(ga).all()


def test_retargeted_programs_copy_no_state_between_full_steps(rng):
    parts = machine_parts_of(4, np.float32)
    fwd, bwd = ck.forward_program(parts, 6, True), ck.backward_program(parts, 6, True)
    body_f, body_b = fwd.nodes[3][2].nodes, bwd.nodes[2][2].nodes   # the full segments' WHILE bodies
    assert [n[0] for n in body_f] == ["ops"] + ["step"] * 6 + ["ctl"]      # even C: no copy at all
    assert [n[0] for n in body_b].count("ops") == 1 + 6                    # ring[0], then one per backward
    assert all(n[1] for n in body_b if n[0] in ("step", "backward"))       # every one a clone
    with pytest.raises(ValueError, match="does not read the step's outputs"):
        ck.backward_program(machine_parts_of(4, np.float32, rerun=True), 6, True)


def test_one_forward_per_step_and_recomputation_per_segment(rng):
    n = 2
    x = rng.standard_normal(n)
    trace = []
    machine_gradient(x, x, np.ones(n), x, x, 100, 7, trace=trace)
    # forward 100, recompute 100 - 15 segments (ceil(100/7)), backward 100.
    assert trace.count("step") == 100 + 100 - 15
    assert trace.count("backward") == 100


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------


def test_grad_kernels_compile_for_sm90_without_a_device():
    ks = ck.grad_kernels(arch="sm_90")
    assert set(ks) == {"jaxgraph_grad_ctl", "jaxgraph_grad_ops"}
    for k in ks.values():
        assert len(k.cubin) > 0


# ----------------------------------------------------------------------------
# Errors at trace time (no device: a loop object with the attributes the checks read)
# ----------------------------------------------------------------------------


class _FakeGraph:
    _generators = ()

    def summary(self):
        return "kernel node jaxgraph_something"


def _fake_loop(backward=True, until=None, feed=None, steps=10, max_steps=None, step="callable", draws=False):
    import threading

    if step == "callable":
        s = object.__new__(GraphedCallable)
        s.__name__ = "advance"
        s.graph = _FakeGraph()
        s.backward_graph = _FakeGraph() if backward else None
        s._backward_parts = ((), (), (), ()) if backward else None
        if draws:
            s.graph._generators = (object(),)
    else:
        s = object()
    loop = object.__new__(GraphedLoop)
    loop._step, loop._until, loop.feed = s, until, {0: 0} if feed is None else feed
    loop.steps, loop._max_steps, loop._checkpoint_every = steps, max_steps, None
    loop._lock, loop._count_is_own, loop.inputs = threading.Lock(), steps is None, ()
    return loop


@pytest.mark.parametrize("kw,exc,match", [
    (dict(backward=False), TypeError, r"needs its step to have a backward: capture it with "
                                      r"make_graphed_callables\(advance, sample_args, backward=bwd\)"),
    (dict(step="graph"), TypeError, "step is a CUDAGraph, which has no backward"),
    (dict(until=object(), steps=None), ValueError, r"max_steps=M"),
    (dict(feed={}), ValueError, "needs feed="),
    (dict(draws=True), NotImplementedError, "draws random numbers"),
    (dict(steps=None), ValueError, r"build it with graphed_loop\(..., max_steps=M\)"),
])
def test_refused_at_trace_time_before_any_launch(kw, exc, match):
    launched = []

    def primal(x):
        launched.append(1)
        return x

    fn = loop_grad.differentiable(_fake_loop(**kw), primal)
    with pytest.raises(exc, match=match):
        jax.grad(lambda x: fn(x).sum())(jnp.ones(3))
    with pytest.raises(exc, match=match):
        jax.jit(jax.grad(lambda x: fn(x).sum())).trace(jnp.ones(3))
    assert not launched or kw == {}  # the primal runs only under jax.grad's eager trace, never the device


# The custom_vjp's wiring (arguments, residuals, cotangent routing, until=, a count per call) with the
# device replaced by jnp stand-ins of the checkpointed forward and backward of y = 0.9 x + a.

def _wired(until, own_count, rng, steps=6, stop_at=4):
    f32 = np.float32
    loop = _fake_loop(until=object() if until else None, steps=None if own_count else steps,
                      max_steps=steps if own_count else None)
    step = loop._step
    step._static_in, step._static_out = (np.zeros(3, f32), np.zeros(3, f32)), (np.zeros(3, f32),)
    step._backward_parts = ((np.zeros(3, f32),), (np.zeros(3, f32), np.zeros(3, f32)), (0, 1), (True,) * 5)
    loop.inputs = step._static_in
    grad = loop_grad.loop_gradient(loop)
    calls = []

    def run(x, a, r):
        for _ in range(r):
            x = 0.9 * x + a
        return x

    def primal(x, a, n=None):
        r = steps if n is None else int(n[0])
        y = run(x, a, r)
        return (y, jnp.full((1,), min(r, stop_at), jnp.int32)) if until else y

    def fwd(x, a, count=None):
        r = int(count[0]) if count is not None else steps
        calls.append(("fwd", r))
        return run(x, a, r), jnp.stack([x, x]), jnp.full((1,), r, jnp.int32)

    def bwd(ck, a, ct, r):
        r = int(r[0])
        calls.append(("bwd", r))
        return 0.9 ** r * ct, ct * sum(0.9 ** t for t in range(r))

    grad._built, grad._fwd, grad._bwd = True, fwd, bwd
    return loop, loop_grad.differentiable(loop, primal), calls


@pytest.mark.parametrize("until,own_count", [(False, False), (False, True), (True, False), (True, True)])
def test_custom_vjp_routes_arguments_and_cotangents(rng, until, own_count):
    loop, fn, calls = _wired(until, own_count, rng)
    x, a, w = (jnp.asarray(rng.standard_normal(3), jnp.float32) for _ in range(3))
    count = (jnp.full((1,), 6, jnp.int32),) if own_count else ()

    def loss(x, a):
        out = fn(x, a, *count)
        y = out[0] if until else out
        return jnp.vdot(y, w)

    gx, ga = jax.grad(loss, argnums=(0, 1))(x, a)
    r = 4 if until else 6   # with until=, the steps the loop ran
    np.testing.assert_allclose(gx, 0.9 ** r * w, rtol=1e-6)
    np.testing.assert_allclose(ga, w * sum(0.9 ** t for t in range(r)), rtol=1e-6)
    assert calls == [("fwd", r), ("bwd", r)]
    (_, *rest), vjp = jax.vjp(lambda x, a: fn(x, a, *count), x, a)
    assert len(vjp(((w, np.zeros((1,), jax.dtypes.float0)) if until else w))) == 2


def test_forward_mode_is_refused_when_traced():
    class Stub:  # a built gradient (the checks passed): JAX itself refuses the custom_vjp under jvp
        def forward(self, primal, args):
            return primal(*args), ()

    loop = _fake_loop()
    loop._gradient = Stub()
    fn = loop_grad.differentiable(loop, lambda x: x * 2)
    with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
        jax.jit(lambda x, t: jax.jvp(fn, (x,), (t,))).trace(jnp.ones(3), jnp.ones(3)).lower()


def test_no_gradient_machinery_without_grad():
    calls = []
    fn = loop_grad.differentiable(_fake_loop(backward=False), lambda x: calls.append(1) or x + 1)
    np.testing.assert_array_equal(jax.jit(fn)(jnp.ones(2)), 2 * np.ones(2))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(checkpoint_every=0), ValueError, r"checkpoint_every must be in \[1, 256\], got 0"),
    (dict(checkpoint_every=1.5), TypeError, "checkpoint_every must be an int, got float"),
    (dict(max_steps=-1), ValueError, "max_steps must be in"),
    (dict(max_steps=5, fixed=10), ValueError, "runs a fixed 10 steps: leave max_steps out"),
])
def test_checkpoint_options_checked(kw, exc, match):
    fixed = kw.pop("fixed", -1)
    with pytest.raises(exc, match=match):
        loop_grad.check_checkpoint_options(kw.get("checkpoint_every"), kw.get("max_steps"), fixed)


def test_checkpoint_memory_reports_slots_plus_ring():
    loop = _fake_loop(steps=1000)

    class A:
        nbytes = 4096

    loop.inputs = (A(),)
    m = loop.checkpoint_memory()
    assert (m["checkpoint_every"], m["slots"], m["ring"]) == (25, 40, 25)
    assert m["device_bytes"] == (40 + 25) * 4096 and m["residual_bytes"] == 40 * 4096
    loop = _fake_loop(steps=None, max_steps=100)
    loop.inputs = (A(),)
    assert loop.checkpoint_memory()["slots"] == 10
    assert loop.checkpoint_memory(steps=30)["slots"] == 6
    with pytest.raises(ValueError, match="fixed 1000 steps"):
        _fake_loop(steps=1000).checkpoint_memory(steps=3)
    loop = _fake_loop(steps=1000, until=object())   # the steps run are read on the device: ceil(sqrt(R))
    loop.inputs = (A(),)
    assert (loop.checkpoint_memory()["checkpoint_every"], loop.checkpoint_memory()["slots"]) == (32, 32)


def test_graphed_loop_checks_checkpoint_options_before_device_work():
    with pytest.raises(TypeError, match="checkpoint_every must be an int"):
        jaxgraph.graphed_loop(jaxgraph.CUDAGraph(), 10, checkpoint_every="x")
