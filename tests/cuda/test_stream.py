"""Streams and events: ordering, the current stream, external handles."""

import threading

import numpy as np
import pytest

import jaxgraph
from support.kernel_sources import ADD_ONE, DELAYED_WRITE


def test_stream_context_rejects_non_streams():
    with pytest.raises(TypeError, match="jaxgraph.Stream or None"):
        jaxgraph.stream("not a stream")
    with jaxgraph.stream(None) as s:  # None is a no-op, as in torch
        assert s is None


@pytest.mark.gpu
def test_current_stream_context_and_threads(side_stream):
    default = jaxgraph.current_stream()
    assert default.is_legacy_default
    with jaxgraph.stream(side_stream):
        assert jaxgraph.current_stream() == side_stream
        seen = []
        t = threading.Thread(target=lambda: seen.append(jaxgraph.current_stream()))
        t.start(), t.join()
        assert seen[0].is_legacy_default  # thread-local
    assert jaxgraph.current_stream() == default
    with side_stream:  # a Stream is a context manager too
        assert jaxgraph.current_stream() == side_stream
    assert jaxgraph.current_stream() == default


@pytest.mark.gpu
def test_restored_when_body_raises(side_stream):
    with pytest.raises(KeyError):
        with jaxgraph.stream(side_stream):
            raise KeyError("boom")
    assert jaxgraph.current_stream().is_legacy_default


@pytest.mark.gpu
def test_work_on_one_stream_is_ordered(rng):
    """A slow kernel then a dependent one on the same stream: the second sees the first's result."""
    slow = jaxgraph.Kernel(DELAYED_WRITE, "delayed_write")
    add = jaxgraph.Kernel(ADD_ONE, "add_one")
    s = jaxgraph.Stream()
    value = float(rng.standard_normal())
    buf = jaxgraph.asarray(np.full(32, np.nan, np.float32))
    out = jaxgraph.asarray(np.full(32, np.nan, np.float32))
    with s:
        slow[1, 32](buf, value, 50_000_000)
        add[1, 32](out, buf, 32)
    s.synchronize()
    np.testing.assert_array_equal(out.numpy(), np.float32(value) + 1)


@pytest.mark.gpu
def test_wait_stream_orders_two_streams(rng):
    slow = jaxgraph.Kernel(DELAYED_WRITE, "delayed_write")
    add = jaxgraph.Kernel(ADD_ONE, "add_one")
    producer, consumer = jaxgraph.Stream(), jaxgraph.Stream()
    value = float(rng.standard_normal())
    buf = jaxgraph.asarray(np.full(32, np.nan, np.float32))
    out = jaxgraph.asarray(np.full(32, np.nan, np.float32))
    slow.handle, add.handle  # load both modules now: a first launch's module load may block
    jaxgraph.synchronize()
    slow[1, 32, 0, producer](buf, value, 200_000_000)
    consumer.wait_stream(producer)
    add[1, 32, 0, consumer](out, buf, 32)
    assert not producer.query()  # the slow kernel is still running: the wait did not block the host
    consumer.synchronize()
    np.testing.assert_array_equal(out.numpy(), np.float32(value) + 1)


@pytest.mark.gpu
def test_external_handles_and_events():
    torch = pytest.importorskip("torch")
    ts = torch.cuda.Stream()
    wrapped = jaxgraph.Stream.from_handle(ts.cuda_stream, owner=ts)
    assert int(wrapped) == ts.cuda_stream and not wrapped.is_legacy_default
    start, end = jaxgraph.Event(enable_timing=True), jaxgraph.Event(enable_timing=True)
    slow = jaxgraph.Kernel(DELAYED_WRITE, "delayed_write")
    buf = jaxgraph.empty(32)
    start.record(wrapped)
    slow[1, 32, 0, wrapped](buf, 1.0, 1_000_000)
    end.record(wrapped)
    end.synchronize()
    assert start.elapsed_time(end) > 0
    ts.synchronize()
    wrapped.close()
    wrapped.close()  # idempotent, and the torch stream survives
    ts.synchronize()
    jaxgraph.synchronize()
