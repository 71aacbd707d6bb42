"""Adaptive Dopri5 on Lorenz-96: diffrax, a ``jnp`` Dopri5, the same kernels via ``jax_call``, and jaxgraph.

    python benchmarks/vs_diffrax.py              # N = 40, 100, 2000, 20000, 65536; 4 settings, 5 rounds: ~4 min (H100)
    python benchmarks/vs_diffrax.py --quick      # N = 40, 2000; 2 settings (defaults, while), 3 rounds, t in [0, 2]

Lorenz-96 on [0, t_end] (default 10), rtol = atol = 1e-5, float64, one random
initial state per N, the same in every process. Modes, per N (all from
``examples/adaptive_ode.py``):

- ``diffrax``: ``jax.jit`` of ``diffrax.diffeqsolve(ODETerm(f), Dopri5(), ...,
  stepsize_controller=PIDController(rtol, atol, pcoeff=0.4, icoeff=0.3))``;
- ``jnp_dopri5``: Dopri5 by hand in ``jax.numpy`` with the same controller,
  one ``lax.while_loop`` (``jnp_solver``);
- ``xla_kernels``: the device loop's own step kernel(s) through
  ``Kernel.jax_call`` in a ``lax.while_loop`` stopped by the same flag
  (``AdaptiveDopri5.xla_solve``): the kernels without jaxgraph's graphs;
- ``jaxgraph_jit``: the device loop as one FFI call in ``jax.jit``
  (``AdaptiveDopri5.jax_solve``);
- with ``--modes``: ``jaxgraph_eager`` (numpy in, one launch, numpy out) and
  ``jaxgraph_stages`` (the six-kernel step, in jit).

One process per XLA setting (``off``, ``on``, ``defaults``, ``while`` of
``benchmarks/harness/config.py``), each with exactly its ``XLA_FLAGS``. In
each, every mode is checked first (t_end reached exactly; the device loop,
eagerly and in jit, and the same kernels through jax_call give the same
result bit for bit; the jnp Dopri5's and jaxgraph's accepted / rejected step
counts equal diffrax's up to a decision flipped by rounding, max(2, 1%): the
counts are recorded), then the modes are sampled in interleaved rounds
(``timing.measure_group``: a sample is the host wall time of enough solves
to last ``--target-ms``, divided by their count). The report
(``reports/vs_diffrax_report.py``) takes each mode at its best setting, then
all at JAX's defaults, and gives jaxgraph's speedups with the range over the
rounds. Results: ``benchmarks/results/<device>-vs-diffrax.json`` and ``.md``
(``-vs-diffrax-quick`` with ``--quick``), rewritten after each process.
"""

from __future__ import annotations

import argparse
import importlib.util
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
from benchmarks.reports.vs_diffrax_report import MODES, markdown, best, ratio, summarize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("off", "on", "defaults", "while")
DEFAULT_MODES = ("diffrax", "jnp_dopri5", "xla_kernels", "jaxgraph_jit")

__all__ = ["DEFAULT_MODES", "SETTINGS", "main", "parse_args", "speedups", "worker"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/vs_diffrax.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="N = 40, 2000 on [0, 2], settings defaults and while, 3 rounds (a smoke run)")
    p.add_argument("--sizes", default=None, help="comma-separated N (default 40,100,2000,20000,65536)")
    p.add_argument("--t-end", type=float, default=None, help="integrate over [0, t_end] (default 10; quick 2)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 5; quick 3)")
    p.add_argument("--target-ms", type=float, default=None, help="wall time of one sample (default 40; quick 20)")
    p.add_argument("--settings", default=None, help="comma-separated subset of " + ",".join(SETTINGS))
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help="comma-separated modes (default " + ",".join(DEFAULT_MODES) + "; also jaxgraph_eager, "
                        "jaxgraph_stages)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the initial states (default: a fresh one, the same in every process)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="results folder")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per worker process")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.sizes = [int(s) for s in (args.sizes or ("40,2000" if args.quick else "40,100,2000,20000,65536"))
                      .split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes takes comma-separated integers, got {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 4:
        p.error(f"--sizes: each N must be >= 4 (Lorenz-96 couples i-2..i+1), got {args.sizes}")
    args.t_end = args.t_end if args.t_end is not None else (2.0 if args.quick else 10.0)
    args.repeats = args.repeats or (3 if args.quick else 5)
    args.target_ms = args.target_ms or (20.0 if args.quick else 40.0)
    settings = args.settings or ("defaults,while" if args.quick else ",".join(SETTINGS))
    args.settings = tuple(s for s in settings.split(",") if s)
    args.modes = tuple(s for s in args.modes.split(",") if s)
    for what, names, known in (("setting", args.settings, SETTINGS), ("mode", args.modes, tuple(MODES))):
        unknown = [s for s in names if s not in known]
        if unknown or not names:
            p.error(f"unknown {what}(s) {unknown}; choose from {', '.join(known)}")
    return args


# ----------------------------------------------------------------------------
# The worker (one process, one XLA setting)
# ----------------------------------------------------------------------------


def _mode(key: str, solve: Callable[[], Any], info: dict) -> timing.Mode:
    import jax
    import jaxgraph

    def run(calls: int) -> float:
        jaxgraph.synchronize()  # start from an idle device
        start = time.perf_counter()
        for _ in range(calls):
            out = solve()
        jax.block_until_ready(out)
        return time.perf_counter() - start

    return timing.Mode(key, run, per_call=1, unit="us_per_call", clock="wall", check=info["check"], info=info)


def _steps(out: Any) -> tuple[int, int]:
    return int(out[2]), int(out[3])


def check_size(ao: Any, n: int, t_end: float, modes: tuple, rng: np.random.Generator) -> tuple[dict, dict]:
    """Build every mode's solver for one N, run and check each once; (facts, {mode: solve thunk})."""
    import jax
    import jax.numpy as jnp

    y0 = ao.initial_state(n, rng)
    y0_j, t_end_j = jnp.asarray(y0), jnp.float64(t_end)
    ode = ao.AdaptiveDopri5(n, t_end)
    loop, xla = jax.jit(ode.jax_solve), jax.jit(ode.xla_solve)
    dfx, mine = ao.diffrax_solver(), ao.jnp_solver()
    solves = {"diffrax": lambda: dfx(y0_j, t_end_j), "jnp_dopri5": lambda: mine(y0_j, t_end_j),
              "xla_kernels": lambda: xla(y0_j), "jaxgraph_jit": lambda: loop(y0_j),
              "jaxgraph_eager": lambda: ode.solve(y0)[0]}
    if "jaxgraph_stages" in modes:
        stages = jax.jit(ao.AdaptiveDopri5(n, t_end, path="stages").jax_solve)
        solves["jaxgraph_stages"] = lambda: stages(y0_j)
    host = lambda out: (np.asarray(out[0]), float(out[1]), *_steps(out))  # noqa: E731
    got = {k: host(f()) for k, f in solves.items() if k != "jaxgraph_eager"}
    got["jaxgraph_eager"] = ode.solve(y0)
    for key, (_, t, *_) in got.items():
        if t != t_end:
            raise AssertionError(f"N = {n}: {key} stopped at t = {t!r}, not {t_end!r}")
    for key in ("jaxgraph_eager", "xla_kernels"):  # the same kernels: the same run, bit for bit
        if got[key][1:] != got["jaxgraph_jit"][1:] or not np.array_equal(got[key][0], got["jaxgraph_jit"][0]):
            raise AssertionError(f"N = {n}: {key} differs from the device loop in jit: steps {got[key][2:]} vs "
                                 f"{got['jaxgraph_jit'][2:]}")
    want = got["diffrax"][2:]
    for key in ("jnp_dopri5", "jaxgraph_jit", "jaxgraph_stages"):
        if key in got:  # rounding, amplified by chaos, may flip a marginal decision
            off = abs(got[key][2] - want[0]) + abs(got[key][3] - want[1])
            if off > max(2, sum(want) // 100):
                raise AssertionError(f"N = {n}: {key} took {got[key][2:]} accepted / rejected steps, diffrax {want}")
    steps = {k: list(v[2:]) for k, v in got.items() if k in modes or k == "diffrax"}
    same = {k: v for k, v in steps.items() if v == list(want)}
    facts = {"n": n, "steps": steps, "geometry": repr(ode), "loop": repr(ode.loop),
             "max_abs_diff_vs_diffrax": float(np.abs(got["jaxgraph_jit"][0] - got["diffrax"][0]).max()),
             "check": (f"t_end reached by all; device loop eager, in jit and its kernels via jax_call bit for bit "
                       f"the same; steps equal to diffrax's {list(want)}: {', '.join(same) or 'none'}"
                       + ("" if len(same) == len(steps) else " (the others within max(2, 1%))"))}
    return facts, {k: solves[k] for k in modes}


def worker(args: argparse.Namespace) -> dict:
    """Check and time every mode at every N under this process's XLA flags."""
    import jax

    jax.config.update("jax_enable_x64", True)
    ao = example_loader.load("adaptive_ode")
    by_n = {}
    for n in args.sizes:
        rng = np.random.default_rng([args.seed, n])  # the same state for N in every process
        holder: dict = {}

        def built(key: str, n: int = n, rng: np.random.Generator = rng) -> timing.Mode:
            if not holder:  # the first factory builds and checks every mode for this N
                holder["facts"], holder["solves"] = check_size(ao, n, args.t_end, args.modes, rng)
            return _mode(key, holder["solves"][key], dict(holder["facts"]))

        start = time.perf_counter()
        by_n[str(n)] = timing.measure_group(f"[{args.worker}] N={n}", [(k, lambda k=k: built(k)) for k in args.modes],
                                            args.repeats, args.target_ms / 1e3, 10_000)
        print(f"[{args.worker}] N={n} done in {time.perf_counter() - start:.1f} s", flush=True)
    return {"setting": args.worker, "xla_flags": os.environ.get("XLA_FLAGS"), "by_n": by_n,
            "device": {"name": jax.devices()[0].device_kind}}


# ----------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------


def speedups(processes: dict, n: str) -> dict | None:
    """jaxgraph in jit against each other solver, each at its best setting, at size ``n``."""
    mine = best(processes, n, "jaxgraph_jit")
    if mine is None:
        return None
    out = {"jaxgraph_jit": mine}
    for key in ("diffrax", "jnp_dopri5", "xla_kernels"):
        found = best(processes, n, key)
        if found:
            out[key] = {"setting": found[0], **ratio(found[1], mine[1])}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker is not None:
        record = worker(args)
        args.json.write_text(json.dumps(stats.json_ready(record)))
        return 0
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("no CUDA device: this benchmark runs on a GPU machine; none found, nothing measured")
        return 0
    missing = [m for m in ("diffrax",) if importlib.util.find_spec(m) is None]
    if missing:
        print(f"this benchmark needs {', '.join(missing)} (pip install -e \".[examples]\"); nothing measured")
        return 0
    from benchmarks import run

    start = time.perf_counter()
    args.seed, argv = run.shared_seed(args.seed, argv)  # the same random inputs under every setting
    meta = run.collect_meta(config.QUICK, argv)
    results = {"date": meta["date"], "git": meta.get("git"), "versions": meta.get("versions"),
               "command": " ".join(["python", "benchmarks/vs_diffrax.py", *argv]), "device": "unknown device",
               "config": {"sizes": args.sizes, "t_end": args.t_end, "seed": args.seed, "repeats": args.repeats,
                          "target_ms": args.target_ms, "settings": list(args.settings), "modes": list(args.modes),
                          "quick": args.quick},
               "processes": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="jaxgraph-vs-diffrax-") as tmp:
        for s in args.settings:
            command = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", s]
            results["processes"][s] = run.run_worker(config.SETTINGS[s], None, Path(tmp), args.timeout_s, command)
            results["wall_s"] = round(time.perf_counter() - start, 1)
            stem, text = _write(results, args)  # after each process: a run cut short keeps what it did
    print(f"\nwrote {stem}.json and .md in {results['wall_s']:.0f} s\n\n{text}")
    failed = any(p.get("failed") or any("error" in r for rs in p.get("by_n", {}).values() for r in rs.values())
                 for p in results["processes"].values())
    return 1 if failed else 0


def _write(results: dict, args: argparse.Namespace) -> tuple[Path, str]:
    processes = results["processes"]
    results["device"] = next((p["device"]["name"] for p in processes.values() if p.get("device")), "unknown device")
    summarize(processes)
    results["speedups"] = {str(n): speedups(processes, str(n)) for n in args.sizes}
    stem = args.out / (stats.device_slug(results["device"]) + ("-vs-diffrax-quick" if args.quick else "-vs-diffrax"))
    text = markdown(results)
    stem.with_suffix(".json").write_text(json.dumps(stats.json_ready(results), indent=1) + "\n")
    stem.with_suffix(".md").write_text(text + "\n")
    return stem, text


if __name__ == "__main__":
    sys.exit(main())
