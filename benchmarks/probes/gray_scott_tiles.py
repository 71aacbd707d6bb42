"""Which temporal blocking suits gray_scott's blocked kernel: substeps a launch, tile and block side.

    python benchmarks/probes/gray_scott_tiles.py                  # grids 64, 256, 1024: about a minute
    python benchmarks/probes/gray_scott_tiles.py --grids 256 --repeats 3

The question: ``examples/gray_scott.py``'s ``blocked`` kernel runs ``per_launch``
substeps from a ``tile`` x ``tile`` tile plus a halo ``per_launch`` wide in
shared memory, on ``threads`` x ``threads`` threads. Small tiles recompute
more halo; large ones put few blocks on the GPU and leave each a long
sequence of substeps. Each candidate runs the example's eager device loop
(100 steps of 10 substeps), is checked against numpy (64 and 256) or
against the jnp program (1024), and is timed by CUDA events in interleaved
rounds (``harness.measure_group``); the fastest per grid is what
``gray_scott.default_blocking`` should return. Writes
``<device>-gray-scott-tiles.json`` and ``.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import example_module, harness, provenance, stats  # noqa: E402
from benchmarks.graph_modes import event_timer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# (substeps a launch, tile side, thread block side); shared memory 16 (tile + 2 per_launch)^2 <= 48 KiB.
CANDIDATES = [(10, 16, 16), (10, 16, 8), (10, 32, 32), (10, 32, 16), (5, 16, 16), (5, 16, 8), (5, 32, 16),
              (5, 32, 32), (5, 8, 8), (2, 16, 16), (2, 32, 32), (10, 8, 8)]


def factories(gs, nx: int, steps: int, substeps: int) -> list:
    """One eager-loop mode per candidate, each checked before it is timed."""
    import jax.numpy as jnp
    import jaxgraph

    u0, v0 = gs.initial_state(nx, np.random.default_rng())
    if nx <= 256:
        want = gs.reference(u0, v0, steps, substeps)
    else:
        want = tuple(np.asarray(a) for a in gs.jnp_simulation(steps, substeps)(jnp.asarray(u0), jnp.asarray(v0)))

    def make(per_launch: int, tile: int, threads: int):
        def build() -> harness.Mode:
            model = gs.CudaGrayScott(nx, substeps, per_launch, steps, tile, threads)
            graphed, loop = model.device_loop()
            run = gs.loop_eager(graphed, loop, u0, v0)
            worst = gs.check(model.name, run(), want)

            def body(calls: int) -> None:
                for _ in range(calls):
                    run()

            return harness.Mode(f"x{per_launch} tile {tile} threads {threads}",
                                event_timer(jaxgraph.current_stream(), body), per_call=1, unit="us_per_call",
                                clock="cuda_event", check=f"matches (v within {worst:.1e})")
        return build

    return [(f"x{p} tile {t} threads {s}", make(p, t, s)) for p, t, s in CANDIDATES if p <= substeps]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grids", default="64,256,1024", help="comma-separated grid sides")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--substeps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("gray_scott_tiles.py needs a CUDA GPU: none found")
        return 0
    import datetime

    gs = example_module.load("gray_scott")
    device = (provenance.nvidia_smi() or "unknown GPU").split(",")[0]
    doc = {"question": "gray_scott blocked kernel: substeps a launch, tile and thread block side",
           "command": "python benchmarks/probes/gray_scott_tiles.py " + " ".join(argv or sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "git": provenance.git_commit(), "git_from": provenance.git_from(), "versions": provenance.versions(),
           "device": device, "grids": {}}
    lines = [f"# Tilings of the gray_scott blocked kernel: {device}", "",
             f"{doc['date']} · git {doc['git']} · `{doc['command']}` · eager device loop, {args.steps} steps of "
             f"{args.substeps} substeps, CUDA events, median (min-max) of {args.repeats} interleaved rounds", ""]
    best: dict[int, str] = {}  # grid -> "per_launch/tile/threads" of its fastest candidate
    for nx in (int(g) for g in args.grids.split(",")):
        records = harness.measure_group(f"grid {nx}", factories(gs, nx, args.steps, args.substeps),
                                        args.repeats, 0.02, 10_000)
        doc["grids"][nx] = records
        lines += [f"## grid {nx}", "", "| substeps a launch, tile, threads | us per step | check |", "| --- | ---: | --- |"]
        rows = []
        for key, rec in records.items():
            if "samples" in rec:
                med = float(np.median(rec["samples"])) / args.steps
                lo, hi = min(rec["samples"]) / args.steps, max(rec["samples"]) / args.steps
                rows.append((med, f"| {key} | {med:.2f} ({lo:.2f}-{hi:.2f}) | {rec.get('check', '')} |"))
            else:
                rows.append((float("inf"), f"| {key} | – | {rec.get('error') or rec.get('skipped')} |"))
        lines += [r for _, r in sorted(rows)] + [""]
        timed = [(float(np.median(r["samples"])), k) for k, r in records.items() if "samples" in r]
        if timed:
            best[nx] = min(timed)[1].replace("x", "").replace(" tile ", "/").replace(" threads ", "/")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = stats.device_slug(device) + "-gray-scott-tiles"
    (args.out / f"{stem}.json").write_text(json.dumps(doc, indent=1, default=str))
    (args.out / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    # What benchmarks/vs_idiomatic.py --tiling takes, to time the fastest in the comparison.
    print("TILING " + ",".join(f"{nx}={b}" for nx, b in best.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
