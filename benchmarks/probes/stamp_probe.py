"""Where replay in jit loses its few percent: inside the graph, or between two calls?

Run:  python benchmarks/probes/stamp_probe.py [--n 100 1000] [--calls 200] [--rounds 3]

The workload's chain (``benchmarks/harness/workload.py``) with its first and last
kernel swapped for ``stamp_add_one``: the same ``y = x + 1``, and thread 0
also writes the GPU's ``%globaltimer`` (ns) to a log in device memory: the
first kernel when the call's graph starts, the last one when its last kernel
starts, then counts the call. The same captured graph is launched by
``cuGraphLaunch`` from a Python loop (``raw``, the harness's floor) and called
as ``jax.jit(replayable)`` on a fixed input (``jit_loop``), and 50 times in
a ``lax.fori_loop`` in one jit (``fori_loop``, as the gray_scott example runs
its step: between two replays, XLA's loop counter), and twice in one jitted
function (``jit_pair``: the gap inside one execution against the gap between
two). Per call:

- ``span``: first kernel's start to last kernel's start (N - 1 kernels);
- ``gap``: last kernel's start to the next call's first kernel's start (the
  last kernel, plus whatever the device did or waited for between calls).

Medians over the calls after the first 10 of each sample, per round.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.probe_kit import driver_call as call  # noqa: E402
from benchmarks.harness.workload import BLOCK, ELEMENTS, GRID, check_result, random_input  # noqa: E402

CAP = 4096
STAMP_SOURCE = r"""
extern "C" __global__ void add_one(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
extern "C" __global__ void stamp_add_one(float* y, const float* x, int n, unsigned long long* log, int first) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
  if (i == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    unsigned long long k = log[0] % 4096;
    if (first) {
      log[1 + 2 * k] = t;
    } else {
      log[2 + 2 * k] = t;
      log[0] = log[0] + 1;
    }
  }
}
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("stamp_probe.py needs a CUDA GPU: none found")
        return 0
    import jax
    import jax.numpy as jnp
    from cuda.bindings import driver

    from jaxgraph.diagnostics import counters

    rng = np.random.default_rng()
    add = jaxgraph.Kernel(STAMP_SOURCE, "add_one")[GRID, BLOCK]
    stamp = jaxgraph.Kernel(STAMP_SOURCE, "stamp_add_one")[GRID, BLOCK]
    stream = jaxgraph.Stream()
    h = driver.CUstream(int(stream))

    for n in args.n:
        x_s, y_s = jaxgraph.zeros(ELEMENTS, np.float32), jaxgraph.zeros(ELEMENTS, np.float32)
        log = jaxgraph.zeros(1 + 2 * CAP, np.uint64)
        g = jaxgraph.CUDAGraph()
        with jaxgraph.graph(g):
            stamp(y_s, x_s, ELEMENTS, log, 1)
            for _ in range(n - 2):
                add(y_s, y_s, ELEMENTS)
            stamp(y_s, y_s, ELEMENTS, log, 0)
        exe = driver.CUgraphExec(g.raw_cuda_graph_exec())
        f = jax.jit(jaxgraph.replayable(g, inputs=[x_s], outputs=[y_s]))
        xh = random_input(rng)
        x = jnp.asarray(xh)
        check_result(f(x), xh, n)

        def raw(calls: int) -> None:
            for _ in range(calls):
                call("cuGraphLaunch", exe, h)
            call("cuStreamSynchronize", h)

        first = {}

        def jit(calls: int) -> None:
            before = counters()["handler_ns"]
            t = time.perf_counter_ns()
            out = f(x)
            first["dispatch"] = (time.perf_counter_ns() - t) / 1000
            first["handler"] = (counters()["handler_ns"] - before) / 1000
            for _ in range(calls - 1):
                out = f(x)
            t = time.perf_counter_ns()
            jax.block_until_ready(out)
            first["wait"] = (time.perf_counter_ns() - t) / 1000

        looped = jax.jit(lambda v: jax.lax.fori_loop(0, 50, lambda i, u: f(u), v))
        check_result(looped(x), xh, 50 * n)

        def fori(calls: int) -> None:
            out = None
            for _ in range(max(1, calls // 50)):
                out = looped(x)
            jax.block_until_ready(out)

        paired = jax.jit(lambda v: f(f(v)))  # two replays in one execution: XLA's gap, not PjRt's
        check_result(paired(x), xh, 2 * n)

        def pair(calls: int) -> None:
            out = None
            for _ in range(max(1, calls // 2)):
                out = paired(x)
            jax.block_until_ready(out)

        trivial = jax.jit(lambda v: v + 1)
        jax.block_until_ready(trivial(x))

        for r in range(args.rounds):
            for name, body in (("raw", raw), ("jit_loop", jit), ("fori_loop", fori), ("jit_pair", pair)):
                jaxgraph.synchronize()
                log.fill_(0)
                jaxgraph.synchronize()
                t0 = time.time_ns()
                body(args.calls)
                t1 = time.time_ns()
                jaxgraph.synchronize()
                entries = log.numpy()
                count = int(entries[0])
                starts = entries[1:1 + 2 * count:2].astype(np.int64)
                lasts = entries[2:2 + 2 * count:2].astype(np.int64)
                span = (lasts - starts)[10:] / 1000.0
                gap = (starts[1:] - lasts[:-1])[10:] / 1000.0
                per_call = (starts[-1] - starts[10]) / 1000.0 / (count - 11)
                print(f"N={n} round {r} {name}: {count} calls logged; us per call {per_call:.2f} "
                      f"({per_call / n:.4f} per kernel); span median {np.median(span):.2f} "
                      f"(p10 {np.percentile(span, 10):.2f}, p90 {np.percentile(span, 90):.2f}); gap median "
                      f"{np.median(gap):.2f} (p10 {np.percentile(gap, 10):.2f}, p90 {np.percentile(gap, 90):.2f}, "
                      f"max {gap.max():.2f})")
                # %globaltimer does not share the host clock's epoch: only the difference of spans is read.
                busy = (lasts[-1] - starts[0]) / 1000
                print(f"    wall {(t1 - t0) / 1000:.1f} us, device first kernel to last {busy:.1f} us: the burst's "
                      f"start and end and its last kernel {(t1 - t0) / 1000 - busy:.1f} us")
                if name == "jit_pair":  # gap 0 of a pair is inside one execution, gap 1 between two
                    print(f"    gap inside one execution {np.median(gap[0::2]):.2f} us, between two "
                          f"{np.median(gap[1::2]):.2f} us")
                if name == "jit_loop":
                    jaxgraph.synchronize()
                    t = time.perf_counter_ns()
                    o = trivial(x)
                    d = (time.perf_counter_ns() - t) / 1000
                    jax.block_until_ready(o)
                    w = (time.perf_counter_ns() - t) / 1000
                    print(f"    jit_loop's first call after idle: host dispatch {first['dispatch']:.1f} us, of which "
                          f"the replay handler {first['handler']:.1f} us; block_until_ready on the last "
                          f"{first['wait']:.1f} us; a trivial jit after idle: dispatch {d:.1f} us, ready {w:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
