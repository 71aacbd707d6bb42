"""Captures that fork onto other streams, and arrays used on several streams (GPU).

A stream that waits on work of a capture (``s2.wait_stream(s1)``) joins it:
its work is recorded into the same graph, and jaxgraph treats it as it treats
the capture stream (inputs kept alive or watched, allocations from the graph's
pool). Every replay runs on fresh random data with outputs poisoned first.

A view over memory only the graph still holds, and pool accounting of forked streams, through
``jaxgraph.diagnostics`` (``device_array_at``, ``memory_pool``, ``captures_underway``).
"""

import gc
import weakref

import numpy as np
import pytest

import jaxgraph
from jaxgraph import diagnostics
from support.graph_helpers import (BLOCK, MiB, N, blocks, driver_call, free_device_bytes, load_kernels, random_floats,
                           replay_and_check)
from support.kernel_sources import SPIN_COPY

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def k():
    return load_kernels()


@pytest.fixture
def s2():
    s = jaxgraph.Stream()
    yield s
    s.close()


def _view(allocation, n=N):
    """A new array over memory only the graph still holds (it keeps the allocation alive too)."""
    return diagnostics.device_array_at(allocation.ptr, (n,), np.float32, device=allocation.device, owner=allocation)


def _capturing(stream) -> bool:
    from cuda.bindings import driver

    (status,) = driver_call("cuStreamIsCapturing", stream.handle)
    return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def test_input_read_only_on_a_forked_stream_is_kept_alive(k, rng, s2):
    x = jaxgraph.asarray(random_floats(rng))
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        s1 = jaxgraph.current_stream()
        s2.wait_stream(s1)                        # fork: s2 joins the capture
        with s2:
            k.scale[blocks(N), BLOCK](y, x, 2.0, N)   # the only use of x
        s1.wait_stream(s2)                        # join
    held = weakref.ref(x.owner)
    del x
    gc.collect()
    assert held() is not None, "the graph must keep an input used only on the forked stream"
    x_again = _view(held())
    for _ in range(3):
        data = random_floats(rng)
        x_again.copy_(data)
        replay_and_check(g, y, 2.0 * data)


def test_check_input_liveness_names_a_freed_input_of_the_forked_stream(k, rng, s2, side_stream):
    x = jaxgraph.asarray(random_floats(rng))
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with side_stream:
        g.capture_begin(check_input_liveness=True)
        s2.wait_stream(side_stream)
        with s2:
            k.scale[blocks(N), BLOCK](y, x, 2.0, N)
        side_stream.wait_stream(s2)
        g.capture_end()
    data = random_floats(rng)
    x.copy_(data)
    replay_and_check(g, y, 2.0 * data)           # alive: replays
    del x
    gc.collect()
    with pytest.raises(RuntimeError, match=r"input 'x' \(DeviceArray shape \(4096,\) float32 .*used by kernel scale"):
        g.replay()


def test_allocations_on_a_forked_stream_come_from_the_graph_pool(k, rng, s2):
    m = 8 * MiB                                   # 32 MiB per array: far above allocator noise
    x = jaxgraph.asarray(random_floats(rng, m))
    gc.collect()
    base = free_device_bytes()
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        s1 = jaxgraph.current_stream()
        s2.wait_stream(s1)
        with s2:
            tmp = jaxgraph.empty(m)               # allocated on the forked stream
            k.scale[blocks(m), BLOCK](tmp, x, 3.0, m)
        out = jaxgraph.empty(m, stream=s2)        # an explicit stream= of the capture too
        with s2:
            k.add[blocks(m), BLOCK](out, tmp, x, m)
        s1.wait_stream(s2)
    pool = diagnostics.memory_pool(g.pool())
    assert tmp.owner.pool is pool and out.owner.pool is pool
    data = random_floats(rng, m)
    x.copy_(data)
    replay_and_check(g, out, 4.0 * data)
    del tmp, out, pool
    g.reset()
    gc.collect()
    assert free_device_bytes() >= base - 8 * MiB  # the pool's memory went back


def test_unjoined_fork_is_a_clear_error_and_leaves_nothing_capturing(k, rng, s2):
    x, y = jaxgraph.asarray(random_floats(rng)), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with pytest.raises(RuntimeError, match="was not joined back .*wait_stream"):
        with jaxgraph.graph(g):
            s1 = jaxgraph.current_stream()
            s2.wait_stream(s1)
            with s2:
                k.scale[blocks(N), BLOCK](y, x, 2.0, N)
                tmp = jaxgraph.empty(N)           # from the pool of the failed capture
            # no s1.wait_stream(s2): the fork is left open
    assert not diagnostics.captures_underway()
    assert not _capturing(s1) and not _capturing(s2)
    del tmp
    gc.collect()
    # The same graph and thread capture again, and the streams work.
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](y, x, 3.0, N)
    data = random_floats(rng)
    x.copy_(data)
    replay_and_check(g, y, 3.0 * data)
    k.scale[blocks(N), BLOCK, 0, s2](y, x, 4.0, N)
    s2.synchronize()
    np.testing.assert_allclose(y.numpy(), 4.0 * data, rtol=1e-6)


def test_three_streams_nested_forks(k, rng, s2):
    s3 = jaxgraph.Stream()
    x = jaxgraph.asarray(random_floats(rng))
    a, b, c = (jaxgraph.empty(N) for _ in range(3))
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        s1 = jaxgraph.current_stream()
        s2.wait_stream(s1)
        with s2:
            k.scale[blocks(N), BLOCK](a, x, 2.0, N)     # a = 2x        (s2)
            s3.wait_stream(s2)                          # nested fork from s2
            with s3:
                k.scale[blocks(N), BLOCK](b, x, 3.0, N)  # b = 3x   (s3)
                k.add[blocks(N), BLOCK](b, b, a, N)      # b = 5x   (s3, after a)
            s2.wait_stream(s3)
            k.add[blocks(N), BLOCK](c, b, a, N)          # c = 7x       (s2, after b)
        s1.wait_stream(s2)
        k.axpb[blocks(N), BLOCK](c, c, 1.0, 1.0, N)      # c = 7x + 1   (s1, after join)
    held = weakref.ref(x.owner)
    del x
    gc.collect()
    x_again = _view(held())
    for _ in range(2):
        data = random_floats(rng)
        x_again.copy_(data)
        replay_and_check(g, [a, b, c], [2.0 * data, 5.0 * data, 7.0 * data + 1.0], rtol=1e-5, atol=1e-5)
    s3.close()


def test_record_stream_holds_the_memory_until_the_other_stream_is_done(rng):
    spin = jaxgraph.Kernel(SPIN_COPY, "spin_copy")
    spin.handle  # noqa: B018 - load now, outside the timed race
    cycles = 200_000_000                         # ~0.1 s: the reader is still spinning when we free
    producer, reader = jaxgraph.Stream(), jaxgraph.Stream()
    results = {}
    for use_record_stream in (False, True):
        data = random_floats(rng)
        with producer:
            a = jaxgraph.asarray(data)           # allocated in producer's order
        out = jaxgraph.empty(N, stream=reader)
        reader.wait_stream(producer)
        spin[blocks(N), BLOCK, 0, reader](out, a, cycles, N)   # reads a after spinning
        if use_record_stream:
            a.record_stream(reader)
        a_ptr = a.ptr
        del a                                    # freed in producer's order
        with producer:
            b = jaxgraph.empty(N)                # may reuse a's block at once
            b.fill_(np.float32(-7.0))
        reader.synchronize()
        producer.synchronize()
        results[use_record_stream] = (b.ptr == a_ptr, out.numpy(), data)
        del b, out
    reused, got, data = results[True]
    np.testing.assert_array_equal(got, data)     # the reader saw a's values, never b's
    reused, got, data = results[False]
    if reused:                                   # the race record_stream prevents, made visible
        assert (got == -7.0).any(), "without record_stream the reader should see the reused block"
    producer.close()
    reader.close()


def test_record_stream_rejects_foreign_memory_and_non_streams(rng):
    a = jaxgraph.asarray(random_floats(rng))
    with pytest.raises(TypeError, match="record_stream expects a jaxgraph.Stream, got int"):
        a.record_stream(0)
    cupy = pytest.importorskip("cupy")
    foreign = jaxgraph.asarray(cupy.zeros(4, dtype=cupy.float32))
    with pytest.raises(ValueError, match="applies to memory jaxgraph allocated"):
        foreign.record_stream(jaxgraph.current_stream())


def test_graph_stream_of_another_device_captures_there(k, rng):
    if jaxgraph.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    jaxgraph.set_device(1)
    try:
        s = jaxgraph.Stream()
        x, y = jaxgraph.asarray(random_floats(rng)), jaxgraph.empty(N)
    finally:
        jaxgraph.set_device(0)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g, stream=s):
        assert jaxgraph.current_device() == 1
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
    assert jaxgraph.current_device() == 0 and g.device == 1
    data = random_floats(rng)
    x.copy_(data)
    jaxgraph.set_device(1)
    try:
        replay_and_check(g, y, 2.0 * data)
    finally:
        jaxgraph.set_device(0)
