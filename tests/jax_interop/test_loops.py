"""Graphed loops (jaxgraph.graphed_loop): exact step counts, ping-pong, stop flags, jit.

Every GPU test checks the state against numpy applying the step the same
number of times, on fresh random inputs with the outputs poisoned, and the
number of steps run against a device counter the step's own kernel bumps.

Tests internals (listed in tests/README.md): ``_graphed_loops._check_*``, ``_graphs.loop_build``;
graphed_loop's argument checks on a CPU (the public call needs a captured graph).
"""

import types

import numpy as np
import pytest

import jaxgraph
from jaxgraph._graphs import loop_build as _loop_build
from jaxgraph._jax_interop import graphed_loops as _graphed_loops
from support.kernel_sources import LOOP_STEP
from support.loop_helpers import ref, run_jit_worker

N = 1000
BLOCK = 256


def blocks(n):
    return (n + BLOCK - 1) // BLOCK


@pytest.fixture(scope="module")
def k():
    return _kernels()


def make_step(k, rng, stop_at=1 << 30):
    """A captured step on fresh random buffers: x -> y, with its counter, flag and stop threshold."""
    s = types.SimpleNamespace()
    s.x = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    s.b = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    s.y = jaxgraph.zeros(N)
    s.counter = jaxgraph.zeros(1, np.int32)
    s.flag = jaxgraph.zeros(1, np.int32)
    s.stop = jaxgraph.asarray(np.array([stop_at], np.int32))
    s.g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(s.g):
        k.step[blocks(N), BLOCK](s.y, s.x, s.b, s.counter, s.flag, s.stop, N)
    return s


def run_and_check(loop, s, rng, want_steps, steps=None, both_halves=True):
    """Replay ``loop`` (``steps=``) from a fresh random x, y poisoned and the counter zeroed;
    check that ``want_steps`` steps were counted and run and that y matches numpy (and x,
    the other half of the ping-pong pair, holds the result too when ``both_halves``)."""
    x0 = rng.standard_normal(N).astype(np.float32)
    s.x.copy_(x0)
    s.y.fill_(np.float32(np.nan))
    s.counter.fill_(0)
    loop.steps_run.fill_(-7)
    loop.replay(steps=steps)
    counter, ran = int(s.counter.numpy()[0]), int(loop.steps_run.numpy()[0])
    assert (counter, ran) == (want_steps, want_steps), (steps, want_steps)
    y = s.y.numpy()
    np.testing.assert_allclose(y, ref(x0, s.b.numpy(), want_steps), rtol=1e-5, atol=1e-6)
    if both_halves:
        np.testing.assert_allclose(s.x.numpy(), y)


# ----------------------------------------------------------------------------
# GPU: eager
# ----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [0, 1, 3, 8, 21, 22])
def test_fixed_steps_not_a_multiple_of_unroll(k, rng, steps):
    s = make_step(k, rng)
    loop = jaxgraph.graphed_loop(s.g, steps, feed={0: 0}, unroll=4, inputs=[s.x, s.b], outputs=[s.y])
    assert loop.ping_pong == "swap" and loop.unroll == 4 and loop.steps == steps
    run_and_check(loop, s, rng, steps)   # both halves of the pair hold the result


@pytest.mark.gpu
def test_steps_from_a_device_array_change_between_launches(k, rng):
    s = make_step(k, rng)
    count = jaxgraph.zeros(1, np.int32)
    loop = jaxgraph.graphed_loop(s.g, count, feed={0: 0}, unroll=8, inputs=[s.x, s.b], outputs=[s.y])
    assert loop.steps is None and loop.count is count
    for steps in (13, 0, 8, 1, 30, 7):
        count.copy_(np.array([steps], np.int32))
        run_and_check(loop, s, rng, steps)


@pytest.mark.gpu
def test_own_count_filled_by_replay(k, rng):
    s = make_step(k, rng)
    loop = jaxgraph.graphed_loop(s.g, feed={0: 0}, unroll=6, inputs=[s.x, s.b], outputs=[s.y])
    for steps in (17, 5, 2):
        run_and_check(loop, s, rng, steps, steps=steps, both_halves=False)
    with pytest.raises(ValueError, match="fixed"):
        jaxgraph.graphed_loop(s.g, 3, inputs=[s.x, s.b], outputs=[s.y]).replay(steps=2)


@pytest.mark.gpu
@pytest.mark.parametrize("stop_at,steps", [(1, 20), (3, 20), (6, 20), (8, 20), (50, 20), (5, 5), (2, 0)])
def test_until_flag_stops_exactly(k, rng, stop_at, steps):
    s = make_step(k, rng, stop_at)
    loop = jaxgraph.graphed_loop(s.g, steps, feed={0: 0}, until=s.flag, inputs=[s.x, s.b], outputs=[s.y],
                                 preserve=[s.counter])  # the speculative steps' counts are undone too
    assert loop.check_every is None and loop.stop == "exact"
    s.flag.fill_(1)  # a stale flag from an earlier run: the loop clears it at launch
    run_and_check(loop, s, rng, min(stop_at, steps))
    assert "WHILE" in loop.summary()


@pytest.mark.gpu
def test_until_with_count_from_device(k, rng):
    s = make_step(k, rng)
    loop = jaxgraph.graphed_loop(s.g, feed={0: 0}, until=s.flag, inputs=[s.x, s.b], outputs=[s.y],
                                 preserve=[s.counter])
    for stop_at, steps in ((7, 100), (100, 9), (4, 4)):
        s.stop.copy_(np.array([stop_at], np.int32))
        run_and_check(loop, s, rng, min(stop_at, steps), steps=steps, both_halves=False)


@pytest.mark.gpu
def test_in_place_step_needs_no_feed(k, rng):
    x = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    b = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    counter = jaxgraph.zeros(1, np.int32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.inplace[blocks(N), BLOCK](x, b, counter, N)
    loop = jaxgraph.graphed_loop(g, 11, unroll=3)
    assert loop.ping_pong == "none"
    x0 = rng.standard_normal(N).astype(np.float32)
    x.copy_(x0)
    loop.replay()
    np.testing.assert_allclose(x.numpy(), ref(x0, b.numpy(), 11), rtol=1e-5, atol=1e-6)
    assert int(counter.numpy()[0]) == 11 and int(loop.steps_run.numpy()[0]) == 11


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [0, 5, 6])
def test_copy_fallback_where_swapping_is_unsafe(k, rng, steps):
    """A step ending in a memcpy into y cannot be swapped: a device copy y -> x follows each step."""
    s = make_step(k, rng)
    tmp = jaxgraph.zeros(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.step[blocks(N), BLOCK](tmp, s.x, s.b, s.counter, s.flag, s.stop, N)
        s.y.copy_(tmp)
    loop = jaxgraph.graphed_loop(g, steps, feed={0: 0}, unroll=2, inputs=[s.x, s.b], outputs=[s.y])
    assert loop.ping_pong.startswith("copy: ") and "memcpy" in loop.ping_pong
    run_and_check(loop, s, rng, steps)


@pytest.mark.gpu
def test_copy_asked_for(k, rng):
    s = make_step(k, rng)
    loop = jaxgraph.graphed_loop(s.g, 7, feed={0: 0}, unroll=3, ping_pong="copy", inputs=[s.x, s.b],
                                 outputs=[s.y])
    assert loop.ping_pong == "copy: asked for (ping_pong='copy')"
    run_and_check(loop, s, rng, 7)


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [129, 130])  # two trips of the default K = 64, then 1 or 2 steps
def test_make_graphed_callables_step(k, rng, steps):
    counter, flag, stop = jaxgraph.zeros(1, np.int32), jaxgraph.zeros(1, np.int32), jaxgraph.zeros(1, np.int32)
    stop.fill_(1 << 30)

    def advance(x, b):
        y = jaxgraph.empty(x.shape)
        k.step[blocks(N), BLOCK](y, x, b, counter, flag, stop, N)
        return y

    x0, b0 = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    graphed = jaxgraph.make_graphed_callables(advance, (jaxgraph.asarray(x0), jaxgraph.asarray(b0)),
                                              num_warmup_iters=1)
    loop = jaxgraph.graphed_loop(graphed, steps, feed={0: 0})
    assert loop.unroll == _graphed_loops.default_unroll(1) and loop.ping_pong == "swap"
    x_static, b_static = graphed.static_inputs
    x_static.copy_(x0)
    graphed.static_outputs.fill_(np.float32(np.nan))
    counter.fill_(0)
    loop.replay()
    np.testing.assert_allclose(graphed.static_outputs.numpy(), ref(x0, b0, steps), rtol=1e-5, atol=1e-6)
    assert int(counter.numpy()[0]) == steps
    assert "WHILE" in loop.summary()


@pytest.mark.gpu
def test_jit_in_process_defaults(k, rng):
    """Inside jax.jit with JAX's default flags (other settings: test_jit_command_buffer_settings)."""
    _check_jit(k, rng)


def _check_jit(k, rng):
    import jax
    import jax.numpy as jnp

    s = make_step(k, rng)
    loop = jaxgraph.graphed_loop(s.g, feed={0: 0}, unroll=4, inputs=[s.x, s.b], outputs=[s.y])
    fn = jax.jit(lambda x, b, n: loop(x, b, steps=n) * 1.0)
    b = s.b.numpy()
    for steps in (5, 12, 0, 9):
        x0 = rng.standard_normal(N).astype(np.float32)
        s.counter.fill_(0)
        jaxgraph.synchronize()  # the memset runs on jaxgraph's stream, the loop on XLA's
        out = np.asarray(fn(jnp.asarray(x0), jnp.asarray(b), jnp.int32(steps)))
        np.testing.assert_allclose(out, ref(x0, b, steps), rtol=1e-5, atol=1e-6)
        assert int(s.counter.numpy()[0]) == steps
    # A Python int and a fixed loop in jit, and until: (outputs, steps_run).
    s2 = make_step(k, rng, stop_at=6)
    stopping = jaxgraph.graphed_loop(s2.g, 20, feed={0: 0}, until=s2.flag, inputs=[s2.x, s2.b], outputs=[s2.y])
    x0 = rng.standard_normal(N).astype(np.float32)
    y, ran = jax.jit(stopping)(jnp.asarray(x0), jnp.asarray(s2.b.numpy()))
    assert int(np.asarray(ran)[0]) == 6
    np.testing.assert_allclose(np.asarray(y), ref(x0, s2.b.numpy(), 6), rtol=1e-5, atol=1e-6)
    out = jax.jit(lambda x, b: loop(x, b, steps=7))(jnp.asarray(x0), jnp.asarray(b))
    np.testing.assert_allclose(np.asarray(out), ref(x0, b, 7), rtol=1e-5, atol=1e-6)


def _kernels():
    ks = types.SimpleNamespace(step=jaxgraph.Kernel(LOOP_STEP, "lstep"), inplace=jaxgraph.Kernel(LOOP_STEP, "lstep_inplace"))
    ks.step.handle, ks.inplace.handle  # noqa: B018 - load before capture
    return ks


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["off", "on"])  # XLA command buffers off and on (each in its own process)
def test_jit_command_buffer_settings(mode):
    proc = run_jit_worker("test_loops", "_check_jit", "_kernels", mode)
    assert proc.returncode == 0 and "JIT OK" in proc.stdout, proc.stdout + proc.stderr[-4000:]


# ----------------------------------------------------------------------------
# CPU: what needs no device
# ----------------------------------------------------------------------------


def test_control_kernels_compile_for_sm90_without_a_device():
    ks = _loop_build.control_kernels(arch="sm_90")
    assert set(ks) == set(_loop_build._KERNEL_NAMES)
    assert all(len(k.cubin) > 0 for k in ks.values())


def test_default_unroll():
    assert _graphed_loops.default_unroll(1) == 64
    assert _graphed_loops.default_unroll(10) == 10
    assert _graphed_loops.default_unroll(100) == 2
    assert _graphed_loops.default_unroll(3, even=False) % 2 == 1
    with pytest.raises(ValueError, match="positive"):
        _graphed_loops.default_unroll(0)


def test_step_must_be_a_graph_or_graphed_callable():
    with pytest.raises(TypeError, match="CUDAGraph or a make_graphed_callables"):
        jaxgraph.graphed_loop(lambda x: x, 3)
    with pytest.raises(ValueError, match="ping_pong must be 'auto' or 'copy'"):
        jaxgraph.graphed_loop(lambda x: x, 3, ping_pong="swap")


def _fake(ptr, shape=(4,), dtype=np.float32):
    return types.SimpleNamespace(ptr=ptr, shape=shape, dtype=np.dtype(dtype), nbytes=int(np.prod(shape)) * 4)


def test_internal_feed_checks():
    ins, outs = (_fake(1000), _fake(2000)), (_fake(3000), _fake(1000), _fake(4000, (5,)))
    assert [(x.ptr, y.ptr) for x, y in _graphed_loops._check_feed({0: 0}, ins, outs)] == [(1000, 3000)]
    assert _graphed_loops._check_feed({1: 0}, ins, outs) == []            # in place: nothing to move
    with pytest.raises(ValueError, match="output index 3"):
        _graphed_loops._check_feed({3: 0}, ins, outs)
    with pytest.raises(ValueError, match="input index 2"):
        _graphed_loops._check_feed({0: 2}, ins, outs)
    with pytest.raises(ValueError, match="must match"):
        _graphed_loops._check_feed({2: 1}, ins, outs)
    with pytest.raises(ValueError, match="fed by two outputs"):
        _graphed_loops._check_feed({0: 1, 1: 1}, ins, outs)
    with pytest.raises(TypeError, match="dict"):
        _graphed_loops._check_feed([(0, 0)], ins, outs)


def test_internal_count_unroll_and_flag_checks():
    assert _graphed_loops._check_count(7) == (7, None)
    assert _graphed_loops._check_count(None) == (-1, None)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*31\)"):
        _graphed_loops._check_count(-1)
    with pytest.raises(TypeError, match="steps must be"):
        _graphed_loops._check_count(2.5)
    with pytest.raises(TypeError, match="steps must be"):
        _graphed_loops._check_count(True)
    assert _graphed_loops._check_unroll(8, True) == 8
    with pytest.raises(ValueError, match="even"):
        _graphed_loops._check_unroll(5, True)
    with pytest.raises(ValueError, match=r"\[1, 256\]"):
        _graphed_loops._check_unroll(0, False)
    with pytest.raises(TypeError, match="unroll must be an int"):
        _graphed_loops._check_unroll(4.0, False)
    assert _graphed_loops._check_until(None) == 0
    with pytest.raises(TypeError, match="one-element device array"):
        _graphed_loops._check_until(np.zeros(1, np.int32))
