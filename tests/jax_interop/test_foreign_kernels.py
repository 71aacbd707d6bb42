"""Buffers that other libraries' kernels touch, captured in a jaxgraph graph and replayed in jit (GPU).

A kernel jaxgraph did not launch (CuPy, torch, Triton) may reach a buffer
through memory jaxgraph cannot see, so by default every static buffer such a
kernel receives is copied; ``trust_foreign_kernels=True`` binds the outputs
those kernels get as plain pointers (their inputs stay copied: jaxgraph cannot
tell whether they write them). Both must give numpy's answer on fresh inputs.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgraph  # noqa: E402
from jaxgraph import BindingMode  # noqa: E402
from support.graph_helpers import cupy_stream  # noqa: E402

pytestmark = pytest.mark.gpu

ROWS, COLS = 64, 128
N = ROWS * COLS


def capture(stage, stream):
    """Run ``stage`` once on ``stream`` (libraries compile and load on first use), then capture it."""
    with jaxgraph.stream(stream):
        stage()
    stream.synchronize()
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g, stream=stream):
        stage()
    return g


def check_both_ways(g, x_s, y_s, ref, rng, library):
    """Default: input and output copied; trusted: output bound. Both right on fresh inputs."""
    default = jaxgraph.replayable(g, [x_s], [y_s])
    rows = default.bindings[g.device]
    print(library, "default:", "; ".join(map(str, rows)))
    assert rows[0].mode is BindingMode.COPIED and "did not launch" in rows[0].reason
    assert rows[1].mode is BindingMode.COPIED and "trust_foreign_kernels=True" in rows[1].reason
    trusted = jaxgraph.replayable(g, [x_s], [y_s], trust_foreign_kernels=True)
    rows = trusted.bindings[g.device]
    print(library, "trusted:", "; ".join(map(str, rows)))
    assert rows[0].mode is BindingMode.COPIED          # an input a foreign kernel gets may be written
    assert rows[1].mode is BindingMode.BOUND and rows[1].sites >= 1
    for step in (default, trusted):
        f = jax.jit(lambda x: step(x) * 1.0)
        for _ in range(3):
            x = rng.standard_normal(x_s.shape).astype(np.float32)
            y_s.fill_(np.float32(np.nan))
            np.testing.assert_allclose(np.asarray(f(jnp.asarray(x))), ref(x), rtol=1e-5, atol=1e-6)
        if step is trusted:
            assert np.isnan(y_s.numpy()).all(), "a bound output's static array was written"


def cupy_setup(cupy):
    """Static x and y, their CuPy views, and a jaxgraph stream CuPy launches on."""
    x_s, y_s = jaxgraph.empty((ROWS, COLS)), jaxgraph.empty((ROWS, COLS))
    s = jaxgraph.Stream()
    return x_s, y_s, cupy.asarray(x_s), cupy.asarray(y_s), s, cupy_stream(cupy, s)


def test_cupy_raw_kernel(rng):
    cupy = pytest.importorskip("cupy")
    triple = cupy.RawKernel(r'''extern "C" __global__ void triple(float* y, const float* x, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 3.0f * x[i] + 1.0f; }''', "triple")
    x_s, y_s, x_c, y_c, s, on_s = cupy_setup(cupy)

    def stage():
        with on_s:
            triple(((N + 255) // 256,), (256,), (y_c, x_c, np.int32(N)))

    g = capture(stage, s)
    check_both_ways(g, x_s, y_s, lambda x: 3 * x + 1, rng, "cupy")


def test_cupy_elementwise_kernel_is_copied_by_default_and_right_either_way(rng):
    # CuPy's elementwise kernels take arrays as structs (data pointer, shape, strides):
    # even trusted, an address inside a struct argument is copied.
    cupy = pytest.importorskip("cupy")
    x_s, y_s, x_c, y_c, s, on_s = cupy_setup(cupy)

    def stage():
        with on_s:
            cupy.multiply(x_c, np.float32(-2), out=y_c)

    g = capture(stage, s)
    for trust in (False, True):
        step = jaxgraph.replayable(g, [x_s], [y_s], trust_foreign_kernels=trust)
        rows = step.bindings[g.device]
        print("cupy elementwise, trusted" if trust else "cupy elementwise", "; ".join(map(str, rows)))
        assert rows[0].mode is BindingMode.COPIED
        if not trust:
            assert rows[1].mode is BindingMode.COPIED
        f = jax.jit(step)
        for _ in range(3):
            x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
            np.testing.assert_allclose(np.asarray(f(x)), -2 * x, rtol=1e-6)


def test_torch_softmax(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    x_s, y_s = jaxgraph.empty((ROWS, COLS)), jaxgraph.empty((ROWS, COLS))
    x_t, y_t = (torch.as_tensor(a, device="cuda") for a in (x_s, y_s))
    s = jaxgraph.Stream()
    torch_s = torch.cuda.ExternalStream(int(s))

    def softmax_into(out):                                     # writes y in place: no allocation
        try:
            torch.softmax(x_t, dim=-1, out=out)
        except TypeError:  # a torch without softmax's out= overload
            torch._softmax(x_t, -1, False, out=out)

    def stage():
        with torch.cuda.stream(torch_s):
            softmax_into(y_t)

    g = capture(stage, s)

    def ref(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    check_both_ways(g, x_s, y_s, ref, rng, "torch")


def test_triton_kernel(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        pytest.skip(f"import triton failed: {exc}")

    @triton.jit
    def affine(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 0.5 - 2.0, mask=mask)

    x_s, y_s = jaxgraph.empty((ROWS, COLS)), jaxgraph.empty((ROWS, COLS))
    x_t, y_t = (torch.as_tensor(a, device="cuda") for a in (x_s, y_s))
    s = jaxgraph.Stream()
    torch_s = torch.cuda.ExternalStream(int(s))

    def stage():
        with torch.cuda.stream(torch_s):
            affine[(triton.cdiv(N, 1024),)](x_t, y_t, N, BLOCK=1024)

    g = capture(stage, s)
    check_both_ways(g, x_s, y_s, lambda x: x * np.float32(0.5) - np.float32(2), rng, "triton")
