"""What a device stop (``graphed_loop(..., until=flag)``) costs per step, each way it can be built.

Run:  python benchmarks/probes/stop_probe.py [--steps 1000] [--rounds 7] [--launches 5]

One process, interleaved rounds, CUDA events; the harness's one-kernel step
(``add_one`` on 4096 floats, x -> y, ``feed={0: 0}``) run R times per launch
with a flag no kernel sets (so every launch runs all R steps: the cost of
checking, not of stopping). Printed: us per step (median and range over the
rounds) and over the floor, R ``add_one`` kernels unrolled in one graph.

- ``exact_fused``: the default for a step with one small fed pair: a trip is
  ``A ; check`` and the check kernel copies y -> x itself;
- ``exact_twin``: with the swapped twin: ``A ; check ; IF(g) { B ; check }``
  (the default above ``LoopSettings.fused_copy_bytes``; forced here with 0);
- ``exact_in_place``: a step with no feed (``y = y + 1`` in place): ``step ; check``;
- ``exact_memcpy``: ``ping_pong="copy"``: ``A ; memcpy ; check``;
- ``..._pdl`` / ``..._child``: the one-kernel step added as a kernel node of
  the trip with the check launched through a programmatic edge (waiting in
  ``griddepcontrol.wait``), or as a child-graph node with the check after it
  (``jaxgraph.diagnostics.loop_settings(pdl_checks=...)`` says which kinds get the
  first; the name without a suffix is the default);
- ``every_k2`` ... ``every_k32``: ``check_every=K``: K unguarded steps per trip;
- ``no_flag``: the loop without ``until`` (``default_unroll``'s K).

Each mode is checked first: y == x + R exactly and ``steps_run == R``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.workload import SOURCE, Chain, check_result, random_input  # noqa: E402


def build_modes(kernel, steps: int, rng: np.random.Generator) -> dict:
    """``{name: (loop or graph, chain)}``: each mode's launchable, checked once."""
    import jaxgraph
    from jaxgraph import diagnostics

    modes = {}
    floor = Chain(kernel, steps)
    print("  unrolled: " + floor.check(floor.graph.replay, rng), flush=True)
    modes["unrolled"] = (floor.graph, floor, steps)

    def loop(name, fused_bytes=None, pdl=None, **kw):
        chain = kw.pop("chain", None) or Chain(kernel, 1)
        pdl_checks = None if pdl is None else {"fused", "twin", "in_place"} if pdl else ()
        try:
            feed = kw.pop("feed", {0: 0})
            with diagnostics.loop_settings(fused_copy_bytes=fused_bytes, pdl_checks=pdl_checks):
                lp = jaxgraph.graphed_loop(chain.graph, steps, feed=feed, inputs=[chain.x_s], outputs=[chain.y_s],
                                           **kw)
                check(name, lp, chain, steps)
            modes[name] = (lp, chain, steps)
        except Exception as exc:  # one way failing must not hide the others' figures
            print(f"  {name}: FAILED: {type(exc).__name__}: {exc}", flush=True)

    def check(name, lp, chain, r):
        x = random_input(rng)
        chain.x_s.copy_(x)
        if chain.y_s.ptr != chain.x_s.ptr:
            chain.y_s.fill_(np.nan)
        jaxgraph.synchronize()
        lp.replay()
        jaxgraph.synchronize()
        check_result(chain.y_s.numpy(), x, r)
        check_result(chain.x_s.numpy(), x, r)  # both halves of a fed pair
        if name != "unrolled":
            ran = int(lp.steps_run.numpy()[0])
            assert ran == r, f"{name}: {ran} steps counted, expected {r}"
            pdl = diagnostics.describe_loop(lp).programmatic_check
            print(f"  {name}: {lp.ping_pong}, unroll {lp.unroll}, step as a kernel node with a programmatic "
                  f"check: {pdl}; x + {r} checked, {ran} steps counted", flush=True)

    flag = jaxgraph.zeros(1, np.int32)
    in_place = Chain(kernel, 1, x_s=(y := jaxgraph.zeros(4096, np.float32)), y_s=y)
    loop("exact_fused", until=flag)
    loop("exact_fused_child", pdl=False, until=flag)
    loop("exact_twin", 0, until=flag)
    loop("exact_twin_pdl", 0, True, until=flag)
    loop("exact_in_place", until=flag, feed=None, chain=in_place)
    loop("exact_in_place_pdl", None, True, until=flag, feed=None, chain=in_place)
    loop("exact_memcpy", until=flag, ping_pong="copy")
    for k in (2, 8, 16, 32):
        loop(f"every_k{k}", until=flag, check_every=k)
    loop("no_flag")
    return modes


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--launches", type=int, default=5)
    args = p.parse_args()
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("stop_probe.py needs a CUDA GPU: none found")
        return 0
    name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()
    rng = np.random.default_rng()
    kernel = jaxgraph.Kernel(SOURCE, "add_one")
    kernel.handle  # noqa: B018 - load before capture
    modes = build_modes(kernel, args.steps, rng)
    stream = jaxgraph.Stream()
    start, end = jaxgraph.Event(enable_timing=True), jaxgraph.Event(enable_timing=True)
    times = {k: [] for k in modes}
    for _ in range(args.rounds):
        for key, (lp, _chain, r) in modes.items():
            with jaxgraph.stream(stream):
                lp.replay()  # warm
                jaxgraph.synchronize()
                start.record(stream)
                for _ in range(args.launches):
                    lp.replay()
                end.record(stream)
            end.synchronize()
            times[key].append(start.elapsed_time(end) * 1e3 / (args.launches * r))
    floor = statistics.median(times["unrolled"])
    print(f"\n{name}: R = {args.steps}, {args.rounds} rounds x {args.launches} launches; us per step")
    print("| mode | median | range | over the floor (median) |\n| --- | ---: | ---: | ---: |")
    for key, ts in times.items():
        m = statistics.median(ts)
        print(f"| {key} | {m:.2f} | {min(ts):.2f}-{max(ts):.2f} | {m - floor:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
