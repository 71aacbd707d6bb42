"""jaxgraph's examples against the program a JAX user would write, and against their own kernels without graphs.

    python benchmarks/vs_idiomatic.py            # 4 XLA settings, 5 rounds: about 4 minutes on an H100
    python benchmarks/vs_idiomatic.py --quick    # small sizes, 3 rounds (a smoke run)
    python benchmarks/vs_idiomatic.py --grids 128,512 --poisson-grids 64 --repeats 3   # fewer grids and rounds

Three columns per workload (issue 37): the idiomatic JAX program (as a user
writes it, and in its fair form: as many sweeps or iterations a
``lax.while_loop`` trip as the device loop runs between reads of its flag),
the same CUDA kernels jaxgraph runs called through ``Kernel.jax_call`` in a
``lax.fori_loop`` / ``lax.while_loop`` (what the kernels buy without a graph),
and jaxgraph's device loop (what the graph adds). Every mode computes the same
thing and is checked against numpy/scipy before it is timed:

- ``gray_scott`` at grids 64, 128, 256, 512 and 1024, 100 steps of 10 substeps
  (``examples/gray_scott.py``): ``jnp`` (the model in ``jax.numpy``, a
  jitted ``lax.fori_loop``: a fixed number of steps, so its fair form is
  itself), ``xla_fused`` and ``xla_blocked`` (the example's fused kernel, and
  the temporally blocked kernel the device loop launches, as
  ``Kernel.jax_call``s in that fori_loop), ``loop_fused_jit`` and
  ``loop_blocked_jit`` (the device loop, one substep per launch or
  ``gray_scott.default_blocking``'s temporally blocked launches, inside
  ``jax.jit``), ``loop_blocked_eager`` (that loop replayed from
  Python, timed by CUDA events). Up to grid 256 every mode is checked
  against numpy; above (numpy would take a minute a process at 1024) against
  the ``jnp`` run, itself checked against numpy on one step;
- ``poisson_jacobi`` / ``poisson_cg`` at 64 x 64 and 128 x 128, rtol 1e-4 (Jacobi
  above 64 x 64 only in ``--jacobi-big-settings``: its sweeps grow as n^2, ~18,000 at 128)
  (``examples/poisson_solver.py``): ``jnp_jacobi`` (a jitted
  ``lax.while_loop``, the tolerance tested after every sweep), ``jnp_jacobi_fair``
  (``--fair-sweeps`` sweeps a trip, each after the stop masked: the same sweeps),
  ``xla_jacobi`` (up to 64 x 64: the kernel as a ``jax_call`` in it, one a trip),
  ``xla_jacobi_fair`` (``--fair-sweeps`` of those a trip), ``jax_scipy_cg``
  (``jax.scipy.sparse.linalg.cg`` on the matrix-free operator, the library
  call), ``jnp_cg_fair`` (CG written in ``jax.numpy``, ``--fair-iterations``
  a trip), ``xla_cg_fair`` (the ``cg_fused`` kernel as ``jax_call``s,
  ``--fair-iterations`` a trip), and the device loops in jit: ``*_exact`` (``until=``, exact
  stop), ``*_every`` (``check_every=K``, where this jaxgraph has it),
  ``jacobi_exact_s1`` (one sweep a step: the loop's own stop after every
  sweep). The CG loops run pipelined CG, one kernel an iteration. Up to
  64 x 64 also ``*_block_exact`` / ``*_block_every`` (and
  ``cg_block_exact_eager``): the single-block fast path
  (``examples/poisson_block.py``): one launch of 1024 threads runs up to
  ``--block-per-launch`` sweeps (iterations) on chip, testing the
  tolerance after each, the device loop relaunching it until the flag;
  ``xla_jacobi_block`` / ``xla_cg_block``: the same kernel as a ``jax_call`` in
  a ``lax.while_loop``, one launch a trip.

One process per XLA setting (``off``, ``on``, ``defaults``, ``while`` of
``benchmarks/harness/config.py``), started by ``run.run_worker``; in each, a case's
modes are sampled in interleaved rounds (``timing.measure_group``): a
sample is the wall time of back-to-back calls, the last waited for, per
call (CUDA events for the eager replay). The report (``reports/vs_idiomatic_report.py``)
takes each mode at its best setting and compares it with the idiomatic
program at *its* best setting, with the range over the rounds, leads with the
three columns at each one's best setting and again all at JAX's defaults, and
splits each of jaxgraph's speedups into what the kernels buy and what the graph
buys. Writes
``<device>-vs-idiomatic.json``, ``.md`` and ``.png`` (without matplotlib, no
PNG) into ``--out`` (``-vs-idiomatic-quick`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import config, example_loader, stats, timing  # noqa: E402
from benchmarks.reports.vs_idiomatic_report import markdown, render, summarize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("off", "on", "defaults", "while")
CASES = ("gray_scott", "poisson")

__all__ = ["CASES", "SETTINGS", "main", "parse_args", "worker"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/vs_idiomatic.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, 3 rounds of ~5 ms samples")
    p.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated subset of " + ",".join(SETTINGS))
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    p.add_argument("--grids", default=None, help="gray_scott grids (default 64,128,256,512,1024; quick 64)")
    p.add_argument("--poisson-grids", default=None,
                   help="poisson grids (default 64,128; quick 32): the single-block kernels up to 64, the multi-block "
                        "ones at every grid")
    p.add_argument("--jacobi-big-settings", default=",".join(SETTINGS),
                   help="settings that also time Jacobi above 64 x 64 (its sweeps grow as n^2: ~18,000 at 128, "
                        "~76,000 at 256, seconds a solve); default all four")
    p.add_argument("--steps", type=int, default=100, help="gray_scott steps (default 100)")
    p.add_argument("--substeps", type=int, default=10, help="gray_scott substeps per step (default 10)")
    p.add_argument("--per-step", type=int, default=8, help="poisson sweeps (iterations) per loop step (default 8)")
    p.add_argument("--fair-sweeps", type=int, default=8,
                   help="Jacobi sweeps a lax.while_loop trip in the fair idiomatic loop and of the multi-block kernel "
                        "via jax_call (default 8: the device loop's sweeps a step, between reads of its flag)")
    p.add_argument("--fair-iterations", type=int, default=4,
                   help="CG iterations a lax.while_loop trip in the fair jnp CG and of the cg_fused kernel via "
                        "jax_call (default 4; the device loop's exact stop reads its flag every --per-step)")
    p.add_argument("--check-every", type=int, default=8, help="K of Jacobi's every-K stop (default 8)")
    p.add_argument("--cg-check-every", type=int, default=4,
                   help="K of CG's every-K stop (default 4: up to K-1 steps of no-op kernels may follow)")
    p.add_argument("--block-per-launch", type=int, default=256,
                   help="poisson up to 64 x 64: sweeps (iterations) per launch of the single-block kernels (default "
                        "256; each launch stops early once converged)")
    p.add_argument("--tiling", default=None,
                   help="gray_scott's temporally blocked kernel (columns or blocked) per grid, e.g. "
                        "64=5/6/w8,1024=5/32/16 (substeps a launch/tile/"
                        "wWARPS for the columns kernel or THREADS for the shared-memory one; default "
                        "gray_scott.default_blocking; probes/gray_scott_tiles.py prints the fastest)")
    p.add_argument("--rtol", type=float, default=1e-4, help="poisson tolerance (default 1e-4)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the random states and problems (default: a fresh one, the same in every process: "
                        "each setting's process solves the same problems, so a solve's sweeps are the same)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 5, quick 3)")
    p.add_argument("--target-ms", type=float, default=None, help="wall time per sample (default 20, quick 5)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="results directory")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per worker process")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: run one setting
    p.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.settings = _names(p, args.settings, SETTINGS, "setting")
    args.cases = _names(p, args.cases, CASES, "case")
    args.jacobi_big_settings = _names(p, args.jacobi_big_settings, SETTINGS, "setting") if \
        args.jacobi_big_settings.strip() else ()
    args.grids = _ints(p, args.grids or ("64" if args.quick else "64,128,256,512,1024"), "--grids")
    args.poisson_grids = _ints(p, args.poisson_grids or ("32" if args.quick else "64,128"), "--poisson-grids")
    for name in ("steps", "substeps", "per_step", "check_every", "cg_check_every", "block_per_launch", "fair_sweeps",
                 "fair_iterations"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.quick:
        args.steps, args.substeps = min(args.steps, 20), min(args.substeps, 10)
    args.repeats = args.repeats or (3 if args.quick else 5)
    args.target_ms = args.target_ms or (5.0 if args.quick else 20.0)
    return args


def _names(p: argparse.ArgumentParser, text: str, known: tuple, what: str) -> tuple:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in names if s not in known]
    if unknown or not names:
        p.error(f"unknown {what}(s) {unknown}; choose from {','.join(known)}")
    return names


def _ints(p: argparse.ArgumentParser, text: str, flag: str) -> tuple:
    try:
        values = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        p.error(f"{flag} takes comma-separated integers, got {text!r}")
    if not values or min(values) < 4:
        p.error(f"{flag}: each grid must be >= 4, got {text!r}")
    return values


# ----------------------------------------------------------------------------
# The worker: one XLA setting
# ----------------------------------------------------------------------------


def _jit_mode(key: str, fn: Callable, args: tuple, check: Callable[[Any], tuple]) -> timing.Mode:
    """Compile ``fn(*args)``, check its result (``check`` raises, or says what it verified and the
    steps, sweeps or iterations it took), then time back-to-back calls."""
    import jax

    from benchmarks.harness.jax_modes import timed_calls

    what, steps = check(jax.block_until_ready(fn(*args)))
    return timing.Mode(key, timed_calls(lambda a: fn(*a), [args]), per_call=1, unit="us_per_call",
                        clock="wall", check=what, info={"steps": steps})


def _eager_mode(key: str, run: Callable[[], Any], check: Callable[[Any], tuple]) -> timing.Mode:
    """An eager device-loop replay, timed by CUDA events on the current stream."""
    import jaxgraph

    from benchmarks.harness.graph_modes import event_timer

    what, steps = check(run())

    def body(calls: int) -> None:
        for _ in range(calls):
            run()

    return timing.Mode(key, event_timer(jaxgraph.current_stream(), body), per_call=1, unit="us_per_call",
                        clock="cuda_event", check=what, info={"steps": steps})


def _host(a: Any) -> np.ndarray:
    import jaxgraph

    return a.numpy() if isinstance(a, jaxgraph.DeviceArray) else np.asarray(a)


def tiling(text: str | None) -> dict[int, tuple[int, int, int, int | None]]:
    """``--tiling``'s ``64=5/6/w8,1024=5/32/16`` as ``{64: (5, 6, 16, 8), 1024: (5, 32, 16, None)}``:
    ``(per_launch, tile, threads, warps)`` for ``CudaGrayScott`` (``wN``: the columns kernel on N warps;
    a number: the blocked kernel on that many threads a side)."""
    out = {}
    for item in filter(None, (text or "").split(",")):
        grid, _, spec = item.partition("=")
        parts = [x.strip() for x in spec.split("/")]
        if (not grid.strip().isdigit() or len(parts) != 3 or not all(x.isdigit() for x in parts[:2])
                or not parts[2].removeprefix("w").isdigit()):
            raise ValueError(f"--tiling entry {item!r} is not GRID=SUBSTEPS/TILE/THREADS or GRID=SUBSTEPS/TILE/wWARPS, "
                             "e.g. 256=5/22/w8")
        warps = int(parts[2][1:]) if parts[2].startswith("w") else None
        out[int(grid)] = (int(parts[0]), int(parts[1]), 16 if warps is not None else int(parts[2]), warps)
    return out


def gray_scott_factories(args: argparse.Namespace, nx: int) -> list:
    """The gray_scott modes at grid ``nx``: each checks u, v and the totals against numpy."""
    import jax.numpy as jnp

    gs = example_loader.load("gray_scott")
    steps, substeps = args.steps, args.substeps
    u0, v0 = gs.initial_state(nx, np.random.default_rng(args.seed))
    u, v = jnp.asarray(u0), jnp.asarray(v0)
    if nx <= 256:
        want, against = gs.reference(u0, v0, steps, substeps), "numpy"
    else:  # numpy would take a minute: check jnp's first step against it, then use jnp's run as the reference
        gs.check("jnp, one step", gs.jnp_simulation(1, substeps)(u, v), gs.reference(u0, v0, 1, substeps))
        want, against = tuple(np.asarray(a) for a in gs.jnp_simulation(steps, substeps)(u, v)), "jnp (its step: numpy)"

    def check(name: str) -> Callable[[Any], tuple]:
        def run(out: Any) -> tuple:
            worst = gs.check(name, out, want)
            return f"u, v and {steps} totals match {against} (v within {worst:.1e})", steps
        return run

    fused = lambda: gs.CudaGrayScott(nx, substeps, 1, steps)  # noqa: E731
    per_launch, tile, threads, warps = tiling(args.tiling).get(nx) or gs.default_blocking(nx, substeps)
    blocked = lambda: gs.CudaGrayScott(nx, substeps, per_launch, steps, tile, threads, warps)  # noqa: E731

    def named(key: str, model: Any) -> Callable[[Any], tuple]:
        def run(out: Any) -> tuple:
            what, n = check(key)(out)
            return f"{model.name}: {what}", n
        return run

    def launches(mode: timing.Mode, model: Any) -> timing.Mode:
        mode.info["launches"] = len(model.runs)  # kernels a step
        return mode

    def xla(key: str, make: Callable) -> timing.Mode:
        model = make()
        return launches(_jit_mode(key, gs.xla_simulation(model), (u, v), named(key, model)), model)

    def loop_jit(key: str, make: Callable) -> timing.Mode:
        model = make()
        _, loop = model.device_loop()
        return launches(_jit_mode(key, gs.loop_in_jit(loop), (u, v), named(key, model)), model)

    def loop_eager(key: str, make: Callable) -> timing.Mode:
        model = make()
        graphed, loop = model.device_loop()
        return launches(_eager_mode(key, gs.loop_eager(graphed, loop, u0, v0), named(key, model)), model)

    return [("jnp", lambda: _jit_mode("jnp", gs.jnp_simulation(steps, substeps), (u, v), check("jnp"))),
            ("xla_fused", lambda: xla("xla_fused", fused)),
            ("xla_blocked", lambda: xla("xla_blocked", blocked)),
            ("loop_fused_jit", lambda: loop_jit("loop_fused_jit", fused)),
            ("loop_blocked_jit", lambda: loop_jit("loop_blocked_jit", blocked)),
            ("loop_blocked_eager", lambda: loop_eager("loop_blocked_eager", blocked))]


def poisson_factories(args: argparse.Namespace, n: int, method: str) -> list:
    """The poisson modes (``method`` "jacobi" or "cg") at n x n: each checked against scipy/numpy."""
    import jax.numpy as jnp

    ps = example_loader.load("poisson_solver")
    prob = ps.Problem(n, args.rtol, np.random.default_rng(args.seed))
    checker = ps.Checker(prob)
    pb = example_loader.load("poisson_block")
    max_sweeps, max_iter = 50 * n * n + 1000, 20 * n + 1000
    every = (args.check_every if method == "jacobi" else args.cg_check_every) if ps.has_check_every() else None
    f, b = jnp.asarray(prob.f), jnp.asarray(prob.b)

    models: dict = {}

    def check(name: str) -> Callable[[Any], tuple]:
        def run(out: Any) -> tuple:
            x, count = (_host(a) for a in out)
            its = int(np.ravel(count)[0]) if np.size(count) else None  # jax.scipy's cg does not say
            same = ""
            if "_block" in name:  # the single-block kernels: their numpy model's result and count, bit for bit
                if method not in models:
                    models[method] = pb.model_solve(prob, method, args.block_per_launch,
                                                    max_sweeps if method == "jacobi" else max_iter)
                x_m, its_m, _ = models[method]
                if its != its_m or not np.array_equal(x, x_m):
                    raise AssertionError(f"{name}: {its} sweeps (iterations), not the numpy model's {its_m} bit for "
                                         "bit")
                same = "; the numpy model's bits"
            if method == "jacobi":
                err = checker.jacobi(name, x, its, max_sweeps)
                return f"{its} sweeps; matches numpy's {its} sweeps and {checker.how} ({err:.1e} of max){same}", its
            err = checker.cg(name, x)
            return (f"{its or 'unreported'} iterations; float64 residual within tolerance, {checker.how} to "
                    f"{err:.1e} of max{same}"), its
        return run

    def loop(key: str, per_step: int, check_every: int, eager: bool = False) -> timing.Mode:
        kernels = ps.Kernels(prob, per_step)
        if method == "jacobi":
            graphed, lp = kernels.jacobi_loop(max_sweeps, check_every)
            if eager:
                return _eager_mode(key, ps.jacobi_eager(graphed, lp, prob), check(key))
            return _jit_mode(key, ps.jacobi_in_jit(lp), (f,), check(key))
        graphed, lp = kernels.cg_loop(max_iter, check_every)
        if eager:
            return _eager_mode(key, ps.cg_eager(graphed, lp, prob, ps.numpy_operator), check(key))
        return _jit_mode(key, ps.cg_in_jit(lp, ps.jnp_operator), (b,), check(key))

    def block(key: str, check_every: int, eager: bool = False) -> timing.Mode:
        kernels = pb.BlockKernels(prob, args.block_per_launch)
        if method == "jacobi":
            graphed, lp = kernels.jacobi_loop(max_sweeps, check_every)
            if eager:
                return _eager_mode(key, pb.jacobi_eager(graphed, lp, prob), check(key))
            return _jit_mode(key, pb.jacobi_in_jit(lp), (f,), check(key))
        graphed, lp = kernels.cg_loop(max_iter, check_every)
        if eager:
            return _eager_mode(key, pb.cg_eager(graphed, lp, prob), check(key))
        return _jit_mode(key, pb.cg_in_jit(lp), (b,), check(key))

    blocks = []
    if pb.fits(n):
        blocks = [(f"{method}_block_exact", lambda: block(f"{method}_block_exact", 1))]
        if method == "cg":
            blocks.append(("cg_block_exact_eager", lambda: block("cg_block_exact_eager", 1, eager=True)))
        if every:
            blocks.append((f"{method}_block_every", lambda: block(f"{method}_block_every", every)))

    def jit(key: str, make: Callable, arg: Any) -> tuple:
        return key, lambda: _jit_mode(key, make(), (arg,), check(key))

    s, fs, fi = args.per_step, args.fair_sweeps, args.fair_iterations
    if method == "jacobi":
        out = [jit("jnp_jacobi", lambda: ps.jnp_jacobi(prob, max_sweeps), f),
               jit("jnp_jacobi_fair", lambda: ps.jnp_jacobi(prob, max_sweeps, fs), f)]
        if n <= 64:
            out.append(jit("xla_jacobi", lambda: ps.Kernels(prob).xla_jacobi(max_sweeps), f))
        out.append(jit("xla_jacobi_fair", lambda: ps.Kernels(prob).xla_jacobi(max_sweeps, fs), f))
        if pb.fits(n):
            out.append(jit("xla_jacobi_block", lambda: pb.BlockKernels(prob, args.block_per_launch).xla_jacobi(
                max_sweeps), f))
        if n <= 64:
            out.append(("jacobi_exact_s1", lambda: loop("jacobi_exact_s1", 1, 1)))
        out.append(("jacobi_exact", lambda: loop("jacobi_exact", s, 1)))
        if every:
            out.append(("jacobi_every", lambda: loop("jacobi_every", s, every)))
        return out + blocks
    import jax

    cg = jax.jit(lambda b: (ps.jax_scipy_cg(prob, max_iter)(b), jnp.zeros(0, jnp.int32)))
    out = [("jax_scipy_cg", lambda: _jit_mode("jax_scipy_cg", cg, (b,), check("jax_scipy_cg"))),
           jit("jnp_cg_fair", lambda: ps.jnp_cg(prob, max_iter, fi), b),
           jit("xla_cg_fair", lambda: ps.Kernels(prob).xla_cg(max_iter, ps.jnp_operator, fi), b)]
    if pb.fits(n):
        out.append(jit("xla_cg_block", lambda: pb.BlockKernels(prob, args.block_per_launch).xla_cg(max_iter), b))
    out += [("cg_exact", lambda: loop("cg_exact", s, 1)),
            ("cg_exact_eager", lambda: loop("cg_exact_eager", s, 1, eager=True))]
    if every:
        out.append(("cg_every", lambda: loop("cg_every", s, every)))
    return out + blocks


def worker(args: argparse.Namespace) -> dict:
    """Check and time every case under this process's XLA flags; the record for the driver."""
    import jax

    groups: dict = {}
    target_s = args.target_ms / 1e3

    def measure(key: str, factories: list, repeats: int = args.repeats) -> None:
        start = time.perf_counter()
        groups[key] = {"modes": timing.measure_group(f"[{args.worker} {key}]", factories, repeats, target_s,
                                                      10_000)}
        groups[key]["wall_s"] = round(time.perf_counter() - start, 1)
        # What is measured so far, after each group: a process the driver stops at its time limit (a case
        # that never ends) keeps the groups before it.
        partial = args.json.with_suffix(".partial")
        partial.write_text(json.dumps(stats.json_ready(record(groups, partial=True))))
        partial.replace(args.json)  # whole or not at all, if the driver stops this process

    def record(groups: dict, partial: bool = False) -> dict:
        ps = example_loader.load("poisson_solver")
        return {"setting": args.worker, "xla_flags": os.environ.get("XLA_FLAGS"), "groups": groups,
                "device": {"name": jax.devices()[0].device_kind}, "check_every": ps.has_check_every(),
                **({"partial": True} if partial else {})}

    if "gray_scott" in args.cases:
        for nx in args.grids:
            measure(f"gray_scott/{nx}", gray_scott_factories(args, nx))
    if "poisson" in args.cases:
        for n in args.poisson_grids:
            measure(f"poisson_cg/{n}", poisson_factories(args, n, "cg"))
            if n <= 64:
                measure(f"poisson_jacobi/{n}", poisson_factories(args, n, "jacobi"))
        for n in args.poisson_grids:  # last: ~0.1 s a solve at 128, seconds at 256
            if n > 64 and args.worker in args.jacobi_big_settings:
                measure(f"poisson_jacobi/{n}", poisson_factories(args, n, "jacobi"),
                        args.repeats if n <= 128 else min(3, args.repeats))
    return record(groups)


# ----------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker is not None:
        import jaxgraph

        if jaxgraph.device_count() == 0:
            print("no CUDA device: this benchmark runs on a GPU machine")
            return 1
        args.json.write_text(json.dumps(stats.json_ready(worker(args))))
        return 0
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("no CUDA device: this benchmark runs on a GPU machine (nothing measured)")
        return 0
    from benchmarks import run

    args.seed, argv = run.shared_seed(args.seed, argv)  # the same random inputs under every setting
    start = time.perf_counter()
    cfg = {"grids": list(args.grids), "poisson_grids": list(args.poisson_grids), "steps": args.steps,
           "substeps": args.substeps, "per_step": args.per_step, "check_every": args.check_every,
           "fair_sweeps": args.fair_sweeps, "fair_iterations": args.fair_iterations,
           "cg_check_every": args.cg_check_every, "block_per_launch": args.block_per_launch, "rtol": args.rtol,
           "repeats": args.repeats,
           "target_ms": args.target_ms, "quick": args.quick, "settings": list(args.settings),
           "cases": list(args.cases), "jacobi_big_settings": list(args.jacobi_big_settings), "seed": args.seed}
    meta = run.collect_meta(config.QUICK, argv)
    results = {"date": meta["date"], "git": meta.get("git"), "versions": meta.get("versions"),
               "command": " ".join(["python", "benchmarks/vs_idiomatic.py", *argv]), "config": cfg,
               "device": "unknown device", "processes": {}}
    with tempfile.TemporaryDirectory(prefix="jaxgraph-vs-idiomatic-") as tmp:
        for key in args.settings:
            command = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", key]
            results["processes"][key] = run.run_worker(config.SETTINGS[key], None, Path(tmp), args.timeout_s, command)
            results["wall_s"] = round(time.perf_counter() - start, 1)
            written = _write(results, args, plot=True)  # after each process: a run cut short keeps what it did
    print(f"\nwrote {written} in {results['wall_s']:.0f} s\n\n{markdown(results)}")
    failed = any(p.get("failed") or any("error" in r for g in p.get("groups", {}).values()
                                        for r in g["modes"].values()) for p in results["processes"].values())
    return 1 if failed else 0


def _write(results: dict, args: argparse.Namespace, plot: bool) -> str:
    """Summarize what the processes so far recorded and write ``.json``, ``.md`` (and ``.png``); say what."""
    processes = results["processes"]
    results["device"] = next((p["device"]["name"] for p in processes.values() if p.get("device")), "unknown device")
    summarize(results)
    args.out.mkdir(parents=True, exist_ok=True)
    name = stats.device_slug(results["device"]) + ("-vs-idiomatic-quick" if args.quick else "-vs-idiomatic")
    stem = args.out / name
    stem.with_suffix(".json").write_text(json.dumps(stats.json_ready(results), indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(results) + "\n")
    written = f"{stem}.json and .md"
    if plot:
        try:
            render(results, stem.with_suffix(".png"))
            written += " and .png"
        except (ImportError, ValueError) as exc:  # no matplotlib, or nothing measured yet (every process failed)
            print(f"no PNG ({exc})")
    return written


if __name__ == "__main__":
    sys.exit(main())
