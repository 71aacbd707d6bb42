"""The default exact stop of ``graphed_loop(..., until=flag)``: speculative trips behind a watch.

A trip runs K steps unguarded, each followed by a watch kernel that saves what
a step may write on the step that first finds the flag set; after the loop
that state is restored. So whatever ran past the flag, the loop must leave
exactly what a run of exactly the stopping step count leaves: ``steps_run``,
the outputs it returns, the step's static arrays (both halves of a fed pair),
a generator's draws and offset, and the arrays named in ``preserve=``.

The step draws uniform noise with a registered :class:`jaxgraph.Generator`
(a static output), then ``y = 0.5 x + b + noise`` and bumps a counter (in
``preserve``) whose value sets the flag at a random step. The numpy model
replays exactly that many steps with the same draws (an eager twin
generator). Stops are placed at every position of a trip (first, middle,
last step, a trip boundary, the remainder after the full trips, the last
step, never) for R in {0, 1, 7, 100}, for a fed pair through the swapped
twin and through copies, and in place; eagerly and inside ``jax.jit`` under
every XLA command-buffer setting (each in its own process). A flag that later
steps clear again is stopped at too (the watch sees each step).

Tests internals (listed in tests/README.md): ``_graphed_loops._check_preserve``, ``_graphed_loops._snapshotted``,
``_graphed_loops._EXACT_MAX_UNROLL``, ``_loop_build._KERNEL_NAMES``; the watch's layout is chosen with
``jaxgraph.diagnostics.loop_settings`` and read back with ``describe_loop``.
"""

import os
import subprocess
import sys
import types

import numpy as np
import pytest

import jaxgraph
from jaxgraph import diagnostics
from jaxgraph._cuda import driver as _driver
from jaxgraph._graphs import loop_build as _loop_build
from jaxgraph._jax_interop import graphed_loops as _graphed_loops
from support.graph_helpers import XLA_MODES
from support.kernel_sources import LOOP_STEP
from support.loop_helpers import ref

N = 1000
BLOCK = 256
GRID = (N + BLOCK - 1) // BLOCK
K = 8
NEVER = 1 << 30

# y = 0.5 x + b + noise, counting steps; sticky: the flag is set from step stop_at on (never cleared),
# else set on that step only and cleared by the next ones.
SOURCE = r"""
__device__ void count_and_flag(int* counter, int* flag, const int* stop_at, int sticky) {
  int c = atomicAdd(counter, 1) + 1;
  if (sticky) { if (c >= *stop_at) *flag = 1; }
  else *flag = (c == *stop_at);
}
extern "C" __global__ void noisy_step(float* y, const float* x, const float* b, const float* noise, int* counter,
                                      int* flag, const int* stop_at, int sticky, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 0.5f * x[i] + b[i] + noise[i];
  if (i == 0) count_and_flag(counter, flag, stop_at, sticky);
}
extern "C" __global__ void noisy_step_in_place(float* x, const float* b, const float* noise, int* counter,
                                               int* flag, const int* stop_at, int sticky, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 0.5f * x[i] + b[i] + noise[i];
  if (i == 0) count_and_flag(counter, flag, stop_at, sticky);
}
"""

SETTINGS = dict(XLA_MODES, **{"while": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL "
                                       "--xla_gpu_graph_min_graph_size=1"})


def stops_for(r):
    """Where the flag is set: each position of a K-step trip, the remainder, the last step, never."""
    return sorted({1, K // 2, K, K + 1, 2 * K, (r // K) * K, (r // K) * K + 1, r - 1, r, NEVER} - {0, -1})


# ----------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------


def kernels():
    ks = types.SimpleNamespace(fed=jaxgraph.Kernel(SOURCE, "noisy_step"),
                               in_place=jaxgraph.Kernel(SOURCE, "noisy_step_in_place"),
                               one=jaxgraph.Kernel(LOOP_STEP, "lstep"))
    ks.fed.handle, ks.in_place.handle, ks.one.handle  # noqa: B018 - load before capture
    return ks


@pytest.fixture(scope="module")
def k():
    return kernels()


def make(ks, rng, kind, sticky=True):
    """A captured step (kind "twin"/"copy": x -> y fed back; "in_place": x updated) drawing noise."""
    s = types.SimpleNamespace(kind=kind, sticky=sticky, seed=int(rng.integers(1, 2**31)))
    s.x = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    s.b = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    s.y = s.x if kind == "in_place" else jaxgraph.zeros(N)
    s.noise = jaxgraph.zeros(N)
    s.counter, s.flag = jaxgraph.zeros(1, np.int32), jaxgraph.zeros(1, np.int32)
    s.stop = jaxgraph.asarray(np.array([NEVER], np.int32))
    s.gen = jaxgraph.Generator(s.seed)
    s.g = jaxgraph.CUDAGraph()
    s.g.register_generator_state(s.gen)
    with jaxgraph.graph(s.g):
        s.gen.uniform(s.noise)
        if kind == "in_place":
            ks.in_place[GRID, BLOCK](s.x, s.b, s.noise, s.counter, s.flag, s.stop, int(sticky), N)
        else:
            ks.fed[GRID, BLOCK](s.y, s.x, s.b, s.noise, s.counter, s.flag, s.stop, int(sticky), N)
    return s


def loop_of(s, steps, unroll=K):
    ping_pong = "copy" if s.kind == "copy" else "auto"
    feed = None if s.kind == "in_place" else {0: 0}
    outs = [s.x, s.noise] if s.kind == "in_place" else [s.y, s.noise]
    return jaxgraph.graphed_loop(s.g, steps, feed=feed, until=s.flag, unroll=unroll, inputs=[s.x, s.b],
                                 outputs=outs, ping_pong=ping_pong, preserve=[s.counter])


def model(s, x0, b, offset, r, stop_at):
    """numpy: the steps a launch runs (the stopping step or R) and the state then, with the same draws."""
    n = min(r, stop_at)
    twin, draw = jaxgraph.Generator(s.seed).set_offset(offset), jaxgraph.zeros(N)
    x, noise = x0.astype(np.float32).copy(), None
    for _ in range(n):
        twin.uniform(draw)
        noise = draw.numpy()
        x = np.float32(0.5) * x + b + noise
    return n, x, noise


def prepare(s, rng, stop_at):
    """Fresh x, poisoned outputs, counter 0, a stale flag, the threshold; returns (x0, generator offset)."""
    x0 = rng.standard_normal(N).astype(np.float32)
    s.x.copy_(x0)
    if s.kind != "in_place":
        s.y.fill_(np.float32(np.nan))
    noise0 = np.full(N, np.float32(-5.0), np.float32)  # what no draw gives: a run of 0 steps leaves it
    s.noise.copy_(noise0)
    s.counter.fill_(0)
    s.flag.fill_(1)  # stale: the loop clears it at launch
    s.stop.copy_(np.array([stop_at], np.int32))
    offset = int(rng.integers(0, 1000))
    s.gen.set_offset(offset)
    return x0, offset, noise0


def check(s, x0, offset, noise0, r, stop_at, ran, y):
    """Everything a run of exactly the stopping step count leaves."""
    n, want, noise = model(s, x0, s.b.numpy(), offset, r, stop_at)
    where = dict(kind=s.kind, r=r, stop_at=stop_at, sticky=s.sticky)
    assert ran == n, dict(where, ran=ran)
    assert int(s.counter.numpy()[0]) == n, where          # preserve=[counter]
    assert s.gen.get_offset() == offset + n, where         # the generator's state
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5, err_msg=str(where))
    np.testing.assert_allclose(s.x.numpy(), want, rtol=1e-5, atol=1e-5, err_msg=str(where))  # both halves
    np.testing.assert_array_equal(s.noise.numpy(), noise0 if n == 0 else noise, err_msg=str(where))
    flag = int(s.flag.numpy()[0])
    assert flag == (1 if n == stop_at else 0), dict(where, flag=flag)  # the flag as the last step left it


@pytest.mark.gpu
@pytest.mark.parametrize("r", [0, 1, 7, 100])
@pytest.mark.parametrize("kind", ["twin", "copy", "in_place"])
def test_stop_at_every_position_of_a_trip(k, rng, kind, r):
    s = make(k, rng, kind)
    loop = loop_of(s, r)
    assert loop.stop == "exact" and loop.check_every is None and loop.unroll == K
    assert loop.ping_pong == {"twin": "swap", "copy": "copy: asked for (ping_pong='copy')", "in_place": "none"}[kind]
    # x, b, y (or x once), noise, flag, the generator's state, the counter
    assert loop.snapshot_bytes >= (3 if kind == "in_place" else 4) * 4 * N
    for stop_at in stops_for(r):
        x0, offset, noise0 = prepare(s, rng, stop_at)
        loop.steps_run.fill_(-7)
        loop.replay()
        check(s, x0, offset, noise0, r, stop_at, int(loop.steps_run.numpy()[0]), s.y.numpy())


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["twin", "in_place"])
def test_a_flag_that_later_steps_clear_still_stops(k, rng, kind):
    """The watch after each step sees the flag the step set, even when the steps run past it clear it."""
    s = make(k, rng, kind, sticky=False)
    loop = loop_of(s, 100)
    for stop_at in (1, 3, K, K + 2, 97, 100, NEVER):
        x0, offset, noise0 = prepare(s, rng, stop_at)
        loop.replay()
        check(s, x0, offset, noise0, 100, stop_at, int(loop.steps_run.numpy()[0]), s.y.numpy())


@pytest.mark.gpu
def test_r_read_on_the_device_and_default_unroll(k, rng):
    s = make(k, rng, "twin")
    loop = loop_of(s, None, unroll=None)
    assert loop.unroll == min(_graphed_loops._EXACT_MAX_UNROLL, jaxgraph.default_unroll(3))
    for r in (0, 5, 16, 17, 40, 100):
        stop_at = int(rng.integers(1, r + 3))
        x0, offset, noise0 = prepare(s, rng, stop_at)
        loop.replay(steps=r)
        check(s, x0, offset, noise0, r, stop_at, int(loop.steps_run.numpy()[0]), s.y.numpy())


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [True, False], ids=["programmatic_watch", "plain_watch"])
def test_one_kernel_step_with_and_without_programmatic_watch(k, rng, pdl):
    """A one-kernel step (the benchmark's shape) is added as its kernel node and its watch launched
    through a programmatic edge on sm_90+; both layouts stop exactly."""
    x, b, y = (jaxgraph.asarray(rng.standard_normal(N).astype(np.float32)) for _ in range(3))
    counter, flag = jaxgraph.zeros(1, np.int32), jaxgraph.zeros(1, np.int32)
    stop = jaxgraph.asarray(np.array([NEVER], np.int32))
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.one[GRID, BLOCK](y, x, b, counter, flag, stop, N)
    for r in (7, 100):
        with diagnostics.loop_settings(pdl_watch=pdl):  # the layout is chosen where the loop is built
            loop = jaxgraph.graphed_loop(g, r, feed={0: 0}, until=flag, inputs=[x, b], outputs=[y],
                                         preserve=[counter])
        assert loop.unroll == _graphed_loops._EXACT_MAX_UNROLL
        assert diagnostics.describe_loop(loop).programmatic_check == (pdl and _driver.compute_capability() >= (9, 0))
        for stop_at in (1, 8, 16, 17, 96, 97, 99, NEVER):
            x0 = rng.standard_normal(N).astype(np.float32)
            x.copy_(x0)
            y.fill_(np.float32(np.nan))
            counter.fill_(0)
            stop.copy_(np.array([stop_at], np.int32))
            loop.replay()
            n = min(r, stop_at)
            assert (int(loop.steps_run.numpy()[0]), int(counter.numpy()[0])) == (n, n), (r, stop_at)
            want = ref(x0, b.numpy(), n)
            np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(x.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_jit_in_process_defaults(k, rng):
    check_jit(k, rng)


def check_jit(ks, rng):
    """Inside jax.jit: (outputs, steps_run), static arrays, generator and counter, fixed R and R per call."""
    import jax
    import jax.numpy as jnp

    for kind in ("twin", "in_place"):
        s = make(ks, rng, kind)
        fixed, per_call = loop_of(s, 100), loop_of(s, None)
        f_fixed = jax.jit(lambda x, b: fixed(x, b))
        f_call = jax.jit(lambda x, b, n: per_call(x, b, steps=n))
        for i, stop_at in enumerate((1, K, K + 1, 50, 98, NEVER)):
            r = 100 if i % 2 == 0 else (0, 1, 7, 100)[i // 2 % 4]
            x0, offset, noise0 = prepare(s, rng, stop_at)
            jaxgraph.synchronize()  # the writes run on jaxgraph's stream, the loop on XLA's
            x0_j = jnp.asarray(x0)
            (y, noise), ran = f_fixed(x0_j, s.b.numpy()) if i % 2 == 0 else f_call(x0_j, s.b.numpy(), jnp.int32(r))
            y, ran = np.asarray(y), int(np.asarray(ran)[0])
            n, want, drawn = model(s, x0, s.b.numpy(), offset, r, stop_at)
            where = dict(kind=kind, r=r, stop_at=stop_at)
            assert ran == n and int(s.counter.numpy()[0]) == n and s.gen.get_offset() == offset + n, \
                dict(where, ran=ran)
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5, err_msg=str(where))
            np.testing.assert_array_equal(np.asarray(noise), noise0 if n == 0 else drawn, err_msg=str(where))


@pytest.mark.gpu
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_jit_every_xla_setting(setting):
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env.pop("XLA_FLAGS", None)
    if SETTINGS[setting] is not None:
        env["XLA_FLAGS"] = SETTINGS[setting]
    here = os.path.dirname(os.path.abspath(__file__))
    worker = ("import sys, numpy as np\nsys.path[:0] = sys.argv[1:]\nimport test_loop_exact_stop as t\n"
              "t.check_jit(t.kernels(), np.random.default_rng())\nprint('JIT OK')\n")
    proc = subprocess.run([sys.executable, "-c", worker, here, os.path.dirname(here)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "JIT OK" in proc.stdout, proc.stdout + proc.stderr[-4000:]


# ----------------------------------------------------------------------------
# CPU: what builds without a device
# ----------------------------------------------------------------------------


def test_watch_kernels_compile_through_nvrtc_without_a_device():
    ks = _loop_build.control_kernels(arch="sm_90")
    for name in ("jaxgraph_loop_spec_init", "jaxgraph_loop_watch", "jaxgraph_loop_spec_tail",
                 "jaxgraph_loop_restore"):
        assert name in _loop_build._KERNEL_NAMES and len(ks[name].cubin) > 0
    # sm_80 has no griddepcontrol: the watch compiles without its wait there.
    assert len(_loop_build.control_kernels(arch="sm_80")["jaxgraph_loop_watch"].cubin) > 0


def test_stops_cover_every_position_of_a_trip():
    assert stops_for(100) == [1, 4, 8, 9, 16, 96, 97, 99, 100, NEVER]
    assert stops_for(7) == [1, 4, 6, 7, 8, 9, 16, NEVER]
    assert stops_for(0) == [1, 4, 8, 9, 16, NEVER]


class FakeArray:
    """What _snapshotted reads of an array: its address and size."""

    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes = ptr, nbytes


def test_snapshot_holds_statics_flag_generators_and_preserve_once(monkeypatch):
    monkeypatch.setattr(_graphed_loops, "asarray", lambda a: a)
    x, y, b, flag, extra = (FakeArray(p, n) for p, n in ((100, 40), (200, 40), (300, 8), (400, 4), (500, 12)))
    gen = types.SimpleNamespace(state=FakeArray(600, 16))
    graph = types.SimpleNamespace(_generators=[gen])
    got = _graphed_loops._snapshotted(graph, (x, b), (y, x, FakeArray(700, 0)), flag, (extra, flag))
    assert [a.ptr for a in got] == [100, 300, 200, 400, 600, 500]  # each once, empty arrays left out


def test_preserve_is_checked_before_device_work(monkeypatch):
    with pytest.raises(TypeError, match=r"preserve\[0\] must be a device array .*got ndarray"):
        _graphed_loops._check_preserve([np.zeros(3)], speculative=True)
    with pytest.raises(TypeError, match="preserve must be a list of device arrays, got int"):
        _graphed_loops._check_preserve(3, speculative=True)
    assert _graphed_loops._check_preserve((), speculative=False) == ()
    monkeypatch.setattr(_graphed_loops, "device_arrays", lambda arrays, what: tuple(arrays))
    with pytest.raises(ValueError, match="preserve= is for the default exact stop"):
        _graphed_loops._check_preserve([FakeArray(8, 4)], speculative=False)
    g = jaxgraph.CUDAGraph()
    with pytest.raises(ValueError, match="preserve= is for the default exact stop"):
        jaxgraph.graphed_loop(g, 10, preserve=[FakeArray(8, 4)])  # no until: nothing runs past a flag


def test_odd_unroll_with_feed_is_refused_for_the_exact_stop_before_device_work(monkeypatch):
    with pytest.raises(ValueError, match="unroll must be even with feed= \\(got 5\\)"):
        _graphed_loops._check_unroll(5, True)
    assert _graphed_loops._check_unroll(5, False) == 5


# ---------------------------------------------------------------------------
# Memory a step writes outside the snapshot: named in a warning (CPU, stand-ins)
# ---------------------------------------------------------------------------


def _stand_in_array(ptr, nbytes, owner=None):
    import types

    return types.SimpleNamespace(ptr=ptr, nbytes=nbytes, owner=owner if owner is not None else object(),
                                 shape=(nbytes // 4,), dtype=np.dtype(np.int32))


def test_a_capture_records_the_external_memory_its_kernels_may_write():
    from jaxgraph._cuda.capture_registry import Capture

    stream = type("Stream", (), {"__int__": lambda self: 7, "device": 0})()
    capture = Capture(stream, None, "global", False)
    counter, x, y = _stand_in_array(0x1000, 4), _stand_in_array(0x2000, 64), _stand_in_array(0x3000, 64)
    capture.note("counter", "kernel step", counter, written=True)
    capture.note("x", "kernel step", x)                      # only read
    capture.note("y", "kernel step", y, written=True)
    capture.note("y", "kernel other", y, written=True)       # the same memory once
    assert [(ptr, n, label) for ptr, n, label, where, what in capture.settle().written] == [
        (0x1000, 4, "counter"), (0x3000, 64, "y")]


def test_the_exact_stop_warns_of_written_memory_it_does_not_snapshot():
    import types
    import warnings

    from jaxgraph._cuda.capture_registry import CaptureInputs
    from jaxgraph._jax_interop import graphed_loops

    written = ((0x1000, 4, "counter", "kernel step", "DeviceArray shape (1,) int32 at 0x1000"),
               (0x3010, 16, "y", "kernel step", "DeviceArray shape (4,) float32 at 0x3010"))
    graph = types.SimpleNamespace(_handles=types.SimpleNamespace(inputs=CaptureInputs(written=written)))
    y = _stand_in_array(0x3000, 64)  # a static output holding the second range
    with pytest.warns(UserWarning, match=r"argument 'counter' of kernel step \(DeviceArray shape \(1,\) int32 "
                                         r"at 0x1000\)\. With the default exact stop, up to 7 steps past"):
        graphed_loops._warn_unpreserved(graph, (y,), 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graphed_loops._warn_unpreserved(graph, (y, _stand_in_array(0x1000, 4)), 8)  # preserved: quiet
        graphed_loops._warn_unpreserved(graph, (y,), 1)  # a trip of one step: nothing runs past the flag
