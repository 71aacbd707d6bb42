"""Probe: what the replay handler's per-call steps cost on the host, at 100k kernels.

At 100k kernels the handler's host time per call (``benchmarks/large_graphs.py``) is
30-44 us: ``cudaGraphLaunch`` ~10 us, the two buffer copies 13-26 us, the
rest ~6 us. This times each step alone, on a stream with graphs in flight (as
XLA's stream is when the host runs ahead), for a chain of N ``add_one`` kernels
on 1024 floats instantiated launchable from the device (as the handler does
from 4096 kernels on), over two alternating input/output pairs (XLA's
buffers in a feedback loop):

- ``overhead``: ``cudaGetLastError`` (what a binding call costs from Python);
- ``is_capturing``: ``cudaStreamIsCapturing`` (the handler asks on every call), and
  ``capture_info``: ``cuStreamGetCaptureInfo``;
- ``runtime_copies``: ``cudaMemcpyAsync`` in, ``cuGraphLaunch``, ``cudaMemcpyAsync`` out (the handler now);
- ``driver_copies``: the same with ``cuMemcpyDtoDAsync``;
- ``memcpy_nodes``: the copies as memcpy nodes of the graph (one before its
  first kernel, one after its last), pointed at the call's buffers with
  ``cudaGraphExecMemcpyNodeSetParams1D``, then ``cuGraphLaunch``.

Each mode's outputs are checked exactly against numpy (fresh integer input,
outputs poisoned first). Prints host us per step (median over ``--calls``).

``--with-jax`` starts JAX's GPU backend first (its threads and streams live
in the process, as they do around the handler), to see whether they slow the
same calls.

``python benchmarks/probes/handler_parts_probe.py [--sizes 1000,100000] [--calls 12] [--with-jax]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

__all__ = ["main"]

ADD_ONE = r"""extern "C" __global__ void add_one(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] + 1.0f; }"""
SIZE, NBYTES = 1024, 4096


def check(result, what):
    """Unwrap a cuda.bindings ``(err, *values)`` tuple; raise naming ``what`` and the error."""
    err, *rest = result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    return rest[0] if len(rest) == 1 else (rest or None)


def timed(samples: dict, key: str, fn, what: str):
    t0 = time.perf_counter_ns()
    out = check(fn(), what)
    samples.setdefault(key, []).append((time.perf_counter_ns() - t0) / 1e3)
    return out


def probe(n: int, calls: int, kernel, stream, rng: np.random.Generator) -> None:
    from cuda.bindings import driver as d
    from cuda.bindings import runtime as rt
    from cuda.core import LaunchConfig, launch

    s = stream.handle
    alloc = lambda: int(check(d.cuMemAlloc(NBYTES), "cuMemAlloc"))  # noqa: E731
    x_s, y_s = alloc(), alloc()                      # the graph's static input and output
    xla = [(alloc(), alloc()) for _ in range(2)]     # XLA's buffers: (input, output), alternating
    cfg = LaunchConfig(grid=4, block=256)
    check(d.cuStreamBeginCapture(s, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture")
    for i in range(n):
        launch(stream, cfg, kernel, np.uintp(y_s), np.uintp(x_s if i == 0 else y_s), np.int32(SIZE))
    graph = check(d.cuStreamEndCapture(s), "cuStreamEndCapture")

    def device_exec(g):
        params = d.CUDA_GRAPH_INSTANTIATE_PARAMS()
        params.flags = int(d.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
        ex = check(d.cuGraphInstantiateWithParams(g, params), "cuGraphInstantiateWithParams(DEVICE_LAUNCH)")
        check(d.cuGraphUpload(ex, s), "cuGraphUpload")
        return ex

    plain = device_exec(graph)
    # The variant with memcpy nodes: copy in before the roots, copy out after the leaves.
    with_nodes = check(d.cuGraphClone(graph), "cuGraphClone")
    _, count = check(d.cuGraphGetRootNodes(with_nodes, 0), "cuGraphGetRootNodes")
    roots, _ = check(d.cuGraphGetRootNodes(with_nodes, count), "cuGraphGetRootNodes")
    _, count = check(d.cuGraphGetNodes(with_nodes, 0), "cuGraphGetNodes")
    nodes, _ = check(d.cuGraphGetNodes(with_nodes, count), "cuGraphGetNodes")
    node = lambda handle: rt.cudaGraphNode_t(int(handle))  # noqa: E731  (a driver node for the runtime API)
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    copy_in = check(rt.cudaGraphAddMemcpyNode1D(with_nodes, None, 0, int(x_s), int(xla[0][0]), NBYTES, kind),
                    "cudaGraphAddMemcpyNode1D (in)")
    for root in roots:
        check(rt.cudaGraphAddDependencies(with_nodes, [copy_in], [node(root)], None, 1) + (None,),
              "cudaGraphAddDependencies")
    last = node(nodes[-1])  # the chain's last kernel (capture order)
    copy_out = check(rt.cudaGraphAddMemcpyNode1D(with_nodes, [last], 1, int(xla[0][1]), int(y_s), NBYTES, kind),
                     "cudaGraphAddMemcpyNode1D (out)")
    noded = device_exec(with_nodes)

    hosts = [rng.integers(-1000, 1000, SIZE).astype(np.float32) for _ in xla]
    nan = np.full(SIZE, np.nan, np.float32)
    samples: dict = {}

    def put(ptr, array):
        check(d.cuMemcpyHtoD(ptr, array.ctypes.data, NBYTES), "cuMemcpyHtoD")

    def verify(mode):
        check(d.cuStreamSynchronize(s), "cuStreamSynchronize")
        for (_, out), h in zip(xla, hosts):
            got = np.empty(SIZE, np.float32)
            check(d.cuMemcpyDtoH(got.ctypes.data, out, NBYTES), "cuMemcpyDtoH")
            bad = np.flatnonzero(got != h + np.float32(n))
            status = "exact" if bad.size == 0 else f"WRONG at {bad.size} of {SIZE}"
            samples.setdefault(f"{mode} check", []).append(status)

    for mode in ("runtime_copies", "driver_copies", "memcpy_nodes"):
        for (inp, out), h in zip(xla, hosts):
            put(inp, h)
            put(out, nan)
        for call in range(calls):
            inp, out = xla[call % 2]
            timed(samples, "overhead", lambda: rt.cudaGetLastError() + (None,), "cudaGetLastError")
            timed(samples, "is_capturing", lambda: rt.cudaStreamIsCapturing(s), "cudaStreamIsCapturing")
            timed(samples, "capture_info", lambda: d.cuStreamGetCaptureInfo(s), "cuStreamGetCaptureInfo")
            if mode == "memcpy_nodes":
                timed(samples, f"{mode}: set copy-in node", lambda: rt.cudaGraphExecMemcpyNodeSetParams1D(
                    noded, copy_in, int(x_s), int(inp), NBYTES, kind) + (None,), "set copy-in")
                timed(samples, f"{mode}: set copy-out node", lambda: rt.cudaGraphExecMemcpyNodeSetParams1D(
                    noded, copy_out, int(out), int(y_s), NBYTES, kind) + (None,), "set copy-out")
                timed(samples, f"{mode}: launch", lambda: d.cuGraphLaunch(noded, s) + (None,), "cuGraphLaunch")
                continue
            if mode == "runtime_copies":
                copy = lambda dst, src: rt.cudaMemcpyAsync(int(dst), int(src), NBYTES, kind, s) + (None,)  # noqa: E731
            else:
                copy = lambda dst, src: d.cuMemcpyDtoDAsync(dst, src, NBYTES, s) + (None,)  # noqa: E731
            timed(samples, f"{mode}: copy in", lambda: copy(x_s, inp), "copy in")
            timed(samples, f"{mode}: launch", lambda: d.cuGraphLaunch(plain, s) + (None,), "cuGraphLaunch")
            timed(samples, f"{mode}: copy out", lambda: copy(out, y_s), "copy out")
        verify(mode)
    print(f"\nN={n}, {calls} calls per mode, host us (median, min-max):")
    for key, values in samples.items():
        if key.endswith("check"):
            print(f"  {key}: {', '.join(values)}")
        else:
            print(f"  {key}: {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,100000", help="kernels per graph, comma-separated")
    p.add_argument("--calls", type=int, default=12, help="calls per mode (default %(default)s)")
    p.add_argument("--with-jax", action="store_true", help="start JAX's GPU backend first")
    args = p.parse_args(argv)
    if args.with_jax:
        import os

        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax
        import jax.numpy as jnp

        jax.jit(lambda x: x * 2 + 1)(jnp.ones(1024)).block_until_ready()
        print(f"JAX {jax.__version__} up on {jax.devices()}")
    from cuda.core import Device, Program, ProgramOptions

    try:
        dev = Device()
        dev.set_current()
    except Exception as exc:  # no driver (a CPU machine) or no device
        print(f"no CUDA device: the probe needs a GPU ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    arch = "sm_" + "".join(str(v) for v in dev.compute_capability)
    kernel = Program(ADD_ONE, "c++", ProgramOptions(arch=arch)).compile("cubin").get_kernel("add_one")
    stream = dev.create_stream()
    for n in (int(v) for v in args.sizes.split(",")):
        probe(n, args.calls, kernel, stream, np.random.default_rng())
    return 0


if __name__ == "__main__":
    sys.exit(main())
