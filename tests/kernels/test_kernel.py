"""Kernels: NVRTC compilation, the disk cache, argument checking and launches vs numpy.

Tests internals (listed in tests/README.md): ``_kernels.signature.find_signature``, ``parse_signature``,
``Kernel._packer.values``; signature parsing and scalar range checks on a CPU.
"""

import numpy as np
import pytest

import jaxgraph
from jaxgraph._kernels.signature import find_signature, parse_signature
from support.kernel_sources import ADD_ONE, AXPY, SCALAR_TYPES

ELF_MAGIC = b"\x7fELF"


# ---------------------------------------------------------------------------
# CPU: compilation and the cache
# ---------------------------------------------------------------------------


def test_nvrtc_compiles_to_cubin_without_device(tmp_path):
    k = jaxgraph.Kernel(AXPY, "axpy<float>", arch="sm_90", cache_dir=tmp_path)
    assert k.cubin.startswith(ELF_MAGIC)
    assert k.lowered_name.startswith("_Z4axpyIfE")
    assert not k.cache_hit
    assert [p.name for p in k.params] == ["y", "x", "a", "n"]


def test_disk_cache_is_hit_on_second_compile(tmp_path):
    first = jaxgraph.Kernel(AXPY, "axpy<double>", arch="sm_90", cache_dir=tmp_path)
    second = jaxgraph.Kernel(AXPY, "axpy<double>", arch="sm_90", cache_dir=tmp_path)
    assert not first.cache_hit and second.cache_hit
    assert second.cubin == first.cubin and second.lowered_name == first.lowered_name
    # Another architecture, option set or source is another entry.
    other_arch = jaxgraph.Kernel(AXPY, "axpy<double>", arch="sm_80", cache_dir=tmp_path)
    other_opts = jaxgraph.Kernel(AXPY, "axpy<double>", {"use_fast_math": True}, arch="sm_90", cache_dir=tmp_path)
    other_src = jaxgraph.Kernel(AXPY + "\n// v2\n", "axpy<double>", arch="sm_90", cache_dir=tmp_path)
    assert not (other_arch.cache_hit or other_opts.cache_hit or other_src.cache_hit)
    assert len(list(tmp_path.glob("*.cubin"))) == 4


def test_compile_error_shows_nvrtc_log(tmp_path):
    with pytest.raises(jaxgraph.CompileError, match='identifier "undefined_name" is undefined'):
        jaxgraph.Kernel("__global__ void f(float* x) { x[0] = undefined_name; }", "f",
                        arch="sm_90", cache_dir=tmp_path)


def test_unknown_kernel_name_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no __global__ kernel named 'nope'"):
        jaxgraph.Kernel(AXPY, "nope", arch="sm_90", cache_dir=tmp_path)


def test_bad_options_are_rejected(tmp_path):
    with pytest.raises(TypeError, match="invalid kernel option"):
        jaxgraph.Kernel(ADD_ONE, "add_one", {"not_an_option": 1}, arch="sm_90", cache_dir=tmp_path)
    with pytest.raises(TypeError, match="ProgramOptions or a dict"):
        jaxgraph.Kernel(ADD_ONE, "add_one", ["-O3"], arch="sm_90", cache_dir=tmp_path)


# ---------------------------------------------------------------------------
# CPU: signatures
# ---------------------------------------------------------------------------


def test_signature_from_source_and_templates():
    params = parse_signature(find_signature(AXPY, "axpy<double>"))
    assert [(p.name, p.is_pointer, str(p.dtype)) for p in params] == [
        ("y", True, "float64"), ("x", True, "float64"), ("a", False, "float64"), ("n", False, "int32")]
    params = parse_signature(find_signature(SCALAR_TYPES, "scalars"))
    assert [str(p.dtype) for p in params] == [
        "float64", "int8", "uint16", "int64", "uint32", "float32", "float64", "float16", "bool"]


def test_signature_explicit_and_unsupported():
    params = parse_signature("void* raw, float4* v, const int* __restrict__ idx, size_t n")
    assert [(p.is_pointer, p.dtype) for p in params] == [
        (True, None), (True, None), (True, np.dtype("int32")), (False, np.dtype("uint64"))]
    with pytest.raises(ValueError, match="cannot pack"):
        parse_signature("float4 v")
    with pytest.raises(ValueError, match="references"):
        parse_signature("float& r")


# ---------------------------------------------------------------------------
# CPU: argument checking happens before anything reaches the GPU
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def axpy_f32(tmp_path_factory):
    return jaxgraph.Kernel(AXPY, "axpy<float>", arch="sm_90", cache_dir=tmp_path_factory.mktemp("c"))


class FakeDeviceArray:
    """Looks like a device array to the argument checker (never launched)."""

    def __init__(self, dtype):
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": np.dtype(dtype).str,
                                         "data": (0, False), "version": 3, "strides": None}


@pytest.mark.parametrize("args, message", [
    ((1, 2, 3), "takes 4 arguments"),
    ((np.zeros(4, np.float32), np.zeros(4, np.float32), 1.0, 4), r"got ndarray \(host memory\)"),
    ((123, 456, 1.0, 4), "takes a device array, got int"),
    (("y", "x", 1.0, 4), "takes a device array, got str"),
])
def test_wrong_calls_are_type_errors(axpy_f32, args, message):
    with pytest.raises(TypeError, match=message):
        axpy_f32[1, 32](*args)


def test_scalar_checks(axpy_f32):
    k = axpy_f32
    values = k._packer.values  # the reference checks every launch's fast path defers to
    ptr = object()
    with pytest.raises(TypeError, match="numpy float64 scalar"):
        values((_DA(), _DA(), np.float64(1.0), 4))
    with pytest.raises(TypeError, match="parameter n is int"):
        k[1, 32](_DA(), _DA(), 1.0, 2.5)
    with pytest.raises(TypeError, match="parameter n is int"):
        k[1, 32](_DA(), _DA(), 1.0, 2**40)
    assert values((_DA(), _DA(), np.float32(2.0), np.int32(3)))[0][2:] == [2.0, 3]
    del ptr


def test_launch_config_is_checked(axpy_f32):
    with pytest.raises(TypeError, match="kernel\\[grid, block\\]"):
        axpy_f32[1]
    with pytest.raises(ValueError, match="grid dimensions must be >= 1"):
        axpy_f32[0, 32]
    with pytest.raises(TypeError, match="block must be an int or a tuple"):
        axpy_f32[1, (1, 2, 3, 4)]


def _DA():
    """A DeviceArray for the checker only: address 0, never launched."""
    from support.graph_helpers import null_array

    return null_array((4,), np.float32)


# ---------------------------------------------------------------------------
# GPU: launches against numpy
# ---------------------------------------------------------------------------

SIZES = [1, 1000, 4097, 1 << 20]


@pytest.mark.gpu
@pytest.mark.parametrize("ctype, dtype", [("float", np.float32), ("double", np.float64),
                                          ("int", np.int32), ("__half", np.float16)])
@pytest.mark.parametrize("n", SIZES)
def test_axpy_matches_numpy(rng, ctype, dtype, n):
    src = ("#include <cuda_fp16.h>\n" + AXPY) if ctype == "__half" else AXPY
    k = jaxgraph.Kernel(src, f"axpy<{ctype}>")
    if np.issubdtype(dtype, np.integer):
        x, y, a = rng.integers(-1000, 1000, n).astype(dtype), rng.integers(-1000, 1000, n).astype(dtype), 3
    else:
        x, y, a = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype), 1.5
    dy = jaxgraph.asarray(y)
    block = 256
    k[(n + block - 1) // block, block](dy, jaxgraph.asarray(x), a, n)
    expected = (dtype(a) * x + y).astype(dtype)
    tol = 1e-2 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(dy.numpy(), expected, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_unwritten_output_fails(rng):
    """Poisoned output + explicit launch(): every element must be written."""
    k = jaxgraph.Kernel(ADD_ONE, "add_one")
    n = 3001
    x = rng.standard_normal(n).astype(np.float32)
    y = jaxgraph.asarray(np.full(n, np.nan, np.float32))
    k.launch(y, jaxgraph.asarray(x), n, grid=(n + 127) // 128, block=128)
    out = y.numpy()
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out, x + 1)


@pytest.mark.gpu
def test_scalar_types_reach_the_kernel(rng):
    k = jaxgraph.Kernel(SCALAR_TYPES, "scalars")
    out = jaxgraph.asarray(np.full(8, np.nan))
    vals = [-7, 65000, -(2**40) + 3, 4000000000, 0.25, float(rng.standard_normal()), 1.5, True]
    k[1, 1](out, *vals)
    np.testing.assert_array_equal(out.numpy(), np.array(vals, dtype=np.float64))


@pytest.mark.gpu
def test_array_dtype_mismatch_is_type_error():
    k = jaxgraph.Kernel(AXPY, "axpy<float>")
    with pytest.raises(TypeError, match="got an array of float64"):
        k[1, 32](jaxgraph.zeros(4, np.float64), jaxgraph.zeros(4, np.float32), 1.0, 4)


@pytest.mark.gpu
def test_disk_cache_hit_on_device(tmp_path):
    a = jaxgraph.Kernel(ADD_ONE, "add_one", cache_dir=tmp_path)
    b = jaxgraph.Kernel(ADD_ONE, "add_one", cache_dir=tmp_path)
    assert not a.cache_hit and b.cache_hit
    x = jaxgraph.asarray(np.arange(64, dtype=np.float32))
    y = jaxgraph.empty(64)
    b[1, 64](y, x, 64)  # the cached cubin loads and runs
    np.testing.assert_array_equal(y.numpy(), np.arange(64, dtype=np.float32) + 1)


@pytest.mark.gpu
def test_kernel_on_foreign_arrays_in_place(rng):
    """Kernels take jax.Array, CuPy and torch arrays directly (zero-copy)."""
    k = jaxgraph.Kernel(ADD_ONE, "add_one")
    x = rng.standard_normal(1000).astype(np.float32)
    torch = pytest.importorskip("torch")
    tx = torch.as_tensor(x, device="cuda")
    ty = torch.full_like(tx, float("nan"))
    k[4, 256](ty, tx, 1000)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(ty.cpu().numpy(), x + 1)
