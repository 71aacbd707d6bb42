"""How each way of splicing a replay into XLA's command buffer fares, when XLA's addresses recur and when not.

    python benchmarks/capture_policies.py [--ns 100] [--repeats 3] [--target-ms 10]

One process with XLA command buffers on (``FUSION,CUSTOM_CALL``, min size 1).
When a replay's buffers move, XLA (jax 0.11.2) needs a recording of the call
for the new addresses: it keeps recordings for a few recent address sets and
runs the handler again (a splice) only for a set it does not hold. The modes
show both sides: ``jit_loop`` (one fixed input; XLA's output alternates
between two buffers, both recorded once), ``jit_changing`` (8 inputs),
``jit_cycle`` (rotating over ``CYCLE`` inputs: more address sets than XLA
keeps, so calls record again) and ``mixed`` (3 replays between XLA ops).
Each :class:`jaxgraph.diagnostics.CapturePolicy` is measured in turn (the
policy is process-wide and read when XLA records), each group with its own
raw ``cuGraphLaunch`` floor, with the replay counters per call. Every mode is
checked exactly against numpy first. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import config, graph_modes, jax_modes, stats, timing  # noqa: E402
from benchmarks.reports.run_report import fmt  # noqa: E402
from benchmarks.harness.workload import SOURCE, Chain  # noqa: E402

CYCLE = 32  # inputs jit_cycle rotates over: more address sets than XLA keeps recordings for
POLICIES = ("bind", "copy", "whole", "auto")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ns", type=lambda t: [int(v) for v in t.split(",")], default=[100])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--target-ms", type=float, default=10.0)
    p.add_argument("--policies", type=lambda t: t.split(","), default=list(POLICIES))
    args = p.parse_args(argv)
    # XLA reads its flags once, when its backend starts: set them before importing jax.
    os.environ["XLA_FLAGS"] = config.SETTINGS["on"].xla_flags
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    import jaxgraph
    from jaxgraph import diagnostics

    if jaxgraph.device_count() == 0:
        print("capture_policies needs a CUDA GPU", file=sys.stderr)
        return 1
    rng = np.random.default_rng()
    kernel = jaxgraph.Kernel(SOURCE, "add_one")
    stream = jaxgraph.Stream()
    rows = []
    for n in args.ns:
        chain = Chain(kernel, n)
        for policy in args.policies:
            previous = diagnostics.set_capture_policy(policy)
            try:
                # A replayable per mode: a graph keeps the policy of its first recording, and each
                # mode gets executables (and XLA recordings) of its own.
                def fresh():
                    return jaxgraph.replayable(chain.graph, inputs=[chain.x_s], outputs=[chain.y_s])

                factories = [("raw", functools.partial(graph_modes.raw, chain, stream, rng)),
                             ("jit_loop", functools.partial(jax_modes.jit_loop, fresh(), n, rng)),
                             ("jit_changing", functools.partial(jax_modes.jit_changing, fresh(), n, rng)),
                             ("jit_cycle", functools.partial(_cycle, fresh(), n, rng)),
                             ("mixed", functools.partial(jax_modes.mixed, fresh(), n, rng))]
                records = timing.measure_group(f"[{policy}] N={n}", factories, args.repeats,
                                                args.target_ms / 1e3, 20_000, print, diagnostics.counters)
            finally:
                diagnostics.set_capture_policy(previous)
            modes = {k: {"unit": r.get("unit"), "by_n": {str(n): r}} for k, r in records.items()}
            rows.append(_row(policy, n, stats.summarize_process({"modes": modes})["modes"]))
        chain.close()
    print("\n| policy | N | jit_loop | jit_changing | jit_cycle | mixed | splices per call (changing / cycle / "
          "mixed) | copies per call (cycle) | handler us per call (cycle) | problems |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    print("\n".join(rows))
    return 0


def _cycle(step, n: int, rng: np.random.Generator) -> timing.Mode:
    """``jax.jit(step)`` rotating over ``CYCLE`` inputs, the previous output held."""
    import jax

    return jax_modes._loop_mode("jit_cycle", jax.jit(lambda x: step(x)), n, rng, inputs=CYCLE)


def _row(policy: str, n: int, modes: dict) -> str:
    def entry(key: str) -> dict:
        return modes.get(key, {}).get("by_n", {}).get(str(n), {})

    def cell(key: str) -> str:
        e = entry(key)
        if "stats" not in e:
            return e.get("error", e.get("skipped", "–"))[:40]
        return f"{fmt(e['stats']['median'] * e.get('per_call', n))} us ({e.get('ratio', float('nan')):.2f}x)"

    def splices(key: str) -> str:
        c = entry(key).get("counters", {})
        return f"{c.get('splice_nodes', 0) + c.get('splice_whole', 0):.2f}"

    cycle = entry("jit_cycle").get("counters", {})
    problems = "; ".join(f"{k}: {e['error']}" for k, m in modes.items() for e in m["by_n"].values() if "error" in e)
    return (f"| {policy} | {n} | {cell('jit_loop')} | {cell('jit_changing')} | {cell('jit_cycle')} | {cell('mixed')} "
            f"| {splices('jit_changing')} / {splices('jit_cycle')} / {splices('mixed')} | {cycle.get('copy', 0):.2f} "
            f"| {fmt(cycle.get('handler_ns', 0) / 1e3)} | {problems or '–'} |")


if __name__ == "__main__":
    sys.exit(main())
