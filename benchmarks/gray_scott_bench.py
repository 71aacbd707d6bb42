"""gray_scott's step in a jitted ``lax.fori_loop``: the graphed step against XLA over the same kernels.

    python benchmarks/gray_scott_bench.py            # 4 XLA settings, 15 rounds: about a minute
    python benchmarks/gray_scott_bench.py --quick    # 5 rounds of short samples

The step is the one ``examples/gray_scott.py`` had before it fused its substeps
(``gray_scott_split.GrayScott``, over the example's model): ``2 * substeps + 2`` kernels
(Laplacian and reaction per substep, then zero and total), on the default
256 x 256 grid. Every mode runs ``--steps`` steps in one jitted
``lax.fori_loop`` (its trips carry u, v and the totals), called from Python:

- ``xla_fori``: the kernels as ``Kernel.jax_call``s (``GrayScott.xla_step``),
  launched by XLA or recorded into its command buffers;
- ``graphed_fori``: the example's graphed step (``make_graphed_callables``
  over ``GrayScott.step``, which updates u and v in place), one replay a trip;
- ``graphed_fori_min1``: the same, its ``jax.jit`` given
  ``compiler_options={"xla_gpu_graph_min_graph_size": 1}``: XLA may record
  the loop's body (the replay, the store of the total, the trip counter:
  3 commands, under the default minimum of 5) as one command buffer, in this
  computation only, whatever ``XLA_FLAGS`` says;
- ``graphed_fresh``: the step as the example wrote it before: new arrays
  for u and v and a memset for the total (so XLA copies u and v into the
  loop's carry every trip, and jaxgraph copies the total out of its array);
- ``graphed_memset``: in place, but the total zeroed by a memset node
  (as ``jaxgraph.zeros`` does) instead of the zero kernel;
- ``graphed_forked``: in place, the zero kernel launched on a second stream
  that forks from the capture stream and joins it before ``total``: the
  graph's zero runs beside the first substep (XLA may schedule its
  operand-less zero kernel the same way);
- ``loop_jit``: the device loop (``jaxgraph.graphed_loop``) inside jit, one
  FFI call for all the steps: not a fori_loop, shown for scale.

One process per XLA setting (``off``, ``on``, ``defaults``, ``while`` of
``benchmarks/harness/config.py``, and ``defaults_min1``: JAX's default command-buffer
types at ``--xla_gpu_graph_min_graph_size=1``), each with ``XLA_FLAGS``
exactly the setting's. The replay counters say whether XLA recorded a
command buffer for the loop's body: its handler then runs only while XLA
records, not on every trip.
In each, every mode's result (u, v and the totals) is checked against numpy
first, then the modes are sampled in interleaved rounds
(``timing.measure_group``): a sample is the host wall time of several
back-to-back calls, the last waited for with ``jax.block_until_ready``, per
step. Each process also records, per mode, the replay counters per step
once warm (over 4 calls, after 7: ``jaxgraph.diagnostics.counters``, the
paths, executables made, rebinds, copies and the handler's host time), the
replayable's bindings, and the array copies XLA compiled outside the entry
computation (the loop's). Writes
``<device>-gray-scott.json`` and ``.md`` (``-gray-scott-quick`` with
``--quick``) into ``--out`` and prints the markdown; a run without ``--quick``
regenerates ``<device>-targets.md`` there (``targets.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import config, example_loader, stats, timing  # noqa: E402
from benchmarks.reports import targets  # noqa: E402
from benchmarks.reports.gray_scott_report import MODES, markdown, summarize  # noqa: E402
from benchmarks.harness.gray_scott_split import GrayScott  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/harness/config.py's settings, and JAX's default command-buffer types at min size 1: with the
# in-place step a fori_loop body holds 3 commands (the replay, the store of the total, the trip
# counter), under the default min size of 5, so XLA records no command buffer for it by default.
FLAGS = {**{k: config.SETTINGS[k].xla_flags for k in ("off", "on", "defaults", "while")},
         "defaults_min1": "--xla_gpu_graph_min_graph_size=1"}
SETTINGS = tuple(FLAGS)
WARM_UP_CALLS, COUNTED_CALLS = 6, 4  # calls before the counters are read, and calls they are read over
COUNTERS = ("launch", "splice_nodes", "splice_whole", "uncaptured_launch", "instantiate", "rebind", "copy")

__all__ = ["MODES", "SETTINGS", "compiled_facts", "main", "markdown", "parse_args", "worker"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/gray_scott_bench.py", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5 rounds of ~10 ms samples")
    p.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated subset of " + ",".join(SETTINGS))
    p.add_argument("--grid", type=int, default=256, help="grid side (default %(default)s)")
    p.add_argument("--steps", type=int, default=100, help="fori_loop trips per call (default %(default)s)")
    p.add_argument("--substeps", type=int, default=10, help="substeps per step (default %(default)s)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 15, quick 5)")
    p.add_argument("--target-ms", type=float, default=None, help="wall time per sample (default 30, quick 10)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="results directory")
    p.add_argument("--timeout-s", type=float, default=120.0, help="per worker process")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: run one setting
    p.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.settings = tuple(s.strip() for s in args.settings.split(",") if s.strip())
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown or not args.settings:
        p.error(f"unknown setting(s) {unknown}; choose from {','.join(SETTINGS)}")
    for name in ("grid", "steps", "substeps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.repeats is None:
        args.repeats = 5 if args.quick else 15
    if args.target_ms is None:
        args.target_ms = 10.0 if args.quick else 30.0
    return args


# ----------------------------------------------------------------------------
# The worker: one XLA setting
# ----------------------------------------------------------------------------


def variant_step(gs: Any, model: Any, *, in_place: bool, zero: str) -> Callable:
    """The example's step written other ways: ``in_place`` or new arrays for u and v; the total
    zeroed by a ``"memset"`` node, the ``"kernel"``, or that kernel on a ``"forked"`` stream (a
    branch of the graph that runs beside the first substep, as XLA may run its zero kernel)."""
    import jaxgraph

    side = jaxgraph.Stream() if zero == "forked" else None

    def step(u: Any, v: Any) -> tuple:
        shape = (model.nx, model.nx)
        mass = jaxgraph.empty(1)
        if side is not None:
            main = jaxgraph.current_stream()
            side.wait_stream(main)
            with jaxgraph.stream(side):
                model.zero[1, 1](mass)
        lu, lv = jaxgraph.empty(shape), jaxgraph.empty(shape)
        scratch = [(jaxgraph.empty(shape), jaxgraph.empty(shape)) for _ in range(1 if in_place else 2)]
        pairs = ((u, v), scratch[0]) if in_place else tuple(scratch)
        for s in range(model.substeps):
            u_next, v_next = pairs[(model.substeps - 1 - s) % 2]
            model.laplacian[model.grid2, (16, 16)](lu, lv, u, v, model.nx, model.nx)
            model.react[model.grid1, 256](u_next, v_next, u, v, lu, lv, gs.DU, gs.DV, gs.FEED, gs.KILL, gs.DT,
                                          model.n)
            u, v = u_next, v_next
        if zero == "memset":
            mass.fill_(0)
        elif zero == "kernel":
            model.zero[1, 1](mass)
        else:
            main.wait_stream(side)
        model.total[model.grid1, 256](mass, v, model.n)
        return u, v, mass

    return step


def compiled_facts(hlo: str) -> dict:
    """What XLA compiled: array copies outside the entry computation (the loop's), custom calls."""
    copies, entry = 0, False
    for line in hlo.splitlines():
        if line and not line.startswith((" ", "}")):  # a computation's header
            entry = line.startswith("ENTRY")
            continue
        if not entry and re.search(r"= \w+\[\d[\d,]*\]\S* copy(-start)?\(", line):
            copies += 1
    return {"loop_array_copies": copies, "custom_calls": hlo.count("custom-call(")}


def _fori(jax: Any, step: Callable, steps: int, options: dict | None = None) -> Callable:
    """``steps`` trips of ``step`` in a jitted fori_loop; ``options``: the jit's ``compiler_options``."""
    import jax.numpy as jnp

    def body(i, carry):
        u, v, masses = carry
        u, v, m = step(u, v)
        return u, v, masses.at[i].set(m[0])

    return jax.jit(lambda u, v: jax.lax.fori_loop(0, steps, body, (u, v, jnp.zeros(steps, jnp.float32))),
                   compiler_options=options)


def _mode(key: str, fn: Callable, args: tuple, want: tuple, steps: int, replayable: Any = None) -> timing.Mode:
    """Compile, check against numpy, note counters and bindings; a Mode timing ``fn(*args)`` per step."""
    import jax

    from jaxgraph import diagnostics

    before = diagnostics.counters()
    jax.block_until_ready(fn(*args))  # compiles
    first = diagnostics.counters()
    for _ in range(WARM_UP_CALLS):  # XLA's result buffers alternate between calls: let it see both
        jax.block_until_ready(fn(*args))
    warm = diagnostics.counters()
    for _ in range(COUNTED_CALLS - 1):
        jax.block_until_ready(fn(*args))
    got = [np.asarray(a) for a in jax.block_until_ready(fn(*args))]
    after = diagnostics.counters()
    u, v, m = want
    np.testing.assert_allclose(got[0], u, rtol=0, atol=1e-4, err_msg=key)
    np.testing.assert_allclose(got[1], v, rtol=0, atol=1e-4, err_msg=key)
    np.testing.assert_allclose(got[2], m[-got[2].size:], rtol=1e-3, err_msg=key)  # a device loop keeps the last
    info: dict = {"first_call": {k: first[k] - before[k] for k in COUNTERS if first[k] != before[k]}}
    calls = after["handler_calls"] - warm["handler_calls"]
    info["per_step"] = {k: (after[k] - warm[k]) / (COUNTED_CALLS * steps) for k in COUNTERS}
    info["handler_calls_per_call"] = calls / COUNTED_CALLS
    info["handler_us_per_handler_call"] = (after["handler_ns"] - warm["handler_ns"]) / calls / 1e3 if calls else None
    info["compiled"] = compiled_facts(fn.lower(*args).compile().as_text())
    if replayable is not None:
        info["bindings"] = [str(b) for b in replayable.bindings[0]]

    def run(n: int) -> float:
        jax.block_until_ready(args)
        out = None
        start = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        return time.perf_counter() - start

    return timing.Mode(key, run, per_call=steps, unit="us_per_call", clock="wall",
                        check=f"u, v and {got[2].size} totals match numpy ({steps} steps)", info=info)


def worker(args: argparse.Namespace) -> dict:
    """Check and time every mode under this process's XLA flags; the record for the driver."""
    import jax
    import jax.numpy as jnp

    import jaxgraph

    gs = example_loader.load("gray_scott")
    nx, steps, substeps = args.grid, args.steps, args.substeps
    rng = np.random.default_rng()
    u0, v0 = gs.initial_state(nx, rng)
    want = gs.reference(u0, v0, steps, substeps)
    model = GrayScott(gs, nx, substeps)
    u, v = jnp.asarray(u0), jnp.asarray(v0)
    variants = {"graphed_fresh": dict(in_place=False, zero="memset"), "graphed_memset": dict(in_place=True, zero="memset"),
                "graphed_forked": dict(in_place=True, zero="forked")}
    graphed = {"graphed_fori": jaxgraph.make_graphed_callables(model.step, (u0, v0))}
    for key, how in variants.items():
        graphed[key] = jaxgraph.make_graphed_callables(variant_step(gs, model, **how), (u0, v0))
    factories = [("xla_fori", lambda: _mode("xla_fori", _fori(jax, model.xla_step, steps), (u, v), want, steps))]
    for key, g in graphed.items():
        factories.append((key, lambda key=key, g=g: _mode(key, _fori(jax, g, steps), (u, v), want, steps,
                                                           g.replayable)))
    g, min1 = graphed["graphed_fori"], {"xla_gpu_graph_min_graph_size": 1}
    factories.insert(2, ("graphed_fori_min1", lambda: _mode("graphed_fori_min1", _fori(jax, g, steps, min1), (u, v),
                                                            want, steps, g.replayable)))
    loop = jaxgraph.graphed_loop(graphed["graphed_fori"], steps, feed={0: 0, 1: 1})
    factories.append(("loop_jit", lambda: _mode("loop_jit", jax.jit(loop), (u, v), want, steps)))
    records = timing.measure_group(f"[{args.worker}]", factories, args.repeats, args.target_ms / 1e3, 10_000)
    return {"setting": args.worker, "xla_flags": os.environ.get("XLA_FLAGS"), "modes": records,
            "device": {"name": jax.devices()[0].device_kind},
            "summary": graphed["graphed_fori"].summary(), "loop": repr(loop)}


# ----------------------------------------------------------------------------
# The driver and the report
# ----------------------------------------------------------------------------


def _worker_env(setting: str) -> dict:
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    flags = FLAGS[setting]
    if flags is not None:
        env["XLA_FLAGS"] = flags
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run_setting(setting: str, args: argparse.Namespace, tmp: Path, argv: Sequence[str]) -> dict:
    path, flags = tmp / f"{setting}.json", FLAGS[setting]
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", setting, "--json", str(path)]
    print(f"[{setting}] XLA_FLAGS={flags!r}", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=_worker_env(setting), capture_output=True, text=True,
                              timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        return {"setting": setting, "xla_flags": flags, "failed": f"timed out after {args.timeout_s:.0f} s"}
    print(proc.stdout + proc.stderr, end="", flush=True)
    if proc.returncode != 0 or not path.exists():
        return {"setting": setting, "xla_flags": flags, "failed": f"exit code {proc.returncode}",
                "output_tail": (proc.stdout + proc.stderr)[-3000:]}
    return json.loads(path.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker is not None:
        import jaxgraph

        if jaxgraph.device_count() == 0:
            print("no CUDA device: the gray_scott benchmark runs on a GPU machine")
            return 1
        record = worker(args)
        args.json.write_text(json.dumps(stats.json_ready(record)))
        return 0
    from benchmarks import run

    start = time.perf_counter()
    cfg = {"grid": args.grid, "steps": args.steps, "substeps": args.substeps, "repeats": args.repeats,
           "target_ms": args.target_ms, "quick": args.quick, "settings": list(args.settings)}
    meta = run.collect_meta(config.QUICK, argv)
    with tempfile.TemporaryDirectory(prefix="jaxgraph-gray-scott-") as tmp:
        processes = {s: _run_setting(s, args, Path(tmp), argv) for s in args.settings}
    device = next((p["device"]["name"] for p in processes.values() if p.get("device")), "unknown device")
    results = {"date": meta["date"], "git": meta.get("git"), "versions": meta.get("versions"),
               "command": " ".join(["python", "benchmarks/gray_scott_bench.py", *argv]), "config": cfg,
               "device": device, "wall_s": round(time.perf_counter() - start, 1),
               "processes": summarize(processes)}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = stats.device_slug(device) + ("-gray-scott-quick" if args.quick else "-gray-scott")
    text = markdown(results)
    (args.out / f"{stem}.json").write_text(json.dumps(stats.json_ready(results), indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(f"\nwrote {args.out / stem}.json and .md in {results['wall_s']:.0f} s\n\n{text}")
    if not args.quick:  # the targets file judges the full gray_scott run (benchmarks/reports/targets.py)
        print(f"wrote {targets.write(args.out, stats.device_slug(device))}")
    failed = any(p.get("failed") or any("error" in r for r in p.get("modes", {}).values())
                 for p in processes.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
