"""Launch limits named before CUDA refuses: the device's, the kernel's own, dynamic shared memory.

CUDA answers a launch over a limit with ``CUDA_ERROR_INVALID_VALUE`` and
nothing else. jaxgraph checks the grid and the block against the device's
limits and the kernel's own most threads per block (``__launch_bounds__`` or
registers lower it below 1024), and dynamic shared memory against the
device's opt-in limit less the kernel's static shared memory, at an eager
launch, during a capture and when ``jax_call`` is traced; the ``ValueError``
names the limit and the value. A launch within the limits still computes
what numpy does. On the CPU: CUDA's own limits (which need no device; for
``jax_call`` in test_jax_lowering.py), and the device's and the kernel's own
with the driver's answers stood in for and the native launch recorded.

Tests internals (listed in tests/README.md): ``_kernels.launch_limits``, ``_kernels.load.device_limits``
and a Kernel's launch fields (``_h_kernel``, ``_native_launch``, ``_thread_limits``); the CPU
tests stand in for the driver.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from jaxgraph._cuda.stream import Stream
from jaxgraph._kernels import load as _kernel_load
from jaxgraph._kernels.launch_limits import LaunchLimits
from jaxgraph._kernels.packer import geometry
from support.graph_helpers import null_array
from support.launch_stubs import add_one, stub_launches  # noqa: F401  (add_one: a fixture)

# At most 128 threads per block: cuFuncGetAttribute(MAX_THREADS_PER_BLOCK) says 128.
BOUNDED = r"""
extern "C" __global__ void __launch_bounds__(128) scale2(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
"""

# Reverses each block's slice through dynamic shared memory (one float per thread),
# with 4 KiB of static shared memory besides.
SHARED = r"""
extern "C" __global__ void rev(float* y, const float* x, int n) {
  extern __shared__ float tile[];
  __shared__ float pad[1024];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  pad[threadIdx.x] = 0.0f;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  int j = blockIdx.x * blockDim.x + (blockDim.x - 1 - threadIdx.x);
  if (j < n) y[j] = tile[threadIdx.x] + pad[threadIdx.x];
}
"""
N = 4096
H100 = LaunchLimits(1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535), "device 0 (NVIDIA H100 80GB HBM3)")


# ---------------------------------------------------------------------------
# CPU: CUDA's limits, and the device's and kernel's with the driver stood in for (internal)
# ---------------------------------------------------------------------------


@pytest.fixture
def stubbed(add_one, monkeypatch):
    """``add_one`` as if loaded, its launches recorded; device 0 reporting an H100's limits; a made-up stream."""
    launched = stub_launches(add_one, monkeypatch)
    monkeypatch.setattr(add_one, "_limits_checked", set())
    monkeypatch.setattr(add_one, "_thread_limits", {0: 1024})
    monkeypatch.setattr(_kernel_load, "device_limits", lambda device: (H100, 232448))
    stream = Stream.__new__(Stream)
    stream._setup(0x1234, 0, None, False)
    return add_one, stream, launched


def test_the_device_s_and_the_kernel_s_limits_are_named_before_the_driver_sees_a_launch(stubbed, monkeypatch):
    kernel, stream, launched = stubbed
    args = (null_array((8,)), null_array((8,)), 8)
    kernel[1, 1024, 0, stream](*args)  # at the limits: launched
    assert len(launched) == 1
    # A kernel whose registers (or __launch_bounds__) allow 128 threads per block on device 0.
    monkeypatch.setattr(kernel, "_thread_limits", {0: 128})
    kernel[1, 128, 0, stream](*args)
    with pytest.raises(ValueError, match=r"kernel add_one: block \(256, 1, 1\) has 256 threads, over the limit of "
                                         r"128 threads per block of this kernel on device 0 \(NVIDIA H100"):
        kernel[1, 256, 0, stream](*args)
    with pytest.raises(ValueError, match=r"block \(16, 16, 1\) has 256 threads, over the limit of 128"):
        kernel.launch(*args, grid=1, block=(16, 16), stream=stream)
    # A device with smaller limits than CUDA's: its own are named.
    small = LaunchLimits(512, (512, 512, 64), (2**31 - 1, 65535, 65535), "device 0 (a small GPU)")
    monkeypatch.setattr(_kernel_load, "device_limits", lambda device: (small, 49152))
    monkeypatch.setattr(kernel, "_thread_limits", {0: 1024})
    kernel._limits_checked.clear()  # what was checked against the other device
    kernel._launch_configs.clear()
    with pytest.raises(ValueError, match=r"block \(1024, 1, 1\) has 1024 along x, over the limit of 512 "
                                         r"\(device 0 \(a small GPU\): block dimensions at most \(512, 512, 64\)\)"):
        kernel[1, 1024, 0, stream](*args)
    with pytest.raises(ValueError, match=r"block \(32, 32, 1\) has 1024 threads, over the limit of 512 threads per "
                                         r"block \(device 0 \(a small GPU\)\)"):
        kernel[1, (32, 32), 0, stream](*args)
    # Dynamic shared memory over the device's opt-in limit, less the kernel's static shared memory.
    monkeypatch.setattr(kernel, "_function_attribute", lambda name, device: {"shared_size_bytes": 1024}[name])
    with pytest.raises(ValueError, match=r"kernel add_one: shared_mem=49153 bytes of dynamic shared memory is over "
                                         r"what device 0 \(a small GPU\) allows this kernel: 48128 bytes \(the "
                                         r"device's opt-in limit of 49152 bytes per block, less the kernel's 1024"):
        kernel[1, 32, 49153, stream](*args)
    assert len(launched) == 2  # nothing refused reached the driver


@pytest.mark.parametrize("grid, block, message", [
    (1, 2048, r"block \(2048, 1, 1\) has 2048 along x, over the limit of 1024 \(CUDA's limit for every GPU"),
    (1, (64, 32), r"block \(64, 32, 1\) has 2048 threads, over the limit of 1024 threads per block"),
    (1, (1, 1, 65), r"block \(1, 1, 65\) has 65 along z, over the limit of 64"),
    ((1, 65536), 32, r"grid \(1, 65536, 1\) has 65536 along y, over the limit of 65535"),
    ((1, 1, 65536), 32, r"grid \(1, 1, 65536\) has 65536 along z, over the limit of 65535"),
    (2**31, 32, r"grid \(2147483648, 1, 1\) has 2147483648 along x, over the limit of 2147483647"),
    (0, 32, r"grid dimensions must be >= 1"),
    ((4, 0), 32, r"grid dimensions must be >= 1"),
    (1, 0, r"block dimensions must be >= 1"),
])
def test_cuda_s_launch_limits_are_named_without_a_device(add_one, grid, block, message):
    with pytest.raises(ValueError, match=message):
        add_one[grid, block]
    with pytest.raises(ValueError, match=message):
        geometry(grid, block, 0, "add_one")


# ---------------------------------------------------------------------------
# GPU: the real limits
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bounded():
    return jaxgraph.Kernel(BOUNDED, "scale2")


@pytest.fixture(scope="module")
def shared():
    return jaxgraph.Kernel(SHARED, "rev")


def optin_limit():
    from cuda.core import Device

    return int(Device(0).properties.max_shared_memory_per_block_optin)


@pytest.mark.gpu
def test_the_kernel_s_own_thread_limit_is_named_at_launch_capture_and_trace(bounded, rng):
    x = rng.standard_normal(N).astype(np.float32)
    xd, y = jaxgraph.asarray(x), jaxgraph.asarray(np.full(N, np.nan, np.float32))
    bounded[N // 128, 128](y, xd, N)  # at the kernel's limit: runs
    np.testing.assert_array_equal(y.numpy(), 2 * x)
    message = (r"kernel scale2: block \(256, 1, 1\) has 256 threads, over the limit of 128 threads per block of "
               r"this kernel on device 0 \(.*\) \(its registers or __launch_bounds__ allow no more")
    with pytest.raises(ValueError, match=message):
        bounded[N // 256, 256](y, xd, N)
    with pytest.raises(ValueError, match=message):
        bounded.launch(y, xd, N, grid=N // 256, block=256)
    g = jaxgraph.CUDAGraph()
    with pytest.raises(ValueError, match=message):
        with jaxgraph.graph(g):
            bounded[N // 256, 256](y, xd, N)
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda v: bounded.jax_call(jax.ShapeDtypeStruct(v.shape, v.dtype), v, N, block=256)).trace(
            jnp.asarray(x))
    out = jax.jit(lambda v: bounded.jax_call(jax.ShapeDtypeStruct(v.shape, v.dtype), v, N, block=128))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(out), 2 * x)


@pytest.mark.gpu
@pytest.mark.parametrize("grid, block, message", [
    (1, (64, 32), r"block \(64, 32, 1\) has 2048 threads, over the limit of 1024 threads per block"),
    (1, 2048, r"block \(2048, 1, 1\) has 2048 along x, over the limit of 1024"),
    ((1, 65536), 32, r"grid \(1, 65536, 1\) has 65536 along y, over the limit of 65535"),
    (0, 32, r"grid dimensions must be >= 1"),
])
def test_geometry_over_the_limits_never_reaches_the_driver(shared, grid, block, message):
    y, x = jaxgraph.zeros(N), jaxgraph.zeros(N)
    with pytest.raises(ValueError, match=message):
        shared[grid, block](y, x, N)
    jaxgraph.synchronize()  # nothing failed on the device either


@pytest.mark.gpu
def test_dynamic_shared_memory_over_the_opt_in_limit_is_named(shared, rng):
    optin = optin_limit()
    x = rng.standard_normal(N).astype(np.float32)
    xd, y = jaxgraph.asarray(x), jaxgraph.asarray(np.full(N, np.nan, np.float32))
    message = (r"kernel rev: shared_mem=(\d+) bytes of dynamic shared memory is over what device 0 \(.*\) allows this "
               r"kernel: (\d+) bytes \(the device's opt-in limit of (\d+) bytes per block, less the kernel's (\d+) "
               r"bytes of static shared memory\)")
    with pytest.raises(ValueError, match=message) as info:
        shared[N // 256, 256, optin](y, xd, N)
    asked, allowed, limit, static = map(int, re.search(message, str(info.value)).groups())
    assert (asked, limit) == (optin, optin) and static >= 4096 and allowed == optin - static  # pad[1024]: 4 KiB
    with pytest.raises(ValueError, match=rf"shared_mem={allowed + 1} bytes .* allows this kernel: {allowed} bytes"):
        jax.jit(lambda v: shared.jax_call(jax.ShapeDtypeStruct(v.shape, v.dtype), v, N,
                                          shared_mem=allowed + 1)).trace(jnp.asarray(x))
    shared[N // 256, 256, allowed](y, xd, N)  # exactly what the device allows: runs
    want = x.reshape(-1, 256)[:, ::-1].reshape(-1)
    np.testing.assert_array_equal(y.numpy(), want)
    out = jax.jit(lambda v: shared.jax_call(jax.ShapeDtypeStruct(v.shape, v.dtype), v, N, shared_mem=allowed))(
        jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(out), want)
