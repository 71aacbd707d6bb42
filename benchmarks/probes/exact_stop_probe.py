"""What the default exact stop (speculative trips with a watch after each step) costs, against the rest.

Run:  python benchmarks/probes/exact_stop_probe.py [--steps 1000] [--rounds 7] [--launches 5] [--out FILE]

One process, interleaved rounds, CUDA events. The step is the harness's one
kernel (``add_one`` on 4096 floats, x -> y, ``feed={0: 0}``) or the same kernel
that also bumps a counter and sets the flag at step ``stop_at``. Printed: us per
step run (median and range over the rounds) and over the floor, R ``add_one``
kernels unrolled in one graph (``unrolled``; ``unrolled_half``: R/2 of them).

While the flag stays clear (every launch runs all R steps):

- ``exact``: ``until=`` with nothing else, the default exact stop: K = 16
  unguarded steps a WHILE trip, a watch kernel after each (launched through a
  programmatic edge after the one-kernel step on sm_90+);
- ``exact_plain_watch``: the same with the watch after a child-graph step
  (``jaxgraph.diagnostics.loop_settings(pdl_watch=False)``);
- ``exact_k8``, ``exact_k32``: ``unroll=8`` / ``32`` steps a trip;
- ``exact_copy``: ``ping_pong="copy"`` (a memcpy y -> x after each step);
- ``per_step``: ``check_every=1``, the exact stop without speculation (a WHILE trip a step);
- ``every_k16``: ``check_every=16`` (up to 15 steps past the flag).

Stopping half way (the flag set by step R/2; ``steps_run`` and y checked):

- ``exact_stops_half``, ``per_step_stops_half``: what a launch that stops
  costs, per step run (the watch's snapshot and the restore included).

Each mode is checked first: y == x + steps and ``steps_run`` == steps.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.workload import BLOCK, ELEMENTS, GRID, SOURCE, Chain, check_result, random_input  # noqa: E402

FLAG_SOURCE = r"""
extern "C" __global__ void add_one_flag(float* y, const float* x, int n, int* counter, int* flag,
                                        const int* stop_at) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
  if (i == 0) {
    int c = atomicAdd(counter, 1) + 1;
    if (c >= *stop_at) *flag = 1;
  }
}
"""


def build_modes(kernel, flag_kernel, steps: int, rng: np.random.Generator) -> dict:
    """``{name: (launchable, steps run per launch)}``, each checked once."""
    import jaxgraph
    from jaxgraph import diagnostics

    modes, keep = {}, []
    for name, r in (("unrolled", steps), ("unrolled_half", steps // 2)):
        floor = Chain(kernel, r)
        print(f"  {name}: " + floor.check(floor.graph.replay, rng), flush=True)
        modes[name] = (floor.graph, r, None)

    def loop(name, watch_pdl=True, **kw):
        chain = Chain(kernel, 1)
        try:
            with diagnostics.loop_settings(pdl_watch=watch_pdl):
                lp = jaxgraph.graphed_loop(chain.graph, steps, feed={0: 0}, inputs=[chain.x_s], outputs=[chain.y_s],
                                           until=jaxgraph.zeros(1, np.int32), **kw)
                check(name, lp, chain.x_s, chain.y_s, steps)
            modes[name] = (lp, steps, None)
        except Exception as exc:  # one way failing must not hide the others' figures
            print(f"  {name}: FAILED: {type(exc).__name__}: {exc}", flush=True)

    def stopping(name, **kw):
        x, y = jaxgraph.zeros(ELEMENTS), jaxgraph.zeros(ELEMENTS)
        counter, flag = jaxgraph.zeros(1, np.int32), jaxgraph.zeros(1, np.int32)
        stop_at = jaxgraph.asarray(np.array([steps // 2], np.int32))
        g = jaxgraph.CUDAGraph()
        with jaxgraph.graph(g):
            flag_kernel[GRID, BLOCK](y, x, ELEMENTS, counter, flag, stop_at)
        lp = jaxgraph.graphed_loop(g, steps, feed={0: 0}, until=flag, inputs=[x], outputs=[y], **kw)
        counter.fill_(0)
        check(name, lp, x, y, steps // 2)
        # The counter must start at 0 at every launch (a memset before each, timed too: ~1-2 us a launch).
        modes[name] = (lp, steps // 2, lambda: counter.fill_(0))
        keep.append((g, counter, flag, stop_at, x, y))

    def check(name, lp, x_s, y_s, r):
        x = random_input(rng)
        x_s.copy_(x)
        y_s.fill_(np.nan)
        jaxgraph.synchronize()
        lp.replay()
        jaxgraph.synchronize()
        check_result(y_s.numpy(), x, r)
        check_result(x_s.numpy(), x, r)  # both halves of a fed pair
        ran = int(lp.steps_run.numpy()[0])
        assert ran == r, f"{name}: {ran} steps counted, expected {r}"
        pdl = diagnostics.describe_loop(lp).programmatic_check
        print(f"  {name}: stop {lp.stop!r}, {lp.ping_pong}, unroll {lp.unroll}, programmatic watch/check "
              f"{pdl}, snapshot {lp.snapshot_bytes} B; x + {r} checked, {ran} steps counted", flush=True)

    loop("exact")
    loop("exact_plain_watch", watch_pdl=False)
    loop("exact_k8", unroll=8)
    loop("exact_k32", unroll=32)
    loop("exact_copy", ping_pong="copy")
    loop("per_step", check_every=1)
    loop("every_k16", check_every=16)
    stopping("exact_stops_half")
    stopping("per_step_stops_half", check_every=1)
    modes["_keep"] = keep
    return modes


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--launches", type=int, default=5)
    p.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = p.parse_args()
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("exact_stop_probe.py needs a CUDA GPU: none found")
        return 0
    name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()
    rng = np.random.default_rng()
    kernel, flag_kernel = jaxgraph.Kernel(SOURCE, "add_one"), jaxgraph.Kernel(FLAG_SOURCE, "add_one_flag")
    kernel.handle, flag_kernel.handle  # noqa: B018 - load before capture
    modes = build_modes(kernel, flag_kernel, args.steps, rng)
    alive = modes.pop("_keep")  # noqa: F841 - the stopping steps' arrays, alive while timed
    stream = jaxgraph.Stream()
    start, end = jaxgraph.Event(enable_timing=True), jaxgraph.Event(enable_timing=True)
    times = {k: [] for k in modes}
    for _ in range(args.rounds):
        for key, (lp, r, reset) in modes.items():
            with jaxgraph.stream(stream):
                if reset:
                    reset()
                lp.replay()  # warm
                jaxgraph.synchronize()
                start.record(stream)
                for _ in range(args.launches):
                    if reset:
                        reset()
                    lp.replay()
                end.record(stream)
            end.synchronize()
            times[key].append(start.elapsed_time(end) * 1e3 / (args.launches * r))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [f"{name}, {date}: `python benchmarks/probes/exact_stop_probe.py --steps {args.steps} --rounds "
             f"{args.rounds} --launches {args.launches}`; us per step run, CUDA events, one process, interleaved "
             "rounds; over the floor: against `unrolled` (`unrolled_half` for the `_half` modes)", "",
             "| mode | median | range | over the floor (median) |", "| --- | ---: | ---: | ---: |"]
    for key, ts in times.items():
        m = statistics.median(ts)
        floor = statistics.median(times["unrolled_half" if key.endswith("_half") else "unrolled"])
        lines.append(f"| {key} | {m:.2f} | {min(ts):.2f}-{max(ts):.2f} | {m - floor:+.2f} |")
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
