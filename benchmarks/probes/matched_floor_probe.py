"""Replay in jit against the floor on the same memory: how much of the gap is where the buffers lie?

Run:  python benchmarks/probes/matched_floor_probe.py [--n 100 1000] [--rounds 7] [--ms 25]

``placement_probe.py`` found that the workload's chain runs 1.015-1.042 us per
kernel depending only on which 16 KB buffer it works in. The harness's floor
(``raw``) runs on the chain's static buffers; replay in jit runs on XLA's.
In one process, interleaved rounds:

- ``raw``: the harness's floor, on the static buffers;
- ``raw_xla``: the same chain captured on the buffers a jitted replay returned
  (two results kept, the two outputs ``jit_loop`` alternates over), launched
  in turn as the replay handler launches them;
- ``raw_20_calls``: ``raw`` timed over 20 launches a sample, not ~25 ms of them;
- ``raw_fresh`` / ``raw_clone`` / ``raw_set_same``: executables of the template,
  of a clone of it, and of a clone whose kernel nodes were each rewritten with
  their own parameters (``cuGraphKernelNodeSetParams``) before instantiating,
  as the replay handler does;
- ``jit_loop``: ``jax.jit(replayable)`` on a fixed input, as the harness times
  it (host wall clock over the calls, the last waited for).

Prints us per kernel and jit_loop's ratio to each floor, per round and median.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.exec_update_cost import capture_chain  # noqa: E402
from benchmarks.probes.placement_probe import RawBuffer  # noqa: E402
from benchmarks.probes.probe_kit import driver_call as call, kit, timed_launches  # noqa: E402
from benchmarks.harness.workload import ELEMENTS, Chain, check_result, random_input  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--ms", type=float, default=25.0)
    args = p.parse_args()
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("matched_floor_probe.py needs a CUDA GPU: none found")
        return 0
    import jax
    import jax.numpy as jnp
    from cuda.bindings import driver

    rng = np.random.default_rng()
    probe = kit()
    kernel = probe.kernel

    def event_time(execs, calls: int) -> float:
        return timed_launches(probe, execs, calls)

    def instantiate(graph):
        return call("cuGraphInstantiate", graph, 0)

    def nodes_of(graph):
        _, count = call("cuGraphGetNodes", graph, 0)
        return list(call("cuGraphGetNodes", graph, count)[0])

    for n in args.n:
        chain = capture_chain(kernel, n)
        chain.graph.instantiate()
        raw = [driver.CUgraphExec(chain.graph.raw_cuda_graph_exec())]
        template = driver.CUgraph(chain.graph.raw_cuda_graph())
        clone = call("cuGraphClone", template)
        same = call("cuGraphClone", template)
        for node in nodes_of(same):  # as the replay handler rewrites its template before instantiating
            call("cuGraphKernelNodeSetParams", node, call("cuGraphKernelNodeGetParams", node))
        variants = {"raw_fresh": [instantiate(template)], "raw_clone": [instantiate(clone)],
                    "raw_set_same": [instantiate(same)]}
        f = jax.jit(jaxgraph.replayable(chain.graph, inputs=[chain.x_s], outputs=[chain.y_s]))
        xh = random_input(rng)
        x = jnp.asarray(xh)
        check_result(f(x), xh, n)
        seen = set()
        out = None
        for _ in range(64):
            out = f(x)
            seen.add(out.unsafe_buffer_pointer())
        jax.block_until_ready(out)
        del out
        r1 = f(x)
        r2 = f(x)
        jax.block_until_ready((r1, r2))
        kept = []
        matched = []
        for r in (r1, r2):
            # Raw views: a DeviceArray of ``r`` itself would keep it alive, and jit_loop would
            # then alternate over other buffers.
            c = Chain(kernel, n, x_s=jaxgraph.asarray(RawBuffer(x.unsafe_buffer_pointer())),
                      y_s=jaxgraph.asarray(RawBuffer(r.unsafe_buffer_pointer())))
            kept.append(c)
            matched.append(driver.CUgraphExec(c.graph.raw_cuda_graph_exec()))
        call("cuMemsetD32", r1.unsafe_buffer_pointer(), 0x7FC00000, ELEMENTS)  # NaN: unwritten fails
        jaxgraph.synchronize()
        event_time(matched[:1], 1)
        check_result(np.asarray(r1), xh, n)
        mine = {r1.unsafe_buffer_pointer(), r2.unsafe_buffer_pointer()}
        print(f"N={n}: jit_loop's outputs at {sorted(hex(a) for a in seen)}; raw_xla's at "
              f"{sorted(hex(a) for a in mine)} ({'the same' if mine == seen else 'NOT the same'}); "
              f"static y at {chain.y_s.__cuda_array_interface__['data'][0]:#x}")
        calls = max(4, int(args.ms * 1e-3 / (n * 1.05e-6)))

        def jit_time() -> float:
            jax.block_until_ready(x)
            jaxgraph.synchronize()
            o = None
            t = time.perf_counter()
            for _ in range(calls):
                o = f(x)
            jax.block_until_ready(o)
            return time.perf_counter() - t

        samples = {"raw": [], "raw_20_calls": [], "raw_xla": [], "raw_xla_a": [], "raw_xla_b": [],
                   **{k: [] for k in variants}, "jit_loop": []}
        del r1, r2  # jit_loop reuses these buffers; raw_xla writes them only while it runs
        for _ in range(args.rounds):
            samples["raw"].append(event_time(raw, calls))
            samples["raw_xla"].append(event_time(matched, calls))
            samples["raw_xla_a"].append(event_time(matched[:1], calls))
            samples["raw_xla_b"].append(event_time(matched[1:], calls))
            samples["raw_20_calls"].append(event_time(raw, 20) * calls / 20)
            for k, e in variants.items():
                samples[k].append(event_time(e, calls))
            samples["jit_loop"].append(jit_time())
        per = {k: [s * 1e6 / (calls * n) for s in v] for k, v in samples.items()}
        med = {k: float(np.median(v)) for k, v in per.items()}
        print(f"N={n}, {calls} calls a sample: us per kernel " +
              ", ".join(f"{k} {m:.4f}" for k, m in med.items()))
        for floor in ("raw", "raw_xla"):
            rounds = [j / r for j, r in zip(per["jit_loop"], per[floor])]
            print(f"   jit_loop / {floor}: {med['jit_loop'] / med[floor]:.4f}x "
                  f"(rounds {min(rounds):.4f}-{max(rounds):.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
