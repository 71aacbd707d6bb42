"""Device arrays: allocation, host copies, and zero-copy exchange with JAX, CuPy and torch.

Tests internals (listed in tests/README.md): ``_cuda.memory.hold_frees``, ``when_no_capture``,
``release_frees``; frees deferred while captures are underway.
"""

import gc

import numpy as np
import pytest

import jaxgraph

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_]


def test_direct_construction_names_the_factories():
    with pytest.raises(RuntimeError, match="jaxgraph.empty, zeros or asarray"):
        jaxgraph.DeviceArray(0, (1,), np.dtype("f4"), 0, None)


def test_bad_shapes_and_dtypes_fail_before_the_driver():
    with pytest.raises(ValueError, match="non-negative"):
        jaxgraph.empty((2, -1))
    with pytest.raises(TypeError, match="shape must be"):
        jaxgraph.empty("12")
    with pytest.raises(TypeError, match="cannot live in device memory"):
        jaxgraph.empty(3, object)


def test_cpu_jax_array_is_not_device_memory():
    import jax.numpy as jnp
    import jax

    x = jax.device_put(jnp.ones(3), jax.devices("cpu")[0])
    with pytest.raises(TypeError, match="jax.Array on the CPU"):
        jaxgraph.asarray(x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_host_round_trip(rng, dtype):
    host = (rng.standard_normal((33, 7)) * 100).astype(dtype)
    dev = jaxgraph.asarray(host)
    assert dev.shape == (33, 7) and dev.dtype == np.dtype(dtype) and dev.nbytes == host.nbytes
    np.testing.assert_array_equal(dev.numpy(), host)
    np.testing.assert_array_equal(jaxgraph.to_host(dev), host)
    np.testing.assert_array_equal(jaxgraph.zeros(5, dtype).numpy(), np.zeros(5, dtype))


@pytest.mark.gpu
def test_fill_reshape_copy(rng):
    a = jaxgraph.empty((4, 6), np.float32).fill_(2.5)
    np.testing.assert_array_equal(a.numpy(), np.full((4, 6), 2.5, np.float32))
    b = a.reshape(24)
    assert b.ptr == a.ptr and b.owner is a.owner
    src = rng.standard_normal(24).astype(np.float32)
    c = jaxgraph.asarray(src)
    b.copy_(c)
    np.testing.assert_array_equal(a.numpy().ravel(), src)
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(5)


@pytest.mark.gpu
def test_jax_round_trip_is_zero_copy(rng):
    import jax

    host = rng.standard_normal(4096).astype(np.float32)
    x = jax.device_put(host, jax.devices("gpu")[0])
    wrapped = jaxgraph.asarray(x)
    assert wrapped.ptr == x.unsafe_buffer_pointer()
    assert wrapped.owner is x
    back = jax.dlpack.from_dlpack(wrapped)
    assert back.unsafe_buffer_pointer() == wrapped.ptr
    np.testing.assert_array_equal(np.asarray(back), host)
    ours = jaxgraph.asarray(host)
    as_jax = ours.to_jax()
    assert as_jax.unsafe_buffer_pointer() == ours.ptr
    np.testing.assert_array_equal(np.asarray(as_jax), host)


@pytest.mark.gpu
def test_wrapped_jax_array_stays_alive(rng):
    import jax

    host = rng.standard_normal(1 << 16).astype(np.float32)
    x = jax.device_put(host, jax.devices("gpu")[0])
    wrapped = jaxgraph.asarray(x)
    del x
    gc.collect()
    _ = [jax.device_put(rng.standard_normal(1 << 16).astype(np.float32)) for _ in range(8)]
    np.testing.assert_array_equal(wrapped.numpy(), host)


@pytest.mark.gpu
def test_cupy_round_trip_is_zero_copy(rng):
    cupy = pytest.importorskip("cupy")
    host = rng.standard_normal(1000).astype(np.float32)
    c = cupy.asarray(host)
    wrapped = jaxgraph.asarray(c)
    assert wrapped.ptr == c.data.ptr
    np.testing.assert_array_equal(wrapped.numpy(), host)
    ours = jaxgraph.asarray(host)
    view = cupy.asarray(ours)
    assert view.data.ptr == ours.ptr
    np.testing.assert_array_equal(cupy.asnumpy(view), host)
    via_dlpack = cupy.from_dlpack(ours)
    assert via_dlpack.data.ptr == ours.ptr


@pytest.mark.gpu
def test_torch_round_trip_is_zero_copy(rng):
    torch = pytest.importorskip("torch")
    host = rng.standard_normal((10, 10)).astype(np.float32)
    t = torch.as_tensor(host, device="cuda")
    wrapped = jaxgraph.asarray(t)
    assert wrapped.ptr == t.data_ptr()
    np.testing.assert_array_equal(wrapped.numpy(), host)
    ours = jaxgraph.asarray(host)
    via_cai = torch.as_tensor(ours, device="cuda")
    via_dlpack = torch.from_dlpack(ours)
    assert via_cai.data_ptr() == ours.ptr == via_dlpack.data_ptr()
    np.testing.assert_array_equal(via_dlpack.cpu().numpy(), host)
    with pytest.raises(ValueError, match="C-contiguous"):
        jaxgraph.asarray(t.t())


def test_releases_wait_for_the_last_capture_to_end():
    """A graph collected in the middle of another capture is released when the capture ends
    (destroying an executable then would invalidate the capture)."""
    from jaxgraph._cuda import memory as _memory

    calls = []
    _memory.hold_frees()  # two captures underway
    _memory.hold_frees()
    try:
        _memory.when_no_capture(lambda: calls.append("released"))
        assert calls == []
        _memory.release_frees()
        assert calls == []  # one capture still underway
    finally:
        _memory.release_frees()
    assert calls == ["released"]
    _memory.when_no_capture(lambda: calls.append("now"))
    assert calls == ["released", "now"]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_waits_for_the_last_capture_to_end(enabled):
    """No cyclic collection in the middle of a capture: it would run any library's finalizers
    (a module unloaded, a stream destroyed), which can invalidate the capture. The collector
    comes back as it was."""
    import gc

    from jaxgraph._cuda import memory as _memory

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        _memory.hold_frees()  # two captures underway
        _memory.hold_frees()
        try:
            assert not gc.isenabled()
            _memory.release_frees()
            assert not gc.isenabled()  # one capture still underway
        finally:
            _memory.release_frees()
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_jax_objects_are_told_from_jaxgraph_s_own():
    # jaxgraph's public types say module "jaxgraph", which starts with "jax": only jax, jax.* and jaxlib* are JAX's.
    import jax.numpy as jnp

    from jaxgraph._cuda.array import is_jax_object

    assert is_jax_object(jnp.zeros(3)) and is_jax_object(jax_tracer_stand_in())
    for module in ("jaxgraph", "jaxgraph._cuda.array", "jaxtyping"):
        assert not is_jax_object(type("Thing", (), {"__module__": module})()), module


def jax_tracer_stand_in():
    return type("Tracer", (), {"__module__": "jax._src.interpreters.partial_eval"})()
