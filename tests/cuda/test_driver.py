"""The CUDA layer and the native library: what works with and without a driver.

Tests internals (listed in tests/README.md): ``_cuda.driver``, ``_cuda.native`` (the FFI targets'
registration, the error for a missing extension), the extensions ``_launch`` and ``_replay``; the
checked driver layer and the native library, with and without a driver.
"""

import importlib
import pathlib

import numpy as np
import pytest

import jaxgraph
from jaxgraph._cuda import driver as _driver
from jaxgraph._cuda import native as _native
from conftest import HAS_GPU


def test_import_needs_no_device():
    assert jaxgraph.__version__
    assert isinstance(jaxgraph.device_count(), int)


@pytest.mark.parametrize("module", ["jaxgraph._launch", "jaxgraph._replay"])
def test_native_library_loads_and_registers_with_xla(module):
    """The extension loads without a driver (no link to libcuda) and XLA accepts its handlers."""
    import jax

    ext = importlib.import_module(module)
    registrations = ext.registrations()
    assert registrations, f"{module} exposes no FFI handler"
    for name, capsule in registrations.items():
        assert name.startswith("jaxgraph_")
        assert type(capsule).__name__ == "PyCapsule"
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")


def test_native_library_has_no_driver_dependency():
    """ldd must not list libcuda: the library has to load on CPU-only machines."""
    import shutil
    import subprocess

    import jaxgraph._launch as ext

    if shutil.which("ldd") is None:
        pytest.skip("ldd not available")
    out = subprocess.run(["ldd", ext.__file__], capture_output=True, text=True).stdout
    assert "libcuda.so" not in out and "libcudart.so" not in out, out


def test_ffi_targets_register_for_cuda_once():
    _native.register_ffi_targets()
    _native.register_ffi_targets()
    launch, replay = _native.native("launch"), _native.native("replay")
    assert set(launch.registrations()) == set(launch.cpu_registrations()) == {"jaxgraph_launch"}
    assert set(replay.registrations()) == set(replay.cpu_registrations()) == {"jaxgraph_replay",
                                                                            "jaxgraph_replay_uncaptured"}


def test_missing_extension_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"not built or does not load") as info:
        _native.native("no_such_extension")
    # The hint is the README's install step, word for word.
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    assert _native._INSTALL in str(info.value) and _native._INSTALL in readme


@pytest.mark.skipif(HAS_GPU, reason="CUDA is available here")
def test_unavailable_is_one_clear_error():
    with pytest.raises(jaxgraph.CudaUnavailableError, match="no CUDA (driver found|device)") as info:
        jaxgraph.empty(4)
    # One clear error, not a chain of driver-loader exceptions.
    assert info.value.__cause__ is None
    with pytest.raises(jaxgraph.CudaUnavailableError):
        jaxgraph.Stream()
    with pytest.raises(jaxgraph.CudaUnavailableError, match="arch="):
        jaxgraph.Kernel("__global__ void f(float* x) {}", "f")
    assert jaxgraph.device_count() == 0


@pytest.mark.parametrize("first, then", [
    # cuda-bindings 13.0-13.3: dlopen fails, and the next cuInit cannot be found.
    (RuntimeError("Failed to dlopen libcuda.so.1"), RuntimeError('Function "cuInit" not found')),
    # cuda-bindings >= 13.4: cuda.pathfinder's error, every time.
    (type("DynamicLibNotFoundError", (RuntimeError,), {})("libcuda"), None),
])
def test_missing_driver_is_unavailable_on_every_call(monkeypatch, first, then):
    """However cuda-bindings reports a missing libcuda, jaxgraph says so, on every call."""
    calls = []

    class FakeDriver:
        @staticmethod
        def cuInit(flags):
            calls.append(flags)
            raise first if len(calls) == 1 or then is None else then

    monkeypatch.setattr(_driver, "_driver_module", FakeDriver)
    monkeypatch.setattr(_driver, "_initialized", False)
    monkeypatch.setattr(_driver, "_no_driver", False)
    for _ in range(2):
        with pytest.raises(jaxgraph.CudaUnavailableError, match="no CUDA driver found") as info:
            _driver._init()
        assert info.value.__cause__ is None
    assert _driver.device_count() == 0
    assert calls == [0]  # remembered: the broken second cuInit is never made


def test_other_cuinit_failures_are_not_hidden(monkeypatch):
    class FakeDriver:
        @staticmethod
        def cuInit(flags):
            raise RuntimeError("something else")

    monkeypatch.setattr(_driver, "_driver_module", FakeDriver)
    monkeypatch.setattr(_driver, "_initialized", False)
    monkeypatch.setattr(_driver, "_no_driver", False)
    with pytest.raises(RuntimeError, match="something else"):
        _driver._init()


def test_check_raises_cuda_error_naming_call_and_result():
    from cuda.bindings import driver

    _driver.driver()
    assert _driver.check((driver.CUresult.CUDA_SUCCESS, 7), "cuFoo") == 7
    assert _driver.check((driver.CUresult.CUDA_SUCCESS,), "cuFoo") is None
    with pytest.raises(jaxgraph.CudaError, match="cuGraphLaunch failed with CUDA_ERROR_INVALID_VALUE") as info:
        _driver.check((driver.CUresult.CUDA_ERROR_INVALID_VALUE,), "cuGraphLaunch")
    assert info.value.call == "cuGraphLaunch"
    assert info.value.result == driver.CUresult.CUDA_ERROR_INVALID_VALUE


@pytest.mark.gpu
def test_primary_context_is_the_one_xla_uses():
    """Memory from XLA is addressable in our context: jax writes, we read the same pointer."""
    import jax
    import jax.numpy as jnp

    x = jax.device_put(jnp.arange(16, dtype=jnp.float32), jax.devices("gpu")[0])
    wrapped = jaxgraph.asarray(x)
    ctx = _driver.check(_driver.driver().cuCtxGetCurrent(), "cuCtxGetCurrent")
    dev = _driver.check(_driver.driver().cuDeviceGet(0), "cuDeviceGet")
    primary = _driver.check(_driver.driver().cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    _driver.driver().cuDevicePrimaryCtxRelease(dev)
    assert int(ctx) == int(primary)
    np.testing.assert_array_equal(wrapped.numpy(), np.arange(16, dtype=np.float32))


@pytest.mark.gpu
def test_a_context_switched_behind_jaxgraphs_back_is_switched_back():
    """Another library may leave its own context current on this thread (XLA, CuPy, torch):
    jaxgraph's next operation must run in the device's primary context again."""
    from cuda.bindings import driver as cu

    x = jaxgraph.asarray(np.arange(1024, dtype=np.float32))
    primary = int(_driver.check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent"))
    dev = _driver.check(cu.cuDeviceGet(jaxgraph.current_device()), "cuDeviceGet")
    stranger = _driver.check(cu.cuCtxCreate(None, 0, dev), "cuCtxCreate")  # now current (CUDA 13 signature)
    try:
        assert int(_driver.check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")) != primary
        y = jaxgraph.empty(1024)
        y.fill_(np.float32(3.0))
        assert int(_driver.check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")) == primary
        np.testing.assert_array_equal(y.numpy() + x.numpy(), np.arange(1024, dtype=np.float32) + 3)
    finally:
        cu.cuCtxDestroy(stranger)
        _driver.ensure_context()


@pytest.mark.gpu
def test_device_queries():
    assert jaxgraph.device_count() >= 1
    assert jaxgraph.current_device() == 0
    major, minor = _driver.compute_capability(0)
    assert major >= 7
    with pytest.raises(ValueError, match="does not exist"):
        jaxgraph.set_device(jaxgraph.device_count())
    with pytest.raises(TypeError):
        jaxgraph.set_device("0")


class _FakeDriver:
    """What device_current's exit calls of the driver module: cuCtxSetCurrent on a CUcontext."""

    def __init__(self, state):
        self.state = state

    def CUcontext(self, address):  # noqa: N802 - the driver's name
        return address

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        self.state["context"] = ctx
        return (0,)


def test_device_current_restores_the_device_and_the_thread_s_own_context(monkeypatch):
    # A block on device 1 while device 0 is jaxgraph's and another library's context (0xF00) is current:
    # after it, jaxgraph's device is 0 again and the thread's context is 0xF00, error or not.
    state = {"context": 0xF00}
    primary = {0: 0xA00, 1: 0xB00}

    def set_device(d):
        monkeypatch.setattr(_driver._local, "device", d)
        state["context"] = primary[d]

    monkeypatch.setattr(_driver, "_driver_module", _FakeDriver(state))
    monkeypatch.setattr(_driver, "_current_context", lambda: state["context"])
    monkeypatch.setattr(_driver, "set_device", set_device)
    monkeypatch.setattr(_driver._local, "device", 0)
    with _driver.device_current(1) as d:
        assert d == 1 and _driver.current_device() == 1 and state["context"] == 0xB00
    assert _driver.current_device() == 0 and state["context"] == 0xF00
    with pytest.raises(KeyError, match="the block's"):
        with _driver.device_current(1):
            raise KeyError("the block's")
    assert _driver.current_device() == 0 and state["context"] == 0xF00
    with _driver.device_current(0):  # the same device: nothing switched, a switch inside undone
        state["context"] = 0xB00
    assert _driver.current_device() == 0 and state["context"] == 0xF00
