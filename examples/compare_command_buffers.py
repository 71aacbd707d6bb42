"""The same kernels through XLA, with and without its command buffers, and through jaxgraph: one table.

Run:  python examples/compare_command_buffers.py                        # N = 10, 100; about a minute
      python examples/compare_command_buffers.py --ns 10 --repeats 1    # a smoke run, seconds

The workload is benchmarks/'s: a chain of N dependent tiny kernels (y = x + 1
on 4096 floats). This is a thin front over that harness: one worker process
per XLA flag setting (XLA reads XLA_FLAGS once, when it starts), each timing

  raw        cuGraphLaunch of the captured chain from Python: the floor
  jax_calls  the chain as N Kernel.jax_call custom calls in one jax.jit: XLA
             launches each kernel, or records them into its command buffer
  jit_loop   the captured chain as one jaxgraph replayable in jax.jit
  jit_fori   replays in a jitted lax.fori_loop, each output the next input

and prints us per kernel with the ratio to the floor of the same process
(for the replay in jit also that of streaming calls: each sample's burst of
calls from an idle device, less a burst of 1/8 as many, which leaves out
JAX's first dispatch after idle and its wait for the last result).
Each mode's result is checked against numpy, exactly, before it is timed.
``python benchmarks/run.py`` measures every mode, with more repeats.

It has no idiomatic JAX row on purpose: the chain is ``x + N`` in jax.numpy,
one fused kernel no launch mechanism beats. It compares launch mechanisms on
the same kernels; what a JAX user would write instead is compared by
``benchmarks/vs_idiomatic.py`` and ``benchmarks/vs_diffrax.py`` (the README's
"How fast").
"""

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks/ package of this checkout

from benchmarks import run  # noqa: E402
from benchmarks.harness import config, stats  # noqa: E402
from benchmarks.reports import run_report  # noqa: E402

COLUMNS = {
    "jax_calls": "XLA: N jax_calls in one jit",
    "jit_loop": "jaxgraph: replay in jit",
    "jit_fori": "jaxgraph: replays in fori_loop",
    "raw": "floor: raw cuGraphLaunch",
}
JAX_SETTINGS = ("off", "on", "defaults")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ns", type=run._ints, default=(10, 100), help="chain lengths (default 10,100)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per N (default 3)")
    # As long as the harness's samples: shorter ones read XLA's modes slower (benchmarks/harness/config.py, QUICK).
    p.add_argument("--target-ms", type=float, default=25.0, help="wall time per sample (default 25)")
    p.add_argument("--settings", default=",".join(JAX_SETTINGS),
                   help="comma-separated subset of " + ",".join(JAX_SETTINGS))
    p.add_argument("--timeout-s", type=float, default=180.0, help="per worker process (default 180)")
    args = p.parse_args(argv)
    args.settings = tuple(s.strip() for s in args.settings.split(",") if s.strip())
    if not args.settings or any(s not in JAX_SETTINGS for s in args.settings):
        p.error(f"--settings: choose from {','.join(JAX_SETTINGS)}")
    return args


def table(results, ns):
    """One block per N: a row per XLA setting, us per kernel (ratio to the floor) per mode."""
    processes = results["processes"]
    lines = []
    for n in ns:
        lines += ["", f"N = {n} kernels: us per kernel (ratio to the raw floor of the same process)", ""]
        header = ["XLA setting"] + list(COLUMNS.values())
        rows = [header, ["---"] * len(header)]
        for key, proc in processes.items():
            row = [f"{key}: {config.SETTINGS[key].label}"]
            for mode in COLUMNS:
                entry = proc.get("modes", {}).get(mode, {}).get("by_n", {}).get(str(n), {})
                if "stats" not in entry:
                    row.append(entry.get("skipped") or entry.get("error") or "–")
                elif mode == config.FLOOR:
                    row.append(run_report.fmt(entry["stats"]["median"]))
                else:  # replay in jit: also its streaming calls, without the burst's start and end
                    steady = entry.get("steady_ratio")
                    row.append(f"{run_report.fmt(entry['stats']['median'])} ({entry['ratio']:.2f}x"
                               + (f"; streaming {steady:.2f}x)" if steady is not None else ")"))
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def checks(results):
    """What the workers verified before timing, or the problems that stopped a mode."""
    checked, problems = 0, []
    for key, proc in results["processes"].items():
        if proc.get("failed"):
            problems.append(f"{key}: {proc['failed']}\n{proc.get('output_tail', '')}")
        problems += [f"{key}: {e}" for e in proc.get("errors", [])]
        for mode in COLUMNS:
            entries = proc.get("modes", {}).get(mode, {}).get("by_n", {}).values()
            checked += sum("matches numpy" in entry.get("check", "") for entry in entries)
    return checked, problems


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("a CUDA GPU is needed to time XLA and jaxgraph on the same kernels: none found, so this "
              "example stops here")
        return 0
    cfg = dataclasses.replace(config.QUICK, ns=args.ns, repeats=args.repeats, target_ms=args.target_ms,
                              modes=tuple(COLUMNS))
    print(f"timing N = {list(args.ns)} under XLA settings {', '.join(args.settings)}: one process each "
          f"({args.repeats} rounds of ~{args.target_ms:g} ms per mode)", flush=True)
    with tempfile.TemporaryDirectory(prefix="jaxgraph-compare-") as tmp:
        processes = {key: run.run_worker(config.SETTINGS[key], cfg, Path(tmp), args.timeout_s)
                     for key in args.settings}
    results = stats.merge({}, processes)
    print(table(results, args.ns))
    checked, problems = checks(results)
    if problems or not checked:
        print("\nproblems:\n" + ("\n".join(problems) or "nothing was measured"))
        return 1
    print(f"\nevery mode's result matches numpy: {checked} exact checks on fresh random input, before timing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
