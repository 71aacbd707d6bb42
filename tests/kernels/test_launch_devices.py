"""Eager launches and devices: arrays of another device refused, shared memory raised on each device.

A kernel launched on a stream of device 0 with an array of device 1 would fault
on the device (no peer access): the launch raises ``ValueError`` naming both
devices before the driver sees it, on the first launch (the reference checks)
and on later ones (the specialized packer), for ``kernel[...]``, ``kernel.launch``
and the current stream. The dynamic shared-memory limit over 48 KiB is an
attribute of the kernel on one device (``cuKernelSetAttribute`` takes the
device), so it is raised on each device the first time a launch there asks.

On the CPU the driver is stood in for: made-up arrays and streams of devices 0
and 1, the native launch recorded, ``cuKernelSetAttribute`` recorded. The GPU
tests need two devices and skip with "needs 2 CUDA devices" on one.

Tests internals (listed in tests/README.md): a Kernel's loaded state and ``_native_launch`` stubbed,
``Kernel._limits_checked`` and ``_function_attribute``, ``_kernels.load.device_limits`` and ``check``
(stood in), ``_cuda.driver.driver`` (a stand-in module), ``_cuda.driver._primary_context_addresses`` and
``thread_state``, ``_cuda.stream._local.streams``, ``_kernels.load.reserve_shared_memory``, ``Stream._setup``,
``DeviceArray(..., _token=_INTERNAL)``; what reaches the driver, per device, has no public face.
"""

import os
from types import SimpleNamespace

import numpy as np
import pytest

import jaxgraph
from jaxgraph._cuda import driver as _driver
from jaxgraph._cuda import stream as _stream
from jaxgraph._cuda.array import _INTERNAL, DeviceArray
from jaxgraph._cuda.stream import Stream
from jaxgraph._kernels import load as _kernel_load
from jaxgraph._kernels.launch_limits import CUDA_LIMITS
from support.graph_helpers import on_device
from support.kernel_sources import ADD_ONE, REVERSE_BLOCK
from support.launch_stubs import add_one, stub_launches  # noqa: F401  (add_one: a fixture)

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the GPU test puts an array on device 1 with JAX

N = 4096
WIDE = 100 * 1024  # dynamic shared memory over the default 48 KiB, under an H100's 227 KiB


def fake_array(device, ptr=0x7000_0000):
    """A float32 DeviceArray of ``device`` at a made-up address: checked and packed, never dereferenced."""
    return DeviceArray(ptr, (8,), np.dtype(np.float32), device, None, _token=_INTERNAL)


def fake_stream(handle, device):
    s = Stream.__new__(Stream)
    s._setup(handle, device, None, False)
    return s


@pytest.fixture
def two_devices(add_one, monkeypatch):
    """``add_one`` as if loaded on two devices (contexts 0xC0, 0xC1), launches recorded; a stream on each."""
    launched = stub_launches(add_one, monkeypatch)
    monkeypatch.setitem(_driver._primary_context_addresses, 1, 0xC1)
    monkeypatch.setattr(add_one, "_limits_checked", set())
    monkeypatch.setattr(add_one, "_thread_limits", {0: 1024, 1: 1024})
    monkeypatch.setattr(add_one, "_shared_limits", {})
    monkeypatch.setattr(add_one._packer, "_by_kinds", {})
    monkeypatch.setattr(add_one._packer, "current", lambda args, stream: None)
    monkeypatch.setattr(_kernel_load, "device_limits", lambda device: (CUDA_LIMITS, 232448))
    s0, s1 = fake_stream(0x1000, 0), fake_stream(0x1001, 1)
    monkeypatch.setattr(_stream._local, "streams", {0: s0, 1: s1})  # this thread's current streams
    return add_one, s0, s1, launched


# ---------------------------------------------------------------------------
# CPU: the driver stood in for (internal)
# ---------------------------------------------------------------------------


def test_an_array_of_another_device_is_refused_before_the_launch(two_devices, monkeypatch):
    kernel, s0, s1, launched = two_devices
    y0, x0, y1, x1 = fake_array(0, 0x1000), fake_array(0, 0x2000), fake_array(1, 0x3000), fake_array(1, 0x4000)
    on_0 = r"kernel add_one: argument '{}' \({}\) is on device 1, but the launch runs on device 0"
    for attempt in range(2):  # the reference checks, then the function specialized for these kinds
        with pytest.raises(ValueError, match=on_0.format("x", r"const float\*") + r" \(the device of its stream"):
            kernel[1, 32, 0, s0](y0, x1, 8)
        with pytest.raises(ValueError, match=on_0.format("y", r"float\*") + r".*launch on a stream of device 1"):
            kernel.launch(y1, x0, 8, grid=1, block=32, stream=s0)
        with pytest.raises(ValueError, match=on_0.format("y", r"float\*") + r" \(the current device, whose current"):
            kernel[1, 32](y1, x1, 8)  # the current device is 0
        with pytest.raises(ValueError, match=r"argument 'y' \(float\*\) is on device 0, but the launch runs on "
                                             r"device 1"):
            kernel[1, 32, 0, s1](y0, x1, 8)
        with pytest.raises(ValueError, match=on_0.format("x", r"const float\*")):
            kernel._packer.pack_operands((y0, x1, 8), s0)  # what a launch during a capture packs
        kernel[1, 32, 0, s0](y0, x0, 8)  # one device: launched (and the kinds learned)
        kernel[1, 32, 0, s1](y1, x1, 8)
    assert len(kernel._packer.kinds()) == 1
    assert [(call[1], call[2]) for call in launched] == [(0xC0, 0x1000), (0xC1, 0x1001)] * 2  # nothing else
    monkeypatch.setattr(_driver.thread_state, "device", 1)  # the current device is 1: its current stream
    kernel[1, 32](y1, x1, 8)
    with pytest.raises(ValueError, match=r"argument 'x' \(const float\*\) is on device 0, but the launch runs on "
                                         r"device 1 \(the current device"):
        kernel[1, 32](y1, x0, 8)
    assert [(call[1], call[2]) for call in launched][-1] == (0xC1, 0x1001) and len(launched) == 5


@pytest.fixture
def set_attribute(two_devices, monkeypatch):
    """The driver calls raising the shared-memory limit stood in for: the ``cuKernelSetAttribute`` calls made."""
    kernel = two_devices[0]
    calls = []
    attributes = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="MAX_DYNAMIC_SHARED_SIZE_BYTES")
    fake = SimpleNamespace(CUfunction_attribute=attributes, cuDeviceGet=lambda device: (0, f"device {device}"),
                           CUkernel=lambda handle: handle,
                           cuKernelSetAttribute=lambda attr, value, k, dev: calls.append((attr, value, dev)) or (0,))
    monkeypatch.setattr(_driver, "driver", lambda: fake)
    monkeypatch.setattr(_kernel_load, "check", lambda result, call: result[1] if len(result) == 2 else None)
    monkeypatch.setattr(kernel, "_function_attribute", lambda name, device: {"shared_size_bytes": 0}[name])
    monkeypatch.setattr(_driver, "device_count", lambda: 2)
    return calls


def test_dynamic_shared_memory_is_raised_on_each_device(two_devices, set_attribute):
    kernel, s0, s1, launched = two_devices
    on_0, on_1 = (fake_array(0), fake_array(0), 8), (fake_array(1), fake_array(1), 8)
    kernel[1, 32, WIDE, s0](*on_0)
    kernel[1, 32, WIDE, s0](*on_0)  # raised on device 0 already
    assert set_attribute == [("MAX_DYNAMIC_SHARED_SIZE_BYTES", WIDE, "device 0")]
    kernel[1, 32, WIDE, s1](*on_1)  # device 1 still has the default limit: raised there too
    kernel.launch(*on_1, grid=1, block=32, shared_mem=WIDE, stream=s1)
    assert set_attribute[1:] == [("MAX_DYNAMIC_SHARED_SIZE_BYTES", WIDE, "device 1")]
    kernel[1, 32, WIDE + 1024, s1](*on_1)  # more on device 1 only
    assert set_attribute[2:] == [("MAX_DYNAMIC_SHARED_SIZE_BYTES", WIDE + 1024, "device 1")]
    assert [call[3][-4:] for call in launched] == [WIDE.to_bytes(4, "little")] * 4 + [
        (WIDE + 1024).to_bytes(4, "little")]
    # jax_call reserves on every device what each lacks: device 0 is behind device 1 now.
    _kernel_load.reserve_shared_memory(kernel, WIDE + 1024)
    assert set_attribute[3:] == [("MAX_DYNAMIC_SHARED_SIZE_BYTES", WIDE + 1024, "device 0")]
    _kernel_load.reserve_shared_memory(kernel, WIDE)
    assert len(set_attribute) == 4


def test_jax_call_s_reservation_leaves_no_device_behind(two_devices, set_attribute):
    kernel, s0, s1, _ = two_devices
    kernel[1, 32, WIDE, s0](fake_array(0), fake_array(0), 8)  # an eager launch on device 0 first
    _kernel_load.reserve_shared_memory(kernel, WIDE)  # what jax_call does when traced
    assert [dev for _, _, dev in set_attribute] == ["device 0", "device 1"]


# ---------------------------------------------------------------------------
# GPU: two devices
# ---------------------------------------------------------------------------


def needs_two_devices():
    if jaxgraph.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices (this machine has {jaxgraph.device_count()})")


@pytest.mark.gpu
def test_an_array_on_the_other_gpu_is_refused_naming_both_devices(rng):
    import jax

    needs_two_devices()
    kernel = jaxgraph.Kernel(ADD_ONE, "add_one")
    x = rng.standard_normal(N).astype(np.float32)
    x1 = on_device(1, lambda: jaxgraph.asarray(x))
    y0 = jaxgraph.asarray(np.full(N, np.nan, np.float32))  # poisoned: a launch that ran would write it
    s0 = jaxgraph.Stream(0)
    blocks = (N + 255) // 256
    for _ in range(2):  # the first launch's checks, then the specialized packer's
        with pytest.raises(ValueError, match=r"kernel add_one: argument 'x' \(const float\*\) is on device 1, but the "
                                             r"launch runs on device 0"):
            kernel[blocks, 256, 0, s0](y0, x1, N)
        with pytest.raises(ValueError, match=r"argument 'x' .* is on device 1, but the launch runs on device 0 "
                                             r"\(the current device"):
            kernel[blocks, 256](y0, x1, N)
        kernel[blocks, 256, 0, s0](y0, y0, N)  # same kinds, one device: learns them
        s0.synchronize()
        y0.fill_(np.float32(np.nan), stream=s0)
    x_jax = jax.device_put(x, jax.devices("gpu")[1])  # a foreign array knows its device too
    with pytest.raises(ValueError, match=r"argument 'x' .* is on device 1, but the launch runs on device 0"):
        kernel[blocks, 256, 0, s0](y0, x_jax, N)
    s0.synchronize()
    assert np.isnan(y0.numpy()).all(), "a refused launch wrote its output"
    # The same arrays on a stream of their own device: exact.
    s1 = jaxgraph.Stream(1)
    y1 = on_device(1, lambda: jaxgraph.asarray(np.full(N, np.nan, np.float32)))
    kernel[blocks, 256, 0, s1](y1, x1, N)
    kernel[blocks, 256, 0, s1](y1, y1, N)
    s1.synchronize()
    np.testing.assert_array_equal(on_device(1, lambda: y1.numpy(stream=s1)), (x + np.float32(1.0)) + np.float32(1.0))


@pytest.mark.gpu
def test_dynamic_shared_memory_over_48k_runs_on_both_devices(rng):
    """100 KiB of dynamic shared memory on device 0, then on device 1: raised on each, exact on each."""
    needs_two_devices()
    kernel = jaxgraph.Kernel(REVERSE_BLOCK, "reverse_block")
    block, per_block = 1024, 1024 * 16
    n = per_block * 3
    for device in (0, 1, 0, 1):
        x = rng.standard_normal(n).astype(np.float32)
        s = jaxgraph.Stream(device)
        x_d, y = on_device(device, lambda: (jaxgraph.asarray(x), jaxgraph.asarray(np.full(n, np.nan, np.float32))))
        kernel[3, block, WIDE, s](y, x_d, n)
        s.synchronize()
        want = x.reshape(3, per_block)[:, ::-1].ravel()
        np.testing.assert_array_equal(on_device(device, lambda: y.numpy(stream=s)), want, err_msg=f"device {device}")
