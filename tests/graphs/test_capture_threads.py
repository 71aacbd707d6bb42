"""Several threads capturing at once, each into its own graph (``capture_error_mode="thread_local"``).

Each thread gets its own side stream from :class:`jaxgraph.graph` (one stream
cannot capture into two graphs), and ``with s:`` restores each thread's own
previous stream even when two threads enter the same stream object. A thread
entering ``graph()`` while another thread's capture is underway on the device
does not synchronize the device (CUDA would invalidate that capture): it waits
for its own current stream only.

The CPU tests check that bookkeeping with made-up streams and the driver stood
in for; the GPU test runs two threads whose capture bodies meet at a barrier
(both captures open at once) and replays both graphs against numpy.

Tests internals (listed in tests/README.md): ``Stream._setup``, ``_cuda.stream._local`` (a thread's
current streams), ``_cuda.stream.synchronize`` (recorded), ``_cuda.capture_registry._by_stream`` (a capture
faked), ``_graphs.capture_contexts._side_stream``, ``quiet``, ``Stream`` (a stand-in), ``_ThreadSideStreams`` and
``_idle_side_streams``; which stream a thread restores or captures on, and what entry synchronizes,
have no public face without a GPU.
"""

import gc
import itertools
import threading
import time

import numpy as np
import pytest

import jaxgraph
from jaxgraph._cuda import capture_registry as _captures
from jaxgraph._cuda import stream as _stream
from jaxgraph._cuda.stream import Stream
from jaxgraph._graphs import capture_contexts as _capture
from support.graph_helpers import BLOCK, N, blocks, load_kernels, random_floats

TIMEOUT = 60  # seconds a thread waits for the other at a barrier before the test fails


def fake_stream(handle, device=0):
    s = Stream.__new__(Stream)
    s._setup(handle, device, None, False)
    return s


def run_threads(*targets):
    """Run each target in its own thread; re-raise the first exception any raised."""
    errors = []

    def guarded(target):
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]


# ---------------------------------------------------------------------------
# CPU: the per-thread bookkeeping (internal)
# ---------------------------------------------------------------------------


def test_threads_entering_one_stream_restore_their_own_previous_stream():
    s = fake_stream(0x5000)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    restored = {}

    def a():
        previous = _stream._local.streams[0] = fake_stream(0xA)  # this thread's current stream
        with s:
            a_in.set()
            assert b_in.wait(TIMEOUT)  # the other thread entered s too
            assert jaxgraph.current_stream(0) is s
        restored["a"] = (jaxgraph.current_stream(0), previous)
        a_out.set()

    def b():
        previous = _stream._local.streams[0] = fake_stream(0xB)
        assert a_in.wait(TIMEOUT)
        with s:
            b_in.set()
            assert a_out.wait(TIMEOUT)  # the other thread left s first
            with s:  # nested in one thread: its own stack
                assert jaxgraph.current_stream(0) is s
            assert jaxgraph.current_stream(0) is s
        restored["b"] = (jaxgraph.current_stream(0), previous)
        assert not getattr(_stream._local, "saved", None), "an empty stack left behind"

    run_threads(a, b)
    for thread, (now, previous) in restored.items():
        assert now is previous, f"thread {thread} got {now!r} back instead of its own {previous!r}"


def test_threads_entering_one_stream_context_restore_their_own_previous_stream():
    s = fake_stream(0x5002)
    context = jaxgraph.stream(s)  # one context object, entered by two threads
    entered, left = threading.Barrier(2, timeout=TIMEOUT), threading.Event()
    restored = {}

    def run(name, handle, first):
        def body():
            previous = _stream._local.streams[0] = fake_stream(handle)
            with context:
                entered.wait()  # both threads inside
                if not first:
                    assert left.wait(TIMEOUT)  # the other thread left first
            if first:
                left.set()
            restored[name] = (jaxgraph.current_stream(0), previous)
        return body

    run_threads(run("a", 0xA, True), run("b", 0xB, False))
    for thread, (now, previous) in restored.items():
        assert now is previous, f"thread {thread} got {now!r} back instead of its own {previous!r}"


def test_exiting_a_stream_not_entered_in_this_thread_says_so(monkeypatch):
    s = fake_stream(0x5001)
    monkeypatch.setattr(_stream._local, "streams", {0: fake_stream(0xC)})
    with pytest.raises(RuntimeError, match=r"__exit__ without a matching __enter__ in this thread"):
        s.__exit__(None, None, None)


@pytest.fixture
def side_streams(monkeypatch):
    """Side streams made as stand-ins (their handles counted), with no thread's side streams yet."""
    handles = itertools.count(0x100)
    made = []
    monkeypatch.setattr(_capture, "Stream", lambda device: made.append(fake_stream(next(handles), device)) or made[-1])
    monkeypatch.setattr(_capture, "_thread_side_streams", _capture._ThreadSideStreams())
    monkeypatch.setattr(_capture, "_idle_side_streams", {})
    return made


def idle(device=0):
    """The side streams waiting for a thread, once the ended threads have given theirs back."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(_capture._idle_side_streams.get(device, [])) < 2:
        gc.collect()
        time.sleep(0.01)
    return list(_capture._idle_side_streams.get(device, []))


def test_each_thread_gets_its_own_side_stream_and_ended_threads_lend_theirs(side_streams, monkeypatch):
    both = threading.Barrier(2, timeout=TIMEOUT)
    got = {}

    def take(name):
        def run():
            first, other = _capture._side_stream(0), _capture._side_stream(1)
            both.wait()  # both threads hold theirs at once
            got[name] = (first, _capture._side_stream(0), other)
        return run

    run_threads(take("a"), take("b"))
    (a0, a0_again, a1), (b0, b0_again, b1) = got["a"], got["b"]
    assert a0 is a0_again and b0 is b0_again, "a thread's side stream changed"
    assert a0 is not b0 and a1 is not b1, "two threads share a side stream"
    assert (a0.device, a1.device) == (0, 1)
    assert len(side_streams) == 4
    assert {id(s) for s in idle(0)} == {id(a0), id(b0)}  # the ended threads gave theirs back
    later = {}
    run_threads(lambda: later.setdefault("c", _capture._side_stream(0)))
    assert later["c"] in (a0, b0) and len(side_streams) == 4  # reused, none made
    # A stream still capturing (its thread ended mid-capture) is never handed out again.
    for s in idle(0):
        monkeypatch.setitem(_captures._by_stream, (int(s), 0), object())
    run_threads(lambda: later.setdefault("d", _capture._side_stream(0)))
    assert later["d"] not in (a0, b0) and len(side_streams) == 5


class Recorded:
    """A stream stand-in that records what entry asks of it."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def wait_stream(self, other):
        self.calls.append(f"{self.name} waits for {other.name}")

    def synchronize(self):
        self.calls.append(f"{self.name} synchronized")


def test_entry_synchronizes_the_device_only_while_no_capture_is_underway_there(monkeypatch):
    calls = []
    monkeypatch.setattr(_stream, "synchronize", lambda device: calls.append(f"device {device} synchronized"))
    monkeypatch.setattr(_stream._local, "streams", {0: Recorded("current", calls)})
    side = Recorded("side", calls)
    _capture.quiet(0, side)
    assert calls == ["device 0 synchronized", "side waits for current"]
    calls.clear()
    monkeypatch.setitem(_captures._by_stream, (0xABC, 1), object())  # a capture on another device
    _capture.quiet(0, side)
    assert calls == ["device 0 synchronized", "side waits for current"]
    calls.clear()
    monkeypatch.setitem(_captures._by_stream, (0xDEF, 0), object())  # another thread's capture on this device
    _capture.quiet(0, side)
    assert calls == ["side waits for current", "side synchronized"], "a device-wide synchronize would invalidate it"


# ---------------------------------------------------------------------------
# GPU: two threads capturing at once
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k():
    return load_kernels()


@pytest.mark.gpu
def test_two_threads_capture_at_once_with_both_captures_open(k, rng):
    x, y, z = ([jaxgraph.empty(N) for _ in range(2)] for _ in range(3))
    scales = (2.0, -3.0)
    for i in range(2):  # warm: each launch configuration checked before the captures
        k.scale[blocks(N), BLOCK](y[i], x[i], scales[i], N)
        k.add[blocks(N), BLOCK](z[i], y[i], x[i], N)
    jaxgraph.synchronize()
    both = threading.Barrier(2, timeout=TIMEOUT)
    captured = {}

    def capture(i):
        def run():
            g = jaxgraph.CUDAGraph()
            try:
                with jaxgraph.graph(g, capture_error_mode="thread_local"):
                    stream = jaxgraph.current_stream()
                    k.scale[blocks(N), BLOCK](y[i], x[i], scales[i], N)
                    both.wait()  # both captures are open now
                    assert jaxgraph.is_current_stream_capturing()
                    k.add[blocks(N), BLOCK](z[i], y[i], x[i], N)
                    both.wait()  # and both bodies have queued all their work
            except BaseException:
                both.abort()  # the other thread fails at its barrier instead of hanging
                raise
            captured[i] = (g, stream, jaxgraph.current_stream())
        return run

    run_threads(capture(0), capture(1))
    (g0, s0, after0), (g1, s1, after1) = captured[0], captured[1]
    assert s0 != s1, "the two threads captured on one stream"
    assert not s0.is_legacy_default and after0 != s0 and after1 != s1
    assert not jaxgraph.is_current_stream_capturing() and gc.isenabled()
    for _ in range(3):
        for i, g in enumerate((g0, g1)):
            data = random_floats(rng)
            x[i].copy_(data)
            y[i].fill_(np.float32(np.nan))
            z[i].fill_(np.float32(np.nan))
            g.replay()
            jaxgraph.synchronize()
            want = np.float32(scales[i]) * data
            np.testing.assert_allclose(y[i].numpy(), want, rtol=1e-6)
            np.testing.assert_allclose(z[i].numpy(), want + data, rtol=1e-6, atol=1e-6)
