"""One CUDA graph mixing a jaxgraph kernel with CuPy's and PyTorch's kernels, replayed inside jax.jit.

Run:  python examples/interop_cupy_torch.py

A jaxgraph capture records everything queued on its capture stream, whoever
queues it. Here, on jaxgraph's preallocated arrays:

  1. jaxgraph: h = a * x + b             a custom kernel
  2. CuPy:     y = sin(relu(h) * w)      a cupy.RawKernel, then a CuPy ufunc (out=)
  3. PyTorch:  z = y * y + h             torch.mul and torch.add (out=)

CuPy and PyTorch launch on jaxgraph's capture stream (cupy.cuda.Stream.from_external,
which takes a jaxgraph.Stream through the CUDA stream protocol, and
torch.cuda.ExternalStream) and work on zero-copy views of jaxgraph's arrays
(__cuda_array_interface__). Two rules make other libraries' calls capturable:
run each call once before the capture (it compiles and loads kernels, creates
handles), and inside the capture write only into preallocated arrays (out=):
their memory allocators know nothing of jaxgraph's capture. A library that is
not installed is left out of the graph and of the numpy reference.
"""

import argparse
import os
import sys

import numpy as np

import jaxgraph

SCALE_SHIFT = r"""
extern "C" __global__ void scale_shift(float* h, const float* x, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) h[i] = a * x[i] + b;
}"""
RELU_MUL = r"""
extern "C" __global__ void relu_mul(float* y, const float* h, const float* w, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(h[i], 0.0f) * w[i];
}"""
SHAPE, A, B = (512, 1024), 0.75, -0.25
N = SHAPE[0] * SHAPE[1]
GRID = (N + 255) // 256


def optional(name):
    """The module, or None when it is not installed (or, for torch, sees no GPU)."""
    try:
        module = __import__(name)
    except ImportError:
        return None
    if name == "torch" and not module.cuda.is_available():
        return None
    return module


def cupy_stream(s):
    """CuPy's view of jaxgraph stream ``s``: Stream.from_external (CuPy 14+; older CuPy: ExternalStream)."""
    import cupy

    if hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(s)  # reads s.__cuda_stream__()
    return cupy.cuda.ExternalStream(int(s), s.device)


def reference(x, w, cupy, torch):
    """What the graph computes, in numpy, with the stages of the libraries present."""
    h = np.float32(A) * x + np.float32(B)
    y = np.sin(np.maximum(h, 0) * w) if cupy else h
    return y * y + h if torch else y


def main(argv=None):
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    if jaxgraph.device_count() == 0:
        kernel = jaxgraph.Kernel(SCALE_SHIFT, "scale_shift", arch="sm_90")
        print(f"compiled {kernel}; a CUDA GPU is needed to capture and replay: none found, so this example stops here")
        return 0
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with the other libraries
    import jax
    import jax.numpy as jnp

    cupy, torch = optional("cupy"), optional("torch")
    libraries = ["jaxgraph"] + [m.__name__ for m in (cupy, torch) if m is not None]
    missing = [name for name, module in (("cupy", cupy), ("torch", torch)) if module is None]
    print(f"mixing kernels of {', '.join(libraries)} in one graph"
          + (f" ({' and '.join(missing)}: not installed or without a GPU, left out)" if missing else ""), flush=True)

    rng = np.random.default_rng()
    scale_shift = jaxgraph.Kernel(SCALE_SHIFT, "scale_shift")
    x_s, w_s = (jaxgraph.asarray(rng.standard_normal(SHAPE, np.float32)) for _ in range(2))  # static inputs
    h, y, z = jaxgraph.empty(SHAPE), jaxgraph.empty(SHAPE), jaxgraph.empty(SHAPE)
    s = jaxgraph.Stream()  # the capture stream: every library warms up on it, then is captured there

    stages = [lambda: scale_shift[GRID, 256](h, x_s, A, B, N)]
    out = h
    if cupy is not None:
        relu_mul = cupy.RawKernel(RELU_MUL, "relu_mul")
        h_c, w_c, y_c = (cupy.asarray(a) for a in (h, w_s, y))  # views: no copies
        on_s = cupy_stream(s)                                     # CuPy launches on jaxgraph's stream

        def cupy_stage():
            with on_s:
                relu_mul((GRID,), (256,), (y_c, h_c, w_c, np.int32(N)))
                cupy.sin(y_c, out=y_c)

        stages.append(cupy_stage)
        out = y
    if torch is not None:
        src_t, h_t, z_t = (torch.as_tensor(a, device="cuda") for a in (out, h, z))
        torch_s = torch.cuda.ExternalStream(int(s))               # torch launches on jaxgraph's stream

        def torch_stage():
            with torch.cuda.stream(torch_s):
                torch.mul(src_t, src_t, out=z_t)
                torch.add(z_t, h_t, out=z_t)

        stages.append(torch_stage)
        out = z

    with jaxgraph.stream(s):  # 1. once before the capture (compiles, loads, sets up), on the same stream
        for stage in stages:
            stage()
    s.synchronize()
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g, stream=s):  # 2. capture all of it
        for stage in stages:
            stage()

    x, w = rng.standard_normal(SHAPE, np.float32), rng.standard_normal(SHAPE, np.float32)
    x_s.copy_(x)
    w_s.copy_(w)
    out.fill_(np.float32(np.nan))
    g.replay()  # 3. eagerly
    np.testing.assert_allclose(out.numpy(), reference(x, w, cupy, torch), rtol=1e-5, atol=1e-5)
    print("eager replay of the mixed graph matches numpy", flush=True)

    step = jaxgraph.replayable(g, inputs=[x_s, w_s], outputs=[out])  # 4. inside jit
    f = jax.jit(lambda x, w: jnp.tanh(step(x * 2.0, w)) * 3.0)
    for _ in range(3):
        x, w = rng.standard_normal(SHAPE, np.float32), rng.standard_normal(SHAPE, np.float32)
        want = np.tanh(reference(x * np.float32(2), w, cupy, torch)) * 3
        np.testing.assert_allclose(np.asarray(f(x, w)), want, rtol=1e-5, atol=1e-5)
    print(f"the graph of {', '.join(libraries)} kernels replayed inside jax.jit matches numpy")
    print("how the replay meets XLA's buffers:", "; ".join(str(r) for r in step.bindings[g.device]))
    print(g)
    return 0


if __name__ == "__main__":
    sys.exit(main())
