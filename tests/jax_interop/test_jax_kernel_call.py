"""JAX interop on the GPU: ``Kernel.jax_call`` inside and outside jit, checked against numpy.

Every test draws fresh random inputs. Graph replay in jit is in test_jax_gpu.py.

Tests internals (listed in tests/README.md): ``_cuda.native`` launch table,
``_kernel_call.kernel_id``; a collected kernel stays in the native launch table.
"""

import gc
import os

import numpy as np
import pytest

# Leave device memory to jaxgraph's allocations too (set before JAX's backend starts).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgraph  # noqa: E402
from conftest import enable_x64  # noqa: E402
from support.graph_helpers import JAX_SRC, jax_kernels  # noqa: E402
from support.kernel_sources import INC  # noqa: E402

pytestmark = pytest.mark.gpu

N = 4096


@pytest.fixture(scope="module")
def kernels():
    return jax_kernels()


# ---------------------------------------------------------------------------
# Kernel.jax_call
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, name", [(np.float32, "axpy_out<float>"), (np.float64, "axpy_out<double>"),
                                         (np.int32, "axpy_out<int>")])
@pytest.mark.parametrize("n", [1, 255, 4099, 100_003])
def test_kernel_call_in_jit_matches_numpy(kernels, rng, dtype, name, n):
    k = kernels[name]
    with enable_x64(dtype == np.float64):
        if np.issubdtype(dtype, np.integer):
            x, y, a = rng.integers(-1000, 1000, n).astype(dtype), rng.integers(-1000, 1000, n).astype(dtype), 3
        else:
            x, y, a = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype), -1.75
        f = jax.jit(lambda x, y: k.jax_call(jax.ShapeDtypeStruct(x.shape, x.dtype), x, y, a, n))
        out = f(x, y)
        assert out.dtype == dtype and out.shape == (n,)
        expected = (dtype(a) * x + y).astype(dtype)
        if np.issubdtype(dtype, np.integer):
            np.testing.assert_array_equal(np.asarray(out), expected)
        else:  # the GPU may fuse a * x + y into one FMA
            np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6 if dtype == np.float32 else 1e-14,
                                       atol=1e-6 if dtype == np.float32 else 1e-14)


def test_kernel_call_outside_jit_and_composed_with_xla_ops(kernels, rng):
    k = kernels["sum_diff"]
    n = 5000
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = jax.ShapeDtypeStruct((n,), jnp.float32)
    s, d = k.jax_call(out, out, a, b, n)  # eager
    np.testing.assert_allclose(np.asarray(s), a + b, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(d), a - b, rtol=1e-6)

    @jax.jit
    def f(a, b):
        s, d = k.jax_call(out, out, a * 2.0, jnp.sin(b), n, grid=(n + 127) // 128, block=128)
        return s * d + 1.0

    a2, b2 = 2 * a, np.sin(b)
    np.testing.assert_allclose(np.asarray(f(a, b)), (a2 + b2) * (a2 - b2) + 1, rtol=1e-4, atol=1e-5)


def test_kernel_call_inout_aliases_and_donation_reuses_the_buffer(kernels, rng):
    k = kernels["saxpy"]
    x, y = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    expected = np.float32(2.5) * x + y
    plain = jax.jit(lambda y, x: k.jax_call(y, x, 2.5, N, inout=("y",)))
    y_dev = jnp.asarray(y)
    out = plain(y_dev, x)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(y_dev), y)  # not donated: the input is untouched

    donating = jax.jit(lambda y, x: k.jax_call(y, x, 2.5, N, inout=("y",)), donate_argnums=0)
    y_dev = jnp.asarray(y)
    before = y_dev.unsafe_buffer_pointer()
    out = donating(y_dev, x)
    assert out.unsafe_buffer_pointer() == before  # updated in place: no copy
    assert y_dev.is_deleted()
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6, atol=1e-6)


def test_kernel_call_scalar_types_reach_the_kernel(kernels):
    k = kernels["scalars"]
    with enable_x64(True):
        out = jax.jit(lambda: k.jax_call(jax.ShapeDtypeStruct((8,), jnp.float64), -3, 65535, -(2**40),
                                         2**32 - 1, 1.5, -0.25, 0.5, True, grid=1, block=1))()
        np.testing.assert_array_equal(np.asarray(out), [-3, 65535, -(2**40), 2**32 - 1, 1.5, -0.25, 0.5, 1])


@pytest.mark.parametrize("shared_mem", [1024 * 4, 64 * 1024])  # above 48 KiB needs the raised limit
def test_kernel_call_with_dynamic_shared_memory(kernels, rng, shared_mem):
    k = kernels["block_sum_dynamic"]
    n, block = 10_000, 1024
    x = rng.standard_normal(n).astype(np.float32)
    out = jax.jit(lambda x: k.jax_call(jax.ShapeDtypeStruct((1,), jnp.float32), x, n, grid=1, block=block,
                                       shared_mem=shared_mem))(x)
    np.testing.assert_allclose(np.asarray(out)[0], x.sum(dtype=np.float64), rtol=1e-4, atol=1e-3)


def test_kernel_call_under_vmap(kernels, rng):
    k = kernels["axpy_out<float>"]
    xs, ys = rng.standard_normal((5, 300)).astype(np.float32), rng.standard_normal((5, 300)).astype(np.float32)
    f = jax.jit(jax.vmap(lambda x, y: k.jax_call(jax.ShapeDtypeStruct((300,), jnp.float32), x, y, 0.5, 300)))
    np.testing.assert_allclose(np.asarray(f(xs, ys)), np.float32(0.5) * xs + ys, rtol=1e-6, atol=1e-6)


def test_a_collected_kernel_stays_in_the_launch_table_for_the_functions_that_call_it(rng):
    # A compiled function (or XLA's recording of it) may launch the kernel after its Kernel is gone:
    # the entry and the loaded code stay until the process exits (tests/jax_interop/test_recorded_lifetime.py
    # does the same under command buffers, in fresh processes).
    import weakref

    from jaxgraph.diagnostics import native_module

    launch = native_module("launch")
    k = jaxgraph.Kernel(JAX_SRC, "inc")
    f = jax.jit(lambda y: k.jax_call(y, N, inout=("y",)))
    x = rng.standard_normal(N).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), x + 1, rtol=1e-6)
    gc.collect()
    live = launch.live_kernels()
    ref = weakref.ref(k)
    del k
    gc.collect()
    assert ref() is None and launch.live_kernels() == live
    x = rng.standard_normal(N).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), x + 1, rtol=1e-6)


def test_kernels_of_the_same_code_share_an_id_that_outlives_any_one_of_them(rng):
    # The id is the code's (the same in every process); the table keeps the first Kernel of that code traced
    # (and its library) until the process exits, so a function traced with any of them keeps working after
    # all of them are collected.
    import weakref

    from jaxgraph._jax_interop import kernel_call as _kernel_call
    from jaxgraph.diagnostics import native_module

    launch = native_module("launch")
    source = INC.replace("inc(", "inc_shared(")
    first, second = jaxgraph.Kernel(source, "inc_shared"), jaxgraph.Kernel(source, "inc_shared")
    f = jax.jit(lambda y: first.jax_call(y, N, inout=("y",)))
    g = jax.jit(lambda y: second.jax_call(y, N, inout=("y",)))
    x = rng.standard_normal(N).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), x + 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g(x)), x + 1, rtol=1e-6)
    assert _kernel_call.kernel_id(first) == _kernel_call.kernel_id(second)
    gc.collect()
    live = launch.live_kernels()
    ref = weakref.ref(second)
    del second, g
    gc.collect()
    assert ref() is None and launch.live_kernels() == live
    x = rng.standard_normal(N).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), x + 1, rtol=1e-6)
    ref = weakref.ref(first)
    del first
    gc.collect()
    assert ref() is None and launch.live_kernels() == live     # the code stays for f (and XLA's recordings)
    np.testing.assert_allclose(np.asarray(f(x)), x + 1, rtol=1e-6)


@pytest.mark.parametrize("params", [[1], [1, -1, -1]])
def test_a_launch_with_another_number_of_parameter_codes_than_the_kernel_has_is_refused(kernels, params):
    # jaxgraph_launch takes one code per kernel parameter; the handler compares the count with the kernel's
    # (inc(float* y, int n): 2), so the driver never reads arguments that are not there.
    from jaxgraph._jax_interop import kernel_call as _kernel_call

    k = kernels["inc"]
    kid = _kernel_call.kernel_id(k)
    f = jax.jit(lambda y: _kernel_call.jaxgraph_launch(
        kid, [y], [jax.ShapeDtypeStruct((N,), jnp.float32)], grid=(N // 256, 1, 1), block=(256, 1, 1),
        shared_mem=0, params=params, scalars=[N], input_output_aliases={0: 0}))
    with pytest.raises(Exception, match=f"kernel inc takes 2 parameters, but the call passes {len(params)} "
                                        "parameter codes"):
        np.asarray(f(jnp.zeros(N, jnp.float32)))
