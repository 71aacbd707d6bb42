"""Device stops: ``graphed_loop(..., until=flag)`` exact and with ``check_every=K``.

The step's kernel bumps a device counter and sets the flag when the counter
reaches a random threshold, so the step that sets the flag is known. A numpy
model of the loop (``model_steps``) says how many steps each launch runs: the
exact stop (K = 1) stops right after that step, ``check_every=K`` after the
trip of K steps holding it (up to K-1 steps late), and the R mod K steps left
after the full trips run only while the flag is clear. Every GPU test checks
the counter, ``steps_run`` and the state (numpy applying the step that many
times, fresh random inputs, outputs poisoned), with and without feed, R fixed,
read from a device array and given per call, eagerly and inside ``jax.jit``
under XLA command buffers off, on and JAX's defaults (each in its own process).

Tests internals (listed in tests/README.md): ``_graphed_loops._check_every``, ``_graphed_loops.GraphedLoop``
fields (a loop over a spec replayable, to lower without a device), ``_driver.compute_capability``. Each
layout of the exact stop is chosen with ``jaxgraph.diagnostics.loop_settings`` and read back with
``describe_loop``.
"""

import threading
import types

import numpy as np
import pytest

import jaxgraph
from jaxgraph import diagnostics
from jaxgraph._cuda import driver as _driver
from jaxgraph._jax_interop import graphed_loops as _graphed_loops
from support.graph_helpers import XLA_MODES
from support.kernel_sources import LOOP_STEP
from support.loop_helpers import ref, run_jit_worker

N = 1000
BLOCK = 256
GRID = (N + BLOCK - 1) // BLOCK

# x in place, bumping the counter and setting the flag at the threshold (x -> y, fed back: LOOP_STEP's lstep).
SOURCE = r"""
extern "C" __global__ void stop_step_in_place(float* x, const float* b, int* counter, int* flag,
                                              const int* stop_at, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 0.5f * x[i] + b[i];
  if (i == 0) {
    int c = atomicAdd(counter, 1) + 1;
    if (c >= *stop_at) *flag = 1;
  }
}
"""


def model_steps(r, k, stop_at):
    """Steps a launch runs: trips of k steps while a full trip remains and the flag is clear, then the
    rest (r mod k) only if the flag is still clear. The flag is set by step ``stop_at`` (1-based)."""
    ran, flag = 0, False
    while r - ran >= k and not flag:
        ran += k
        flag = ran >= stop_at
    if not flag:
        ran = r
    return ran


def test_model_is_exact_for_k1_and_never_past_r_or_k_minus_1():
    for r in range(0, 40):
        for s in range(1, 45):
            assert model_steps(r, 1, s) == min(r, s)
            for k in (2, 3, 8, 16):
                ran = model_steps(r, k, s)
                assert ran <= r and (ran == r or ran >= s) and ran - s <= k - 1


# ----------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------


def kernels():
    ks = types.SimpleNamespace(step=jaxgraph.Kernel(LOOP_STEP, "lstep"),
                               inplace=jaxgraph.Kernel(SOURCE, "stop_step_in_place"))
    ks.step.handle, ks.inplace.handle  # noqa: B018 - load before capture
    return ks


@pytest.fixture(scope="module")
def k():
    return kernels()


def make(ks, rng, feed=True):
    """A captured step on fresh random buffers (x -> y fed back, or x in place)."""
    s = types.SimpleNamespace(feed=feed)
    s.x = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    s.b = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    s.y = jaxgraph.zeros(N) if feed else s.x
    s.counter, s.flag = jaxgraph.zeros(1, np.int32), jaxgraph.zeros(1, np.int32)
    s.stop = jaxgraph.asarray(np.array([1 << 30], np.int32))
    s.g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(s.g):
        if feed:
            ks.step[GRID, BLOCK](s.y, s.x, s.b, s.counter, s.flag, s.stop, N)
        else:
            ks.inplace[GRID, BLOCK](s.x, s.b, s.counter, s.flag, s.stop, N)
    return s


def loop_of(s, steps, check_every, **kw):
    if s.feed:
        return jaxgraph.graphed_loop(s.g, steps, feed={0: 0}, until=s.flag, check_every=check_every,
                                     inputs=[s.x, s.b], outputs=[s.y], **kw)
    return jaxgraph.graphed_loop(s.g, steps, until=s.flag, check_every=check_every, inputs=[s.x, s.b],
                                 outputs=[s.x], **kw)


def launch_and_check(loop, s, rng, r, k, stop_at, steps=None):
    """Fresh x, y poisoned, counter zeroed, a stale flag set, threshold ``stop_at``: one replay, checked."""
    x0 = rng.standard_normal(N).astype(np.float32)
    s.x.copy_(x0)
    if s.feed:
        s.y.fill_(np.float32(np.nan))
    s.counter.fill_(0)
    s.flag.fill_(1)  # stale: the loop clears it at launch
    s.stop.copy_(np.array([stop_at], np.int32))
    loop.steps_run.fill_(-7)
    loop.replay(steps=steps)
    want = model_steps(r, k, stop_at)
    counter, ran = int(s.counter.numpy()[0]), int(loop.steps_run.numpy()[0])
    assert (counter, ran) == (want, want), dict(r=r, k=k, stop_at=stop_at)
    expect = ref(x0, s.b.numpy(), want)
    np.testing.assert_allclose(s.y.numpy(), expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.x.numpy(), expect, rtol=1e-5, atol=1e-6)  # both halves of the pair
    return want


@pytest.mark.gpu
@pytest.mark.parametrize("feed", [True, False], ids=["feed", "in_place"])
@pytest.mark.parametrize("check_every", [1, 2, 8])
def test_fixed_r_flag_at_random_steps(k, rng, feed, check_every):
    s = make(k, rng, feed)
    r = int(rng.integers(20, 60))
    loop = loop_of(s, r, check_every)
    assert loop.check_every == check_every and loop.unroll == check_every
    # The flag at random steps, at the ends, past R, at a trip boundary and just after one.
    stops = {1, r, r + 5, check_every, check_every + 1, *map(int, rng.integers(1, r + 1, 6))}
    for stop_at in sorted(stops):
        launch_and_check(loop, s, rng, r, check_every, stop_at)


@pytest.mark.gpu
@pytest.mark.parametrize("feed", [True, False], ids=["feed", "in_place"])
@pytest.mark.parametrize("check_every", [1, 4, 16])
def test_r_from_a_device_array_changes_between_launches(k, rng, feed, check_every):
    s = make(k, rng, feed)
    count = jaxgraph.zeros(1, np.int32)
    loop = loop_of(s, count, check_every)
    # R smaller than K (only the remainder runs), 0, a multiple of K, and random.
    for r in (3, 0, check_every, 2 * check_every + 1, *map(int, rng.integers(1, 70, 4))):
        count.copy_(np.array([r], np.int32))
        stop_at = int(rng.integers(1, r + 3))
        launch_and_check(loop, s, rng, r, check_every, stop_at)


@pytest.mark.gpu
def test_r_smaller_than_k_runs_all_r(k, rng):
    """With fewer steps than a trip there is no check: all R run (at most K-1 past the flag)."""
    s = make(k, rng)
    loop = loop_of(s, 5, 8)
    assert launch_and_check(loop, s, rng, 5, 8, stop_at=1) == 5


@pytest.mark.gpu
def test_own_count_per_replay_and_copy_ping_pong(k, rng):
    s = make(k, rng)
    for check_every, ping_pong in ((1, "auto"), (1, "copy"), (3, "copy"), (6, "auto")):
        loop = loop_of(s, None, check_every, ping_pong=ping_pong)
        if ping_pong == "copy":
            assert loop.ping_pong == "copy: asked for (ping_pong='copy')"
        else:
            assert loop.ping_pong == ("copy: by the stop check (exact stop)" if check_every == 1 else "swap")
        for r in map(int, rng.integers(0, 40, 4)):
            launch_and_check(loop, s, rng, r, check_every, int(rng.integers(1, 45)), steps=r)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [True, False], ids=["kernel_node", "child_graph"])
@pytest.mark.parametrize("kind", ["fused", "twin", "in_place"])
def test_each_exact_layout_stops_exactly(k, rng, kind, pdl):
    """Every way the builder lays out the exact stop (the check copying the pair, the swapped twin behind
    an IF, in place; the step as a kernel node with a programmatic check or as a child graph) stops right
    after the step that set the flag, R fixed and read from the device."""
    s = make(k, rng, feed=kind != "in_place")
    r = int(rng.integers(10, 40))
    count = jaxgraph.zeros(1, np.int32)
    # The layout is chosen where a loop is built.
    with diagnostics.loop_settings(fused_copy_bytes=0 if kind == "twin" else None, pdl_checks={kind} if pdl else ()):
        fixed, read = loop_of(s, r, 1), loop_of(s, count, 1)
    assert fixed.ping_pong == {"fused": "copy: by the stop check (exact stop)", "twin": "swap", "in_place": "none"}[kind]
    # The one-kernel step is a kernel node with a programmatic check where asked for and the GPU has
    # griddepcontrol (sm_90+); the builder falls back to a child graph only where the driver refuses.
    pdl_built = [diagnostics.describe_loop(loop).programmatic_check for loop in (fixed, read)]
    assert pdl_built == [pdl and _driver.compute_capability() >= (9, 0)] * 2, pdl_built
    for stop_at in {1, 2, r - 1, r, r + 3, *map(int, rng.integers(1, r + 1, 4))}:
        launch_and_check(fixed, s, rng, r, 1, stop_at)
        n = int(rng.integers(0, 45))
        count.copy_(np.array([n], np.int32))
        launch_and_check(read, s, rng, n, 1, stop_at)


@pytest.mark.gpu
def test_exact_stop_has_no_guard_per_step(k, rng):
    """The exact stop is a WHILE trip per step and no IF guard (a twin takes one IF per two steps)."""
    s = make(k, rng)
    loop = loop_of(s, 40, 1)
    assert loop.ping_pong == "copy: by the stop check (exact stop)"  # a 4 KB pair: no twin, no IF
    assert "IF" not in loop.summary() and "WHILE" in loop.summary()


@pytest.mark.gpu
def test_jit_in_process_defaults(k, rng):
    check_jit(k, rng)


def check_jit(ks, rng):
    """Inside jax.jit: (outputs, steps_run) for both mechanisms, fixed R and R per call, changing inputs."""
    import jax
    import jax.numpy as jnp

    for check_every in (1, 8):
        for feed in (True, False):
            s = make(ks, rng, feed)
            r = 37
            fixed = loop_of(s, r, check_every)
            per_call = loop_of(s, None, check_every)
            f_fixed = jax.jit(lambda x, b: fixed(x, b))
            f_call = jax.jit(lambda x, b, n: per_call(x, b, steps=n))
            for i in range(4):  # new inputs, new thresholds, new R each call
                x0, b0 = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
                stop_at = int(rng.integers(1, r + 4))
                s.stop.copy_(np.array([stop_at], np.int32))
                s.counter.fill_(0)
                jaxgraph.synchronize()  # the writes run on jaxgraph's stream, the loop on XLA's
                if i % 2 == 0:
                    n = r
                    y, ran = f_fixed(jnp.asarray(x0), jnp.asarray(b0))
                else:
                    n = int(rng.integers(0, 50))
                    y, ran = f_call(jnp.asarray(x0), jnp.asarray(b0), jnp.int32(n))
                want = model_steps(n, check_every, stop_at)
                got_ran = int(np.asarray(ran)[0])
                assert got_ran == want and int(s.counter.numpy()[0]) == want, \
                    dict(check_every=check_every, feed=feed, n=n, stop_at=stop_at, ran=got_ran)
                np.testing.assert_allclose(np.asarray(y), ref(x0, b0, want), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", sorted(XLA_MODES))
def test_jit_command_buffer_settings(mode):
    proc = run_jit_worker("test_loop_stops", "check_jit", "kernels", mode)
    assert proc.returncode == 0 and "JIT OK" in proc.stdout, proc.stdout + proc.stderr[-4000:]


# ----------------------------------------------------------------------------
# CPU: validation and lowering
# ----------------------------------------------------------------------------


FLAG = object()  # stands for a flag: _check_every only asks whether there is one


@pytest.mark.parametrize("value,exc,match", [
    (0, ValueError, r"check_every must be in \[1, 256\], got 0"),
    (257, ValueError, r"check_every must be in \[1, 256\], got 257"),
    (2.0, TypeError, "check_every must be an int, got float"),
    (True, TypeError, "check_every must be an int, got bool"),
])
def test_check_every_range_and_type(value, exc, match):
    with pytest.raises(exc, match=match):
        _graphed_loops._check_every(value, FLAG, None, False)


def test_check_every_needs_until_and_agrees_with_unroll():
    assert _graphed_loops._check_every(1, None, 8, True) is None           # no flag: unroll alone
    assert _graphed_loops._check_every(1, FLAG, None, True) == 1           # exact, feed or not
    assert _graphed_loops._check_every(8, FLAG, 8, True) == 8              # unroll may repeat it
    assert _graphed_loops._check_every(np.int64(3), FLAG, None, False) == 3
    with pytest.raises(ValueError, match="check_every=4 needs until="):
        _graphed_loops._check_every(4, None, None, False)
    with pytest.raises(ValueError, match="holds check_every=1 steps.*unroll=4 disagrees.*pass check_every=4"):
        _graphed_loops._check_every(1, FLAG, 4, True)
    with pytest.raises(ValueError, match="must be 1 or even with feed= \\(got 5\\)"):
        _graphed_loops._check_every(5, FLAG, None, True)
    assert _graphed_loops._check_every(5, FLAG, None, False) == 5          # odd: fine without a swapped twin


def test_graphed_loop_checks_check_every_before_device_work():
    g = jaxgraph.CUDAGraph()
    with pytest.raises(ValueError, match="check_every=4 needs until="):
        jaxgraph.graphed_loop(g, 10, check_every=4)
    with pytest.raises(TypeError, match="check_every must be an int"):
        jaxgraph.graphed_loop(g, 10, check_every="4")


def test_loop_with_check_every_lowers_to_one_replay_call_returning_steps_run():
    """jax.jit(loop) for the cuda platform: one jaxgraph_replay call, (state, steps_run int32[1])."""
    import jax
    import jax.numpy as jnp

    from support.internals import spec_replayable

    f32 = jax.ShapeDtypeStruct((N,), jnp.float32)
    loop = object.__new__(_graphed_loops.GraphedLoop)
    loop.outputs, loop.count, loop._count_is_own, loop._until = (object(),), None, False, FLAG
    loop.check_every = loop.unroll = 8
    loop._lock = threading.Lock()
    loop._fn = spec_replayable([f32, f32], [f32, jax.ShapeDtypeStruct((1,), jnp.int32)], 9)
    text = jax.jit(lambda x, b: loop(x, b)).trace(f32, f32).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "stablehlo.custom_call @jaxgraph_replay(" in line]
    assert len(calls) == 1
    assert "(tensor<1000xf32>, tensor<1000xf32>) -> (tensor<1000xf32>, tensor<1xi32>)" in calls[0]
    y, ran = jax.eval_shape(lambda x, b: loop(x, b), f32, f32)
    assert (y.shape, ran.shape, ran.dtype) == ((N,), (1,), jnp.int32)
