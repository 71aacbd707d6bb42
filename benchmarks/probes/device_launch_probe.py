"""Probe: does device-side graph launch cut the host cost of replaying a huge graph?

A chain of N ``add_one`` kernels on 1024 floats (the first reads ``x``, the rest update ``out``):
a. ``cuGraphLaunch`` of a normal executable: host us per launch (median), device us per kernel;
b. the graph instantiated with ``CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH``, launched from the host;
c. a one-node launcher graph whose kernel (NVRTC ``-rdc``, linked with ``libcudadevrt.a``) calls
   ``cudaGraphLaunch(exec, cudaStreamGraphTailLaunch)`` on (b): host and device time, the device-side
   ``cudaError_t``, ``out == x + N`` exactly (fresh integer input, output poisoned);
d. copies of ``out`` right after the launcher (same stream; another stream behind an event) see it;
e. ``cuGraphUpload`` after rewriting one node of (b) in place; (last N) a launch without it.

``python benchmarks/probes/device_launch_probe.py [--sizes 1000,10000,100000]``. Without a GPU it only
links the launcher for ``--arch`` (sm_90), prints the cubin's size, and exits 1.
"""

from __future__ import annotations

import argparse
import faulthandler
import glob
import os
import statistics
import sys
import time

import numpy as np
from cuda.bindings import driver as d  # imports without a driver; the first call needs one

__all__ = ["build_launcher", "main"]

ADD_ONE = r"""extern "C" __global__ void add_one(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] + 1.0f; }"""

# NVRTC declares the device runtime's API itself (cudaGraphLaunch, cudaGraphExec_t, cudaStream_t): no
# header is needed; the definition comes from libcudadevrt.a at link time.
LAUNCHER = r"""extern "C" __global__ void jaxgraph_device_launch(unsigned long long exec, int* status) {
  // cudaStreamGraphTailLaunch: runs after this graph's kernels, and this graph completes only with it.
  *status = (int)cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)0x0100000000000000ull); }"""


def find_cudadevrt() -> str:
    """Path of ``libcudadevrt.a``: the pip wheel's (nvidia/cu13/lib), else $CUDA_HOME's or /usr/local/cuda's."""
    roots = [os.path.join(p, "nvidia", "cu13", "lib") for p in sys.path if p]
    homes = (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")
    roots += [os.path.join(h, lib) for h in homes if h for lib in ("lib64", "lib")]
    for hit in (hit for root in roots for hit in glob.glob(os.path.join(root, "libcudadevrt.a"))):
        return hit
    raise FileNotFoundError(f"libcudadevrt.a not found (looked in {roots}); pip install nvidia-cuda-runtime")


def build_launcher(arch: str):
    """NVRTC (-rdc) + link with libcudadevrt.a -> (linked cubin ObjectCode, linker backend name)."""
    from cuda.core import Linker, LinkerOptions, ObjectCode, Program, ProgramOptions

    rel = Program(LAUNCHER, "c++", ProgramOptions(arch=arch, relocatable_device_code=True)).compile("cubin")
    linker = Linker(rel, ObjectCode.from_library(find_cudadevrt()), options=LinkerOptions(arch=arch))
    # A copy of the bytes while the linker lives: the linked code may point into the linker's memory
    # (the launcher kernel loaded from it without this copy crashed the process on the H100).
    cubin = bytes(linker.link("cubin").code)
    linker.close()
    return ObjectCode.from_cubin(cubin), str(Linker.which_backend())


def check(result, what):
    """Unwrap a cuda.bindings ``(err, *values)`` tuple; raise naming ``what`` and the CUresult."""
    err, *rest = result
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {d.CUresult(err).name}")
    return rest[0] if len(rest) == 1 else (rest or None)


def captured(stream, body):
    """Capture ``body()`` on ``stream`` -> (graph, its uploaded normal executable)."""
    s = stream.handle
    check(d.cuStreamBeginCapture(s, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture")
    body()
    graph = check(d.cuStreamEndCapture(s), "cuStreamEndCapture")
    ex = check(d.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    check(d.cuGraphUpload(ex, s), "cuGraphUpload")
    return graph, ex


def timed_launches(label, ex, stream, events, count, kernels):
    """Print host us per ``cuGraphLaunch(ex)`` and device us per kernel (medians of ``count`` synced launches)."""
    host, dev = [], []
    for _ in range(count):
        check(d.cuEventRecord(events[0], stream), "cuEventRecord")
        t0 = time.perf_counter_ns()
        check(d.cuGraphLaunch(ex, stream), f"cuGraphLaunch ({label})")
        host.append((time.perf_counter_ns() - t0) / 1e3)
        check(d.cuEventRecord(events[1], stream), "cuEventRecord")
        check(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
        dev.append(check(d.cuEventElapsedTime(*events), "cuEventElapsedTime") * 1e3 / kernels)
    h = statistics.median(host)
    print(f"  {label}: host {h:.1f} us/launch ({h * 1e3 / kernels:.2f} ns/kernel), device "
          f"{statistics.median(dev):.4f} us/kernel")


def probe(n, launch_kernel, stream, args, last):
    """Run a-e for a chain of ``n`` kernels; print every figure."""
    from cuda.bindings import runtime as rt
    from cuda.core import LaunchConfig, launch

    size, nbytes, s, cfg = 1024, 4096, stream.handle, LaunchConfig(grid=4, block=256)
    bufs = [check(d.cuMemAlloc(nbytes), "cuMemAlloc") for _ in range(5)]
    x_d, out_d, copy_d, copy2_d, status_d = (np.uintp(int(b)) for b in bufs)
    t0 = time.perf_counter()
    graph, ex = captured(stream, lambda: [launch(stream, cfg, args.add_one, out_d, x_d if i == 0 else out_d,
                                                 np.int32(size)) for i in range(n)])
    print(f"\nN={n}: capture + instantiate {time.perf_counter() - t0:.2f} s")
    ev = [check(d.cuEventCreate(0), "cuEventCreate") for _ in range(2)]  # (not freed: a probe)
    timed_launches("a. normal exec, host launch", ex, s, ev, args.launches, n)

    params = d.CUDA_GRAPH_INSTANTIATE_PARAMS()
    params.flags = int(d.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
    t0 = time.perf_counter()
    err, dex = d.cuGraphInstantiateWithParams(graph, params)
    if err != d.CUresult.CUDA_SUCCESS:
        print(f"  b. DEVICE_LAUNCH instantiate failed: {d.CUresult(err).name}, constraint: "
              f"{d.CUgraphInstantiateResult(int(params.result_out)).name}, node {params.hErrNode_out}")
        return False
    check(d.cuGraphUpload(dex, s), "cuGraphUpload(device exec)")
    print(f"  b. DEVICE_LAUNCH instantiate + upload {time.perf_counter() - t0:.2f} s "
          f"(result {d.CUgraphInstantiateResult(int(params.result_out)).name})")
    timed_launches("b. device-launchable exec, host launch", dex, s, ev, args.launches, n)

    print("  c. capturing the launcher graph (its kernel loads now)")  # (a crash here is the loading's)
    lgraph, lex = captured(stream, lambda: launch(stream, LaunchConfig(grid=1, block=1), launch_kernel,
                                                  np.uint64(int(dex)), status_d))
    rng, nan = np.random.default_rng(n), 0x7FC00000  # a quiet NaN's bits

    def run_checked(label, times=1):
        x = rng.integers(-1000, 1000, size).astype(np.float32)  # integers: x + N is exact in float32
        check(d.cuMemcpyHtoD(int(x_d), x.ctypes.data, nbytes), "cuMemcpyHtoD")
        for buf, word, count in ((out_d, nan, size), (copy_d, nan, size), (copy2_d, nan, size), (status_d, 99, 1)):
            check(d.cuMemsetD32Async(int(buf), word, count, s), "cuMemsetD32Async(poison)")
        for _ in range(times):
            check(d.cuGraphLaunch(lex, s), "cuGraphLaunch(launcher)")
        # d. the next op on the stream, and one on another stream behind an event, read out.
        check(d.cuMemcpyDtoDAsync(int(copy_d), int(out_d), nbytes, s), "cuMemcpyDtoDAsync")
        check(d.cuEventRecord(ev[1], s), "cuEventRecord")
        check(d.cuStreamWaitEvent(args.other, ev[1], 0), "cuStreamWaitEvent")
        check(d.cuMemcpyDtoDAsync(int(copy2_d), int(out_d), nbytes, args.other), "cuMemcpyDtoDAsync(other)")
        check(d.cuStreamSynchronize(args.other), "sync other")
        check(d.cuStreamSynchronize(s), "sync")
        (got, seen, seen2), st = (np.empty(size, np.float32) for _ in range(3)), np.zeros(1, np.int32)
        for host_buf, dev_buf in ((got, out_d), (seen, copy_d), (seen2, copy2_d), (st, status_d)):
            check(d.cuMemcpyDtoH(host_buf.ctypes.data, int(dev_buf), host_buf.nbytes), "cuMemcpyDtoH")
        same = [np.array_equal(a, x + np.float32(n)) for a in (got, seen, seen2)]
        err_name = rt.cudaError_t(int(st[0])).name if int(st[0]) != 99 else "status never written"
        print(f"  {label}: device cudaGraphLaunch -> {err_name}; out == x + N: {same[0]}; copy on the same "
              f"stream == x + N: {same[1]}; copy on another stream after an event == x + N: {same[2]}")
        return all(same)

    ok = run_checked("c/d. one launcher launch")
    ok &= run_checked("c/d. five launcher launches back to back", times=5)
    timed_launches("c. device launch via the launcher graph", lex, s, ev, args.launches, n)
    ok &= run_checked("c/d. after the timed launches")

    # e. rewrite one kernel node of dex in place (same params), then re-upload it; last size: also without.
    node = check(d.cuGraphGetNodes(graph, 1), "cuGraphGetNodes")[0][0]
    kp = check(d.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
    ups = []
    for _ in range(5):
        check(d.cuGraphExecKernelNodeSetParams(dex, node, kp), "cuGraphExecKernelNodeSetParams")
        t0 = time.perf_counter_ns()
        check(d.cuGraphUpload(dex, s), "cuGraphUpload(after rewrite)")
        ups.append((time.perf_counter_ns() - t0) / 1e3)
        check(d.cuStreamSynchronize(s), "sync")
    print(f"  e. cuGraphUpload after rewriting one node: host {statistics.median(ups):.1f} us (median of 5)")
    ok &= run_checked("e. device launch after rewrite + re-upload")
    if last:
        check(d.cuGraphExecKernelNodeSetParams(dex, node, kp), "cuGraphExecKernelNodeSetParams")
        run_checked("e. device launch after a rewrite WITHOUT re-upload (information only)")
        check(d.cuGraphUpload(dex, s), "cuGraphUpload")
        ok &= run_checked("e. device launch after re-uploading again")
    print(f"  N={n}: {'ALL CORRECT' if ok else 'WRONG RESULTS'}")
    for call, h in [(d.cuGraphExecDestroy, e) for e in (lex, dex, ex)] + [(d.cuGraphDestroy, g) for g in (
            lgraph, graph)] + [(d.cuMemFree, b) for b in bufs]:
        check(call(h), call.__name__)
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1000,10000,100000")
    p.add_argument("--launches", type=int, default=20)
    p.add_argument("--arch", default=None, help="launcher arch without a GPU (default sm_90)")
    args = p.parse_args()
    faulthandler.enable()  # a crash in a driver call names the line that made it
    from cuda.core import Device, Program, ProgramOptions

    try:
        dev = Device(0)
        dev.set_current()
        arch = f"sm_{dev.compute_capability.major}{dev.compute_capability.minor}"
    except Exception as exc:  # no driver or no device: check the compile + link, then say what is missing
        linked, backend = build_launcher(args.arch or "sm_90")
        print(f"launcher linked ({backend}): {len(linked.code)} bytes of cubin for {args.arch or 'sm_90'}\n"
              f"no CUDA GPU here ({type(exc).__name__}: {exc}): the measurements need one")
        return 1
    linked, backend = build_launcher(arch)
    print(f"{dev.name}, {arch}; launcher linked with {backend} ({len(linked.code)} bytes), "
          f"libcudadevrt: {find_cudadevrt()}")
    launch_kernel = linked.get_kernel("jaxgraph_device_launch")
    args.add_one = Program(ADD_ONE, "c++", ProgramOptions(arch=arch)).compile("cubin").get_kernel("add_one")
    stream, args.other = dev.create_stream(), dev.create_stream().handle
    sizes, ok = [int(v) for v in args.sizes.split(",")], True
    for n in sizes:
        try:
            ok &= probe(n, launch_kernel, stream, args, n == sizes[-1])
        except RuntimeError as exc:  # a CUDA error, named by check(); later sizes may still run
            print(f"N={n}: {exc}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
