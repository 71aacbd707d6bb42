"""What declaring a jitted replay side-effecting costs per call.

Run:  python benchmarks/probes/side_effect_cost.py [--repeats 7] [--calls 2000] [--out DIR]

Why: a replayable's FFI call is not side-effecting unless asked
(``replayable(..., side_effects=True)``), because on the H100
``has_side_effect`` made the call cost more host time (``jaxgraph/_jax_interop/replay_boundary.py``).
This measures it on a graph of one ``add_one`` kernel (``benchmarks/harness/workload.py``):

- ``trivial_jit``: ``jax.jit(lambda x: x + 1)``, JAX's own per-call cost;
- ``replay``: ``jax.jit(replayable(g, [x], [y]))``;
- ``replay_side_effects``: the same with ``side_effects=True``.

Host wall time per call over ``--calls`` calls ending in ``block_until_ready``,
interleaved rounds, each mode checked against numpy first. Writes
``<device>-side_effect.json`` and ``.md`` to ``--out`` (default
``benchmarks/results``) and prints the markdown.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness import stats  # noqa: E402
from benchmarks.probes.micro import ROOT, run_meta, write_report  # noqa: E402
from benchmarks.harness.workload import BLOCK, ELEMENTS, GRID, SOURCE, check_result, random_input  # noqa: E402

__all__ = ["MODES", "main", "markdown"]

MODES = ("trivial_jit", "replay", "replay_side_effects")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/probes/side_effect_cost.py", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default %(default)s)")
    p.add_argument("--calls", type=int, default=2000, help="jitted calls per sample (default %(default)s)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    meta = run_meta("benchmarks/probes/side_effect_cost.py", argv if argv is not None else sys.argv[1:])
    if meta is None:
        return 0
    results = {"benchmark": "side_effect_cost", **meta, "repeats": args.repeats, "calls": args.calls,
               "modes": _measure(args.repeats, args.calls, np.random.default_rng())}
    write_report(results, markdown(results), args.out, "side_effect")
    return 0


def markdown(results: dict) -> str:
    """The table: us per jitted call per mode, and the side effect's cost over the plain replay."""
    lines = [f"# A side-effecting replay call: {results.get('device', '?')}", "",
             f"{results.get('date', '?')} · git {results.get('git') or '?'} · driver {results.get('driver', '?')} · "
             f"`{results.get('command', '')}`", "",
             f"Host wall time per jitted call ({results['calls']} calls per sample, {results['repeats']} interleaved "
             "rounds), a graph of one `add_one` kernel on 4096 floats.", "",
             "| mode | us per call | min-max |", "| --- | ---: | ---: |"]
    for mode in MODES:
        s = results["modes"][mode]["stats"]
        lines.append(f"| `{mode}` | {s['median']:.1f} | {s['min']:.1f}-{s['max']:.1f} |")
    plain, marked = (results["modes"][m]["stats"]["median"] for m in ("replay", "replay_side_effects"))
    lines += ["", f"`side_effects=True`: {marked - plain:+.1f} us per call ({marked / plain:.2f}x the plain replay)."]
    return "\n".join(lines) + "\n"


def _measure(repeats: int, calls: int, rng: np.random.Generator) -> dict:
    import jax
    import jax.numpy as jnp

    import jaxgraph

    kernel = jaxgraph.Kernel(SOURCE, "add_one")
    x_s, y_s = jaxgraph.zeros(ELEMENTS, np.float32), jaxgraph.zeros(ELEMENTS, np.float32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        kernel[GRID, BLOCK](y_s, x_s, ELEMENTS)
    fns = {"trivial_jit": jax.jit(lambda x: x + 1),
           "replay": jax.jit(jaxgraph.replayable(g, [x_s], [y_s])),
           "replay_side_effects": jax.jit(jaxgraph.replayable(g, [x_s], [y_s], side_effects=True))}
    x = random_input(rng)
    xj = jnp.asarray(x)
    out = {mode: {"check": check_result(fn(xj), x, 1), "samples": []} for mode, fn in fns.items()}
    for _ in range(repeats):
        for mode, fn in fns.items():
            jax.block_until_ready(fn(xj))
            t0 = time.perf_counter()
            for _ in range(calls):
                y = fn(xj)
            jax.block_until_ready(y)
            out[mode]["samples"].append((time.perf_counter() - t0) * 1e6 / calls)
    for record in out.values():
        record["stats"] = stats.summarize(record["samples"])
    return out


if __name__ == "__main__":
    sys.exit(main())
