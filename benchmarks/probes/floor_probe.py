"""Why the harness's floor (``raw``) is sometimes ~1.03 and sometimes ~1.2 us per kernel.

Run:  python benchmarks/probes/floor_probe.py [--n 100 1000] [--rounds 7] [--launches 20]

In one process, interleaved rounds, CUDA events, us per kernel of a chain of
N ``add_one`` kernels (``benchmarks/harness/workload.py``):

- ``graph_exec``: the CUDAGraph's own executable, as ``raw`` launches it;
- ``fresh``: a new ``cuGraphInstantiate`` of the same template;
- ``fresh_uploaded``: the same, ``cuGraphUpload``-ed to the stream first;
- ``alternating``: two fresh executables of the template launched in turn, as
  the replay handler launches one per XLA address set when XLA alternates its
  output buffers (``jit_loop``'s fixed input, each result kept until the next);
- ``jit``: ``jax.jit(replayable)`` on a fixed input (host wall clock over the
  calls, the last waited for), the harness's ``jit_loop``: its results are kept
  one call, so XLA alternates two output buffers and the handler two executables;
- ``jit_dropped``: the same with each result dropped at once, so XLA can hand
  the next call the same buffer and the handler launches one executable.

Printed before and after JAX starts, with the GPU's clocks, so a slow floor
can be told apart from a slow GPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.exec_update_cost import capture_chain  # noqa: E402
from benchmarks.probes.probe_kit import driver_call as call, kit  # noqa: E402
from benchmarks.harness.workload import BLOCK, ELEMENTS, GRID, check_result, random_input  # noqa: E402


def clocks() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,pstate,temperature.gpu,power.draw",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except OSError:
        return "?"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--launches", type=int, default=20)
    args = p.parse_args()
    import jaxgraph
    from cuda.bindings import driver

    if jaxgraph.device_count() == 0:
        print("floor_probe.py needs a CUDA GPU: none found")
        return 0

    rng = np.random.default_rng()
    kernel, stream, h, start, end = kit()
    chains = {}
    for n in args.n:
        captured = capture_chain(kernel, n)
        g, x_s, y_s = captured.graph, captured.x_s, captured.y_s
        g.instantiate()
        fresh = call("cuGraphInstantiate", driver.CUgraph(g.raw_cuda_graph()), 0)
        uploaded = call("cuGraphInstantiate", driver.CUgraph(g.raw_cuda_graph()), 0)
        call("cuGraphUpload", uploaded, h)
        execs = {"graph_exec": driver.CUgraphExec(g.raw_cuda_graph_exec()), "fresh": fresh,
                 "fresh_uploaded": uploaded,
                 "alternating": (call("cuGraphInstantiate", driver.CUgraph(g.raw_cuda_graph()), 0),
                                 call("cuGraphInstantiate", driver.CUgraph(g.raw_cuda_graph()), 0))}
        for name, exe in execs.items():
            for one in exe if isinstance(exe, tuple) else (exe,):
                x = random_input(rng)
                x_s.copy_(x)
                y_s.fill_(np.nan)
                jaxgraph.synchronize()
                call("cuGraphLaunch", one, h)
                call("cuStreamSynchronize", h)
                print(f"N={n} {name}: {check_result(y_s.numpy(), x, n)}")
        chains[n] = (g, x_s, y_s, execs)

    def measure(tag: str, extra=None) -> None:
        print(f"--- {tag}: clocks (sm, mem, pstate, temp, power) {clocks()}")
        for n, (_g, _x, _y, execs) in chains.items():
            samples = {name: [] for name in execs}
            if extra:
                samples.update(jit=[], jit_dropped=[])
            for _ in range(args.rounds):
                for name, exe in execs.items():
                    turns = exe if isinstance(exe, tuple) else (exe,)
                    call("cuGraphLaunch", turns[-1], h)
                    start.record(stream)
                    for i in range(args.launches):
                        call("cuGraphLaunch", turns[i % len(turns)], h)
                    end.record(stream)
                    end.synchronize()
                    samples[name].append(start.elapsed_time(end) * 1000.0 / (args.launches * n))
                if extra:
                    samples["jit"].append(extra(n, args.launches, True))
                    samples["jit_dropped"].append(extra(n, args.launches, False))
            floor = np.median(samples["fresh"])
            row = ", ".join(f"{k} {np.median(v):.4f} ({np.median(v) / floor:.3f}x; {min(v):.3f}-{max(v):.3f})"
                            for k, v in samples.items())
            print(f"N={n}: us per kernel: {row}")
        print(f"    clocks after: {clocks()}")

    def context() -> str:
        try:
            return _context()
        except RuntimeError as exc:  # informational only
            return f"context unavailable: {exc}"

    def _context() -> str:
        limits = {name: call("cuCtxGetLimit", getattr(driver.CUlimit, f"CU_LIMIT_{name.upper()}"))
                  for name in ("stack_size", "printf_fifo_size", "malloc_heap_size", "persisting_l2_cache_size",
                               "dev_runtime_pending_launch_count")}
        free, total = call("cuMemGetInfo")
        return (f"ctx flags {int(call('cuCtxGetFlags'))}, limits {limits}, "
                f"free {free / 2**30:.1f} of {total / 2**30:.1f} GiB")

    measure("before JAX")
    print("   ", context())
    import jax

    measure("after import jax")
    jax.devices()
    measure("after jax.devices() (the PJRT client)")
    print("   ", context())
    import jax.numpy as jnp

    jax.block_until_ready(jax.jit(lambda v: v + 1)(jnp.ones(4)))
    measure("after a trivial jitted call")
    print("   ", context())

    jitted = {}
    for n, (g, x_s, y_s, _e) in chains.items():
        step = jaxgraph.replayable(g, inputs=[x_s], outputs=[y_s])
        f = jax.jit(step)
        x = random_input(rng)
        a = jnp.asarray(x)
        print(f"N={n} jit: {check_result(np.asarray(f(a)), x, n)}")
        jitted[n] = (f, a, step)

    def jit_time(n: int, launches: int, keep: bool) -> float:
        f, a, _ = jitted[n]
        for _ in range(3):
            out = f(a)
        jax.block_until_ready(out)
        del out
        jaxgraph.synchronize()
        t = time.perf_counter()
        out = None
        for _ in range(launches * 4):
            if keep:
                out = f(a)  # the last result alive while the next call runs: two buffers in turn
            else:
                f(a)  # dropped at once: its buffer is free for the next call
        jax.block_until_ready(out if keep else f(a))
        return (time.perf_counter() - t) * 1e6 / ((launches * 4 + (not keep)) * n)

    measure("after a jitted replay of each chain", jit_time)
    print("   ", context())
    from jaxgraph.diagnostics import describe_graph

    for n, (_f, _a, step) in jitted.items():
        print(f"N={n} jit: the replay handler keeps {describe_graph(step.graph_id, step.devices[0]).executables} "
              "executables")

    # The same chains captured on buffers XLA allocated (jax.Array operands): is it the memory?
    kept = []
    for n in args.n:
        x = random_input(rng)
        x_j, y_j = jnp.asarray(x), jnp.full(ELEMENTS, np.nan, np.float32)
        jax.block_until_ready((x_j, y_j))
        g = jaxgraph.CUDAGraph()
        launch = kernel[GRID, BLOCK]
        with jaxgraph.graph(g):
            launch(y_j, x_j, ELEMENTS)
            for _ in range(n - 1):
                launch(y_j, y_j, ELEMENTS)
        exe = driver.CUgraphExec(g.raw_cuda_graph_exec())
        call("cuGraphLaunch", exe, h)
        call("cuStreamSynchronize", h)
        print(f"N={n} on XLA's buffers: {check_result(np.asarray(y_j), x, n)}")
        chains[n][3]["on_xla_buffers"] = exe
        kept.append((g, x_j, y_j))  # alive while measured
    measure("with chains captured on XLA's buffers")
    from jaxgraph.diagnostics import counters

    print("counters", counters())
    return 0


if __name__ == "__main__":
    sys.exit(main())
