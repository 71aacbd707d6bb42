"""What a new user gets wrong with a Kernel, and the error that says how to fix it (CPU: no device needed).

Targets (``arch``), template arguments, ``signature=``, calling a kernel
without a launch configuration, a CPU ``jax.Array`` as an operand, NVRTC's
failures, and the rule that nothing but a cubin is ever cached.

Tests internals (listed in tests/README.md): ``_kernels.compile`` (NVRTC patched), ``_kernels.cubin``,
``_cuda.array.HOST_JAX_ARRAY_FIX``; compile failures and the cubin cache on a CPU.
"""

import re

import jax
import numpy as np
import pytest

import jaxgraph
from jaxgraph._kernels import compile as _compile
from jaxgraph._cuda.array import HOST_JAX_ARRAY_FIX
from jaxgraph._kernels.cubin import is_cubin, param_sizes
from support.kernel_sources import ADD_ONE, AXPY, SCALAR_TYPES


# ---------------------------------------------------------------------------
# arch
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["compute_90", "compute_80", "compute_90a"])
def test_a_virtual_architecture_is_refused_and_nothing_is_cached(arch, tmp_path):
    real = arch.replace("compute", "sm")
    with pytest.raises(ValueError, match=rf"arch='{arch}' is a virtual architecture: .*PTX.*pass arch='{real}'"):
        jaxgraph.Kernel(AXPY, "axpy<float>", arch=arch, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arch", ["sm_9", "sm_1000", "90", "SM_90", "sm_90x", "sm_75a"])
def test_an_invalid_arch_is_echoed_with_the_valid_ones(arch, tmp_path):
    with pytest.raises(ValueError) as info:
        jaxgraph.Kernel(AXPY, "axpy<float>", arch=arch, cache_dir=tmp_path)
    message = str(info.value)
    assert f"arch={arch!r} is not a GPU architecture NVRTC compiles for" in message
    assert "sm_90" in message and "sm_80" in message and "'a' or 'f' suffix" in message
    assert list(tmp_path.glob("*.cubin")) == []


def test_a_non_string_arch_is_a_type_error():
    with pytest.raises(TypeError, match="arch must be a string such as 'sm_90', got int 90"):
        jaxgraph.Kernel(AXPY, "axpy<float>", arch=90)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
def test_real_architectures_give_cubins(arch, tmp_path):
    k = jaxgraph.Kernel(AXPY, "axpy<float>", arch=arch, cache_dir=tmp_path)
    assert k.arch == arch and is_cubin(k.cubin)


# ---------------------------------------------------------------------------
# Only cubins are cached
# ---------------------------------------------------------------------------


def test_an_empty_cubin_from_nvrtc_is_an_error_and_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(_compile, "_nvrtc_compile", lambda source, name, opts: (b"", "add_one"))
    with pytest.raises(jaxgraph.CompileError, match="NVRTC returned no cubin for kernel 'add_one' .*0 bytes"):
        jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_invalid_cached_cubin_is_compiled_again(tmp_path):
    first = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    first.cache_path.write_bytes(b"")            # what an older version could have cached for compute_90
    with pytest.warns(RuntimeWarning, match="does not match the digest recorded with it"):
        again = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    assert not again.cache_hit and is_cubin(again.cubin)
    assert again.cache_path.read_bytes() == again.cubin   # the entry is repaired
    assert jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path).cache_hit


# ---------------------------------------------------------------------------
# NVRTC's errors
# ---------------------------------------------------------------------------


def test_a_misspelt_template_argument_blames_the_template_argument(tmp_path):
    with pytest.raises(jaxgraph.CompileError) as info:
        jaxgraph.Kernel(AXPY, "axpy<flaot>", arch="sm_90", cache_dir=tmp_path)
    message = str(info.value)
    assert "the template arguments of 'axpy<flaot>' are unknown or failed to instantiate 'axpy'" in message
    assert 'identifier "flaot" is undefined' in message        # NVRTC's log, quoted
    assert "NVRTC_ERROR_COMPILATION" in message and "parameter" not in message


def test_a_syntax_error_names_nvrtcs_result_not_a_bare_number(tmp_path):
    source = 'extern "C" __global__ void broken(float* y) { y[0] = 1 }'
    with pytest.raises(jaxgraph.CompileError) as info:
        jaxgraph.Kernel(source, "broken", arch="sm_90", cache_dir=tmp_path)
    message = str(info.value)
    assert message.startswith("NVRTC could not compile kernel 'broken' (NVRTC_ERROR_COMPILATION):\n")
    assert 'error: expected a ";"' in message
    assert not re.search(r"(^|\n)\d+: ", message) and "\x00" not in message


def test_an_older_cuda_core_bare_code_gets_its_result_name():
    """Internal: cuda.core versions that print only the code ("6: ...") still give the result's name."""
    error = _compile._compile_error("k", None, "6: compilation log:\n\nk.cu(1): error: oops\n\x00")
    assert str(error) == "NVRTC could not compile kernel 'k' (NVRTC_ERROR_COMPILATION):\nk.cu(1): error: oops"


# ---------------------------------------------------------------------------
# signature= against the compiled kernel
# ---------------------------------------------------------------------------


def test_the_cubin_declares_each_parameters_size(tmp_path):
    k = jaxgraph.Kernel(SCALAR_TYPES, "scalars", arch="sm_90", cache_dir=tmp_path)
    # double*, signed char, unsigned short, long long, unsigned int, float, double, __half, bool
    assert param_sizes(k.cubin, k.lowered_name) == [8, 1, 2, 8, 4, 4, 8, 2, 1]
    assert param_sizes(k.cubin, "no_such_kernel") is None and param_sizes(b"", "x") is None


@pytest.mark.parametrize("signature, sizes", [
    ("float* y, const float* x, double a, int n", "[8, 8, 8, 4]"),   # a is float in axpy<float>
    ("float* y, const float* x, float a", "[8, 8, 4]"),              # one parameter short
    ("float* y, const float* x, float a, int n, int m", "[8, 8, 4, 4, 4]"),
])
def test_a_signature_that_disagrees_with_the_source_is_refused_at_compile_time(signature, sizes, tmp_path):
    with pytest.raises(TypeError, match=re.escape(
            f"kernel axpy<float>: the compiled kernel's 4 parameters have sizes [8, 8, 4, 4] bytes, but the "
            f"signature given as signature= (")) as info:
        jaxgraph.Kernel(AXPY, "axpy<float>", signature=signature, arch="sm_90", cache_dir=tmp_path)
    assert f"implies {sizes}" in str(info.value)


@pytest.mark.parametrize("signature, message", [
    ("float* y, const float* x, int a, int n", "parameter a as int, but the source declares float a"),
    ("int* y, const float* x, float a, int n", "parameter y as int*, but the source declares float* y"),
    ("float* y, long long x, float a, int n", "parameter x as long long, but the source declares const float* x"),
    # const is part of the type: it says which buffers a kernel only reads (jax_call outputs, graph binding).
    ("float* y, float* x, float a, int n", "parameter x as float*, but the source declares const float* x"),
    ("float* y, void* x, float a, int n", "parameter x as void*, but the source declares const float* x"),
    ("const float* y, const float* x, float a, int n", "parameter y as const float*, but the source declares "
                                                       "float* y"),
])
def test_a_signature_of_the_right_sizes_but_other_types_is_refused(signature, message, tmp_path):
    with pytest.raises(TypeError, match=re.escape(f"kernel axpy<float>: signature= gives {message}")):
        jaxgraph.Kernel(AXPY, "axpy<float>", signature=signature, arch="sm_90", cache_dir=tmp_path)


def test_an_untyped_pointer_in_the_signature_is_taken(tmp_path):
    k = jaxgraph.Kernel(AXPY, "axpy<float>", signature="void* y, const void* x, float a, int n", arch="sm_90",
                        cache_dir=tmp_path)
    assert [p.dtype for p in k.params][:2] == [None, None]


def test_a_signature_that_agrees_is_taken(tmp_path):
    k = jaxgraph.Kernel(AXPY, "axpy<float>", signature="float* out, const float* in, float s, int count",
                        arch="sm_90", cache_dir=tmp_path)
    assert [p.name for p in k.params] == ["out", "in", "s", "count"]


# ---------------------------------------------------------------------------
# Launching
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def axpy(tmp_path_factory):
    return jaxgraph.Kernel(AXPY, "axpy<float>", arch="sm_90", cache_dir=tmp_path_factory.mktemp("cubins"))


def test_calling_a_kernel_says_to_give_a_grid_and_a_block(axpy):
    with pytest.raises(TypeError, match=re.escape("kernel axpy<float> is not called directly: launch it with a "
                                                  "grid and a block as kernel[grid, block](*args)")):
        axpy(1, 2, 3.0, 4)


def test_a_cpu_jax_array_operand_says_what_asarray_says(axpy):
    # On JAX's CPU device explicitly: on a GPU machine jnp.asarray would give a GPU array.
    x = jax.device_put(np.random.default_rng().random(16, dtype=np.float32), jax.devices("cpu")[0])
    with pytest.raises(TypeError) as launch:
        axpy[1, 32](x, x, 2.0, 16)
    with pytest.raises(TypeError) as wrap:
        jaxgraph.asarray(x)
    assert "takes a device array, got " in str(launch.value)
    assert "(a jax.Array on the CPU): " + HOST_JAX_ARRAY_FIX in str(launch.value)
    assert str(wrap.value).endswith(HOST_JAX_ARRAY_FIX)
    assert "jax.device_put" in HOST_JAX_ARRAY_FIX and "numpy.asarray" in HOST_JAX_ARRAY_FIX
