"""Eager launches' argument packing, specialized per kernel and argument kinds (internals, then GPU launches).

The CPU tests reach into ``jaxgraph._kernels.packer`` and a Kernel's packer: a launch
with the kinds of arguments seen before runs a specialized function, a new
kind runs the reference checks first, and a wrong call raises the same error
on either path. The GPU tests launch through the public API with jax, CuPy,
torch and jaxgraph arrays and several kinds of scalars, alternating, and check
every result against numpy on fresh random inputs.

Tests internals (listed in tests/README.md): ``_kernels.packer`` (``ArgumentPacker``, ``_specialize``
counted), ``Kernel._packer``, a Kernel's loaded state, ``_native_launch`` stubbed and ``_launch_configs`` emptied,
``_cuda.driver._primary_context_addresses``, ``Stream._setup``, ``DeviceArray(..., _token=_INTERNAL)``;
which path packed a launch (specialized or reference) has no public face, and the stubbed launch
lets a CPU see exactly what reaches the driver.
"""

import gc
import struct
import weakref

import numpy as np
import pytest

import jaxgraph
from jaxgraph._cuda import driver as _driver
from jaxgraph._kernels import packer as _packer
from jaxgraph._cuda.array import _INTERNAL, DeviceArray
from jaxgraph._kernels.packer import ArgumentPacker, geometry
from jaxgraph._kernels.signature import parse_signature
from jaxgraph._cuda.stream import Stream
from support.kernel_sources import MIXED_PARAMS, REVERSE_BLOCK

SIGNATURE = "float* y, const float* x, const double* w, float a, int n, long long shift, __half h, bool flag"


def array(dtype, ptr=0x7000_0000):
    """A DeviceArray at a made-up address: checked and packed, never dereferenced."""
    return DeviceArray(ptr, (8,), np.dtype(dtype), 0, None, _token=_INTERNAL)


def good_args():
    return (array(np.float32, 0x1000), array(np.float32, 0x2000), array(np.float64, 0x3000), 2.0, 8, -5,
            0.5, True)


def reference_bytes(packer, args):
    values, _ = packer.values(args)
    return packer._struct.pack(*values)


@pytest.fixture
def counted(monkeypatch):
    """A packer for SIGNATURE, counting how often the reference checks run and functions are specialized."""
    packer = ArgumentPacker("mixed", parse_signature(SIGNATURE))
    calls = {"values": 0, "specialize": 0}
    values, specialize = packer.values, _packer._specialize

    def counting_values(*a, **k):
        calls["values"] += 1
        return values(*a, **k)

    def counting_specialize(*a, **k):
        calls["specialize"] += 1
        return specialize(*a, **k)

    monkeypatch.setattr(packer, "values", counting_values)
    monkeypatch.setattr(_packer, "_specialize", counting_specialize)
    return packer, calls


# ---------------------------------------------------------------------------
# CPU: the packer (internal)
# ---------------------------------------------------------------------------


def test_the_same_kinds_hit_the_specialized_function(counted):
    packer, calls = counted
    args = good_args()
    data = packer.pack(args)
    assert data == reference_bytes(ArgumentPacker("mixed", packer.params), args)
    assert calls == {"values": 1, "specialize": 1}
    assert packer.kinds() == [tuple(map(type, args))]
    rng = np.random.default_rng()
    for _ in range(20):  # fresh values of the same kinds: packed by the specialized function alone
        args = (array(np.float32, int(rng.integers(1, 2**40))), array(np.float32, 0x2000), array(np.float64),
                float(rng.standard_normal()), int(rng.integers(-2**31, 2**31)), int(rng.integers(-2**63, 2**63)),
                float(rng.integers(-100, 100)) / 4, bool(rng.integers(2)))
        packed = packer.current(args, None)
        assert packed == reference_bytes(ArgumentPacker("mixed", packer.params), args)
        assert packer.pack(args) == packed
        assert packer.pack_operands(args, None) == (packed, args)  # nothing wrapped: the arguments themselves
    assert calls == {"values": 1, "specialize": 1}


def test_a_different_kind_is_checked_then_specialized_and_kinds_alternate(counted):
    packer, calls = counted
    first = good_args()
    second = first[:3] + (np.float32(2.0), np.int32(8), -5, np.float16(0.5), True)
    assert packer.current(first, None) is None  # nothing learned yet
    expected = packer.pack(first)
    assert packer.current(second, None) is None  # other kinds: the specialized function declines
    assert packer.pack(second) == expected   # the same words for the same values
    assert calls == {"values": 2, "specialize": 2}
    for _ in range(5):  # alternating: each kind has its function, no reference checks again
        assert packer.pack(first) == expected and packer.pack(second) == expected
    assert calls == {"values": 2, "specialize": 2}
    assert set(packer.kinds()) == {tuple(map(type, first)), tuple(map(type, second))}


def test_kinds_that_fail_are_never_specialized(counted):
    packer, calls = counted
    with pytest.raises(TypeError, match="parameter n is int, got str"):
        packer.pack(good_args()[:4] + ("8",) + good_args()[5:])
    with pytest.raises(TypeError, match="takes 8 arguments"):
        packer.pack(good_args()[:3])
    assert calls["specialize"] == 0 and packer.kinds() == []


BAD = [  # (position, bad value of the good argument's kind, message): raised inside the specialized function
    (1, array(np.int32), r"parameter x is const float\*, got an array of int32"),
    (2, array(np.float32), r"parameter w is const double\*, got an array of float32"),
    (3, 1e40, r"parameter a is float, got float 1e\+40 \(.*too large"),
    (4, 2**31, r"parameter n is int, 2147483648 is out of its range \[-2147483648, 2147483647\]"),
    (4, -2**31 - 1, "-2147483649 is out of its range"),
    (5, 2**63, "parameter shift is long long, 9223372036854775808 is out of its range"),
    (6, 1e6, r"parameter h is __half, got float 1000000.0 \(.*"),
]


@pytest.mark.parametrize("position, value, message", BAD)
def test_wrong_values_of_known_kinds_raise_the_reference_error(counted, position, value, message):
    packer, calls = counted
    args = list(good_args())
    args[position] = value
    args = tuple(args)
    with pytest.raises(TypeError, match=message) as fresh:  # a fresh packer: the reference path
        ArgumentPacker("mixed", packer.params).pack(args)
    packer.pack(good_args())  # learns these kinds
    specialized = packer.current
    with pytest.raises(TypeError, match=message) as cached:
        packer.pack(args)
    assert str(cached.value) == str(fresh.value)
    assert calls == {"values": 1, "specialize": 1}  # raised by the specialized function, not the reference
    assert packer.current is specialized


def test_geometry_checks_and_packs():
    assert geometry(16, 256, 0) == struct.pack("<7I", 16, 1, 1, 256, 1, 1, 0)
    assert geometry((2, 3), (4, 5, 6), np.int64(1024)) == struct.pack("<7I", 2, 3, 1, 4, 5, 6, 1024)
    for grid, block, shared_mem, exc, message in [
        (0, 32, 0, ValueError, "grid dimensions must be >= 1"),
        (1.0, 32, 0, TypeError, "grid must be an int"),
        (True, 32, 0, TypeError, "grid must be an int"),
        (2**32, 32, 0, ValueError, "must each fit in 32 bits"),
        (1, 32, -1, ValueError, "shared_mem must be >= 0"),
        (1, 32, 1.5, TypeError, "shared_mem must be an int"),
    ]:
        with pytest.raises(exc, match=message):
            geometry(grid, block, shared_mem)


# ---------------------------------------------------------------------------
# CPU: a Kernel's launches with the native launch stubbed (internal)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_kernel(tmp_path_factory):
    return jaxgraph.Kernel(MIXED_PARAMS, "mixed", arch="sm_90", cache_dir=tmp_path_factory.mktemp("cubins"))


@pytest.fixture
def stubbed(mixed_kernel, monkeypatch):
    """``mixed_kernel`` with its driver call recorded instead of made, on a made-up stream."""
    launched = []
    monkeypatch.setattr(mixed_kernel, "_h_kernel", 1)
    monkeypatch.setattr(mixed_kernel, "_function_address", 0xF00)
    monkeypatch.setattr(mixed_kernel, "_native_launch", lambda *a: launched.append(a) or 0)
    monkeypatch.setattr(mixed_kernel, "_launch_configs", {})  # each remembers the native launch it made ready
    monkeypatch.setitem(_driver._primary_context_addresses, 0, 0xC0)
    stream = Stream.__new__(Stream)
    stream._setup(0x1234, 0, None, False)
    return mixed_kernel, stream, launched


def test_the_native_launch_gets_the_reference_encoding(stubbed):
    kernel, stream, launched = stubbed
    args = good_args()
    kernel[(2, 3), 32, 64, stream](*args)
    kernel.launch(*args, grid=(2, 3), block=32, shared_mem=64, stream=stream)
    words = reference_bytes(kernel._packer, args)
    expected = (0xF00, 0xC0, 0x1234, struct.pack("<7I", 2, 3, 1, 32, 1, 1, 64), words)
    assert launched == [expected, expected]


def test_launch_configurations_are_checked_then_kept(stubbed):
    kernel, stream, _ = stubbed
    for config in [(16, 256), (16, 256, 0, stream), ((2, 2), (8, 8))]:
        assert kernel[config].__self__[-1] is kernel[config].__self__[-1]  # the configuration: checked once, kept
    with pytest.raises(TypeError, match="grid must be an int"):
        kernel[16.0, 256]  # equal to 16 (and hashed alike), still refused
    with pytest.raises(TypeError, match="grid must be an int"):
        kernel[True, 256]
    with pytest.raises(TypeError, match="stream must be a jaxgraph.Stream"):
        kernel[16, 256, 0, 5]
    with pytest.raises(TypeError, match="stream must be a jaxgraph.Stream"):
        kernel.launch(*good_args(), grid=16, block=256, stream=5)
    with pytest.raises(ValueError, match="shared_mem must be >= 0"):
        kernel.launch(*good_args(), grid=16, block=256, shared_mem=-1)


def test_a_kernel_that_launched_is_freed_when_dropped(tmp_path):
    """Nothing the launch path keeps refers back to the kernel: it goes without a garbage collection."""
    kernel = jaxgraph.Kernel(MIXED_PARAMS, "mixed", arch="sm_90", cache_dir=tmp_path)
    kernel[4, 32]
    kernel._packer.pack(good_args())
    kernel._packer.pack(good_args()[:3] + (np.float32(1.0),) + good_args()[4:])
    gc.disable()
    try:
        ref = weakref.ref(kernel)
        del kernel
        assert ref() is None
    finally:
        gc.enable()


def test_a_kernel_alternating_kinds_packs_alike(stubbed):
    kernel, stream, launched = stubbed
    first = good_args()
    second = first[:3] + (np.float32(2.0), np.int32(8), np.int64(-5), 0.5, np.bool_(True))
    for _ in range(3):
        kernel[1, 32, 0, stream](*first)
        kernel[1, 32, 0, stream](*second)
    assert len({call[4] for call in launched}) == 1 and len(launched) == 6
    assert len(kernel._packer.kinds()) >= 2


# ---------------------------------------------------------------------------
# GPU: launches with specialized packers vs numpy
# ---------------------------------------------------------------------------

N = 3001


def _library_array(library, host):
    """``host`` (a numpy array) on the device as ``library``'s array."""
    if library == "jaxgraph":
        return jaxgraph.asarray(host)
    if library == "jax":
        import jax
        from conftest import enable_x64

        with enable_x64():  # float64 stays float64 (JAX's default would make it float32)
            return jax.device_put(host, jax.devices("gpu")[0])
    if library == "cupy":
        cupy = pytest.importorskip("cupy")
        return cupy.asarray(host)
    torch = pytest.importorskip("torch")
    return torch.as_tensor(host, device="cuda")


def _to_numpy(library, arr):
    if library == "torch":
        import torch

        torch.cuda.synchronize()
        return arr.cpu().numpy()
    if library == "cupy":
        import cupy

        return cupy.asnumpy(arr)
    return jaxgraph.to_host(arr)


def _scalars(kind, a, n, shift, h, flag):
    """The launch's scalars as Python numbers, numpy scalars, or ints where a float or bool is declared."""
    if kind == "python":
        return (float(a), n, shift, h, flag)
    if kind == "numpy":
        return (np.float32(a), np.int32(n), np.int64(shift), np.float16(h), np.bool_(flag))
    return (int(a), n, shift, h, int(flag))


# (y, x, w, scalars): six kinds of arguments, each launched four times, alternating.
COMBOS = [("jaxgraph", "jaxgraph", "jaxgraph", "python"), ("cupy", "jax", "cupy", "numpy"),
          ("torch", "torch", "jax", "ints"), ("jaxgraph", "cupy", "torch", "numpy"),
          ("torch", "jax", "jaxgraph", "python"), ("cupy", "torch", "jax", "ints")]


@pytest.mark.gpu
def test_alternating_kinds_match_numpy(rng):
    """Arrays of four libraries and scalars of three kinds, alternating launch to launch: each exact."""
    pytest.importorskip("cupy")
    pytest.importorskip("torch")
    kernel = jaxgraph.Kernel(MIXED_PARAMS, "mixed")
    reference_calls = []
    reference = kernel._packer.values
    kernel._packer.values = lambda *a, **k: reference_calls.append(1) or reference(*a, **k)
    stream = jaxgraph.Stream()
    rounds = 4 * len(COMBOS)
    for round_ in range(rounds):
        out_lib, x_lib, w_lib, scalar_kind = COMBOS[round_ % len(COMBOS)]
        x = rng.integers(-1000, 1000, N).astype(np.float32)   # integers: every sum is exact in float32
        w = rng.integers(-1000, 1000, N).astype(np.float64)
        a, shift = int(rng.integers(-4, 5)), int(rng.integers(-1000, 1000))
        h, flag = float(rng.integers(-8, 8)) / 2, bool(rng.integers(2))
        y = _library_array(out_lib, np.full(N, np.nan, np.float32))  # poisoned: unwritten fails
        args = (y, _library_array(x_lib, x), _library_array(w_lib, w)) + _scalars(scalar_kind, a, N, shift, h, flag)
        jaxgraph.synchronize()  # every library's copies done (torch's interface names no stream)
        if round_ % 2:
            kernel[(N + 127) // 128, 128](*args)                      # the current stream
        else:
            kernel.launch(*args, grid=(N + 255) // 256, block=256, stream=stream)
        jaxgraph.synchronize()
        expected = np.float32(a) * x + w.astype(np.float32) + np.float32(shift) + np.float32(h) + np.float32(flag)
        np.testing.assert_array_equal(_to_numpy(out_lib, y), expected,
                                      err_msg=f"round {round_}: {COMBOS[round_ % len(COMBOS)]}")
    kinds = kernel._packer.kinds()
    print(f"{rounds} launches, {len(kinds)} kinds of arguments, {len(reference_calls)} reference checks")
    assert len(kinds) == len(reference_calls) == len(COMBOS)  # the other launches ran specialized functions


@pytest.mark.gpu
def test_a_capture_through_specialized_packers_replays_right(rng):
    """Kinds learned eagerly, then a capture with a CuPy input written on CuPy's stream: exact replays."""
    cupy = pytest.importorskip("cupy")
    kernel = jaxgraph.Kernel(MIXED_PARAMS, "mixed")
    x_s, y_s = jaxgraph.empty(N), jaxgraph.empty(N)
    grid = (N + 255) // 256
    kernel[grid, 256](y_s, x_s, cupy.zeros(N, cupy.float64), 2.0, N, 3, 0.5, False)  # learns these kinds
    jaxgraph.synchronize()
    w = rng.integers(-1000, 1000, N).astype(np.float64)
    w_c = cupy.asarray(w)  # the capture must order after CuPy's copy (its interface names the stream)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g, stream=jaxgraph.Stream()):
        kernel[grid, 256](y_s, x_s, w_c, 2.0, N, 3, 0.5, False)
    for _ in range(3):
        x = rng.integers(-1000, 1000, N).astype(np.float32)
        x_s.copy_(x)
        y_s.fill_(np.float32(np.nan))
        g.replay()
        jaxgraph.synchronize()
        expected = np.float32(2.0) * x + w.astype(np.float32) + np.float32(3) + np.float32(0.5)
        np.testing.assert_array_equal(y_s.numpy(), expected)
    assert len(kernel._packer.kinds()) == 1  # the captured launch (reference checks: a CuPy array) learned none


@pytest.mark.gpu
def test_the_launch_switches_a_strangers_context_back(rng):
    """Another library left its own context current: the native launch runs in the primary context again."""
    from cuda.bindings import driver as cu

    kernel = jaxgraph.Kernel(MIXED_PARAMS, "mixed")
    stream = jaxgraph.Stream()
    x = rng.integers(-1000, 1000, N).astype(np.float32)
    x_d, w_d, y = jaxgraph.asarray(x), jaxgraph.zeros(N, np.float64), jaxgraph.empty(N)
    jaxgraph.synchronize()
    launch = kernel[(N + 255) // 256, 256, 0, stream]
    launch(y, x_d, w_d, 1.0, N, 0, 0.0, False)  # loaded, kinds learned: the next launch touches no Python driver call
    stream.synchronize()
    primary = int(_driver.check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent"))
    dev = _driver.check(cu.cuDeviceGet(jaxgraph.current_device()), "cuDeviceGet")
    stranger = _driver.check(cu.cuCtxCreate(None, 0, dev), "cuCtxCreate")  # now current (CUDA 13 signature)
    try:
        y.fill_(np.float32(np.nan), stream=stream)  # makes the primary context current again
        stream.synchronize()
        _driver.check(cu.cuCtxSetCurrent(stranger), "cuCtxSetCurrent")
        launch(y, x_d, w_d, 3.0, N, 7, 0.5, True)
        assert int(_driver.check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")) == primary
        stream.synchronize()
        np.testing.assert_array_equal(y.numpy(), np.float32(3.0) * x + np.float32(8.5))
    finally:
        cu.cuCtxDestroy(stranger)
        _driver.ensure_context()


@pytest.mark.gpu
def test_dynamic_shared_memory_over_48k_is_raised_and_used(rng):
    """64 KiB of dynamic shared memory per block: over the default limit, raised on first use, then used."""
    kernel = jaxgraph.Kernel(REVERSE_BLOCK, "reverse_block")
    block, per_block = 1024, 1024 * 16
    n = per_block * 3
    x = rng.standard_normal(n).astype(np.float32)
    x_d = jaxgraph.asarray(x)
    for launch in ("index", "kwargs"):
        y = jaxgraph.asarray(np.full(n, np.nan, np.float32))
        if launch == "index":
            kernel[3, block, per_block * 4](y, x_d, n)
        else:
            kernel.launch(y, x_d, n, grid=3, block=block, shared_mem=per_block * 4)
        expected = x.reshape(3, per_block)[:, ::-1].ravel()
        np.testing.assert_array_equal(y.numpy(), expected)
