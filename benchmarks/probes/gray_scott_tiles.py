"""Which temporal blocking suits gray_scott's blocked kernels: kernel, substeps a launch, tile and block.

    python benchmarks/probes/gray_scott_tiles.py                  # grids 64, 256, 1024: about a minute
    python benchmarks/probes/gray_scott_tiles.py --grids 256 --repeats 3
    python benchmarks/probes/gray_scott_tiles.py --candidates 5/16/16,10/32/32 \
        --baseline old_gray_scott.cu --without-record   # against an earlier kernel file; the total's cost

The question: ``examples/gray_scott.py``'s temporally blocked kernels run
``per_launch`` substeps from a ``tile`` x ``tile`` tile plus a halo
``per_launch`` wide: ``blocked`` in shared memory on ``threads`` x
``threads`` threads, ``columns`` in registers on 32 x ``warps`` (a lane per
column). Small tiles recompute more halo; large ones put few blocks on the
GPU and leave each a long sequence of substeps. Each candidate runs the example's eager device loop
(100 steps of 10 substeps), is checked against numpy (64 and 256) or
against the jnp program (1024), and is timed by CUDA events in interleaved
rounds (``timing.measure_group``); the fastest per grid is what
``gray_scott.default_blocking`` should return. ``--baseline FILE`` also times
each candidate compiled from another version of ``gray_scott.cu`` (``git show
COMMIT:examples/gray_scott.cu``), in the same rounds; ``--without-record``
also times each with the step's total of v left out (u and v still checked),
which says what recording the total costs a step. Writes
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

from benchmarks.harness import example_loader, provenance, stats, timing  # noqa: E402
from benchmarks.harness.graph_modes import event_timer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# (substeps a launch, tile side, threads): a number is the blocked kernel on that many threads a side
# (gray_scott.blocked_shared_bytes <= 48 KiB), "wN" the columns kernel on 32 x N (tile + 2 substeps <= 32).
CANDIDATES = [(5, 16, 16), (10, 16, 16), (5, 6, 16), (5, 32, 16), (10, 32, 32), (5, 16, 8),
              (5, 6, "w8"), (5, 6, "w4"), (5, 10, "w4"), (5, 16, "w8"), (5, 22, "w8"), (5, 22, "w4"),
              (5, 22, "w16"), (4, 24, "w8"), (10, 12, "w8")]


RECORD = "if (last) record("  # each kernel's call that records the step's total of v (all are replaced)


def variants(gs, baseline: Path | None, without_record: bool) -> list[tuple[str, str]]:
    """``(label suffix, CUDA source)`` of each kernel version to time: the example's first."""
    found = [("", gs.CUDA_SOURCE)]
    if without_record:
        if RECORD not in gs.CUDA_SOURCE:
            raise ValueError(f"--without-record: {RECORD!r} is not in the example's kernel source")
        found.append((" (no total)", gs.CUDA_SOURCE.replace(RECORD, "if (0) record(")))
    if baseline is not None:
        found.append((" (baseline)", baseline.read_text()))
    return found


def factories(gs, nx: int, steps: int, substeps: int, candidates: list, sources: list) -> list:
    """One eager-loop mode per candidate and kernel version, each checked before it is timed."""
    import jax.numpy as jnp
    import jaxgraph

    u0, v0 = gs.initial_state(nx, np.random.default_rng())
    if nx <= 256:
        want = gs.reference(u0, v0, steps, substeps)
    else:
        want = tuple(np.asarray(a) for a in gs.jnp_simulation(steps, substeps)(jnp.asarray(u0), jnp.asarray(v0)))

    def make(key: str, per_launch: int, tile: int, threads: int, source: str):
        def build() -> timing.Mode:
            model = gs.CudaGrayScott(nx, substeps, per_launch, steps, tile, *layout(threads), cuda_source=source)
            graphed, loop = model.device_loop()
            run = gs.loop_eager(graphed, loop, u0, v0)
            out = run()
            if "no total" in key:  # the totals are not recorded: check u and v only
                out = (out[0], out[1], want[2])
            worst = gs.check(model.name, out, want)

            def body(calls: int) -> None:
                for _ in range(calls):
                    run()

            return timing.Mode(key, event_timer(jaxgraph.current_stream(), body), per_call=1, unit="us_per_call",
                                clock="cuda_event", check=f"matches (v within {worst:.1e})")
        return build

    return [(key, make(key, p, t, s, source))
            for p, t, s in candidates if p <= substeps
            for label, source in sources for key in [f"x{p} tile {t} {describe(s)}{label}"]]


def layout(threads: int | str) -> tuple[int, int | None]:
    """A candidate's third part as ``CudaGrayScott``'s ``(threads, warps)``: ``16`` is the blocked kernel on
    16 x 16 threads, ``"w8"`` the columns kernel on 32 x 8."""
    return (16, int(threads[1:])) if isinstance(threads, str) else (threads, None)


def describe(threads: int | str) -> str:
    return f"warps {threads[1:]}" if isinstance(threads, str) else f"threads {threads}"


def parse_candidate(text: str) -> tuple[int, int, int | str]:
    """``5/16/16`` (blocked, 16 x 16 threads) or ``5/16/w8`` (columns, 8 warps)."""
    per_launch, tile, threads = text.split("/")
    return int(per_launch), int(tile), threads if threads.startswith("w") else int(threads)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grids", default="64,256,1024", help="comma-separated grid sides")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--substeps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--candidates", default=None,
                   help="comma-separated SUBSTEPS/TILE/THREADS (blocked kernel, THREADS x THREADS) or "
                        "SUBSTEPS/TILE/wWARPS (columns kernel, 32 x WARPS) to time (default: all of CANDIDATES)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="also time the candidates compiled from this version of gray_scott.cu")
    p.add_argument("--without-record", action="store_true",
                   help="also time each without recording the step's total of v")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    candidates = CANDIDATES if args.candidates is None else \
        [parse_candidate(c) for c in args.candidates.split(",")]
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("gray_scott_tiles.py needs a CUDA GPU: none found")
        return 0
    import datetime

    gs = example_loader.load("gray_scott")
    sources = variants(gs, args.baseline, args.without_record)
    device = (provenance.nvidia_smi() or "unknown GPU").split(",")[0]
    doc = {"question": "gray_scott's temporally blocked kernels: kernel, substeps a launch, tile, threads or warps",
           "command": "python benchmarks/probes/gray_scott_tiles.py " + " ".join(argv or sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "git": provenance.git_commit(), "git_from": provenance.git_from(), "versions": provenance.versions(),
           "device": device, "grids": {}}
    lines = [f"# Tilings of gray_scott's temporally blocked kernels: {device}", "",
             f"{doc['date']} · git {doc['git']} · `{doc['command']}` · eager device loop, {args.steps} steps of "
             f"{args.substeps} substeps, CUDA events, median (min-max) of {args.repeats} interleaved rounds", ""]
    best: dict[int, str] = {}  # grid -> "per_launch/tile/threads" of its fastest candidate
    for nx in (int(g) for g in args.grids.split(",")):
        records = timing.measure_group(f"grid {nx}", factories(gs, nx, args.steps, args.substeps, candidates, sources),
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
        timed = [(float(np.median(r["samples"])), k) for k, r in records.items() if "samples" in r and "(" not in k]
        if timed:
            best[nx] = (min(timed)[1].replace("x", "", 1).replace(" tile ", "/").replace(" threads ", "/")
                        .replace(" warps ", "/w"))
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
