"""Run the whole benchmark on a GPU machine and write the results: one command.

    python benchmarks/run.py            # full run: N = 1, 10, 100, 1000, 7 interleaved repeats
    python benchmarks/run.py --quick    # smoke run: N = 1, 100, 3 repeats, every mode checked once
    python benchmarks/run.py --loops    # only the loop modes (loop_modes.py), N = 1, 10, 100, < 4 minutes
    python benchmarks/run.py --scale    # graphs of 10k and 100k kernels (large_graphs.py), < 3 minutes
    python benchmarks/run.py --runs 3   # the full run three times back to back (also with --quick, --loops)

One worker process per setting (``nojax``, then XLA command buffers ``off``,
``on`` and JAX ``defaults``), each with ``XLA_FLAGS`` set explicitly in its
environment and ``XLA_PYTHON_CLIENT_PREALLOCATE=false``; each measures the
raw ``cuGraphLaunch`` floor itself. Their JSON is merged into
``benchmarks/results/<device>.json`` (``<device>-quick.*`` with ``--quick``),
rendered as ``<device>.md`` and ``<device>.png`` (``python benchmarks/reports/plot.py
<json>`` renders the PNG elsewhere), and the markdown is printed last. Every
run (full, ``--loops``, ``--quick``, ``--scale``) also regenerates
``<device>-targets.md`` from the results JSON in ``--out`` (``targets.py``).
``--runs K`` repeats the whole run K times, each with fresh workers, and
writes each as ``<stem>-run1.*`` ... ``<stem>-runK.*``, the last again under
the plain name, and ``<stem>-runs.md``, the headline figures side by side
(``consecutive_runs.py``). Exit status 1 when a worker or a mode failed (the outputs are still written).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import config, provenance, stats  # noqa: E402
from benchmarks.reports import consecutive_runs, run_report, targets, verdicts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The driver's command line; ``--settings``/``--ns`` are comma-separated lists."""
    p = argparse.ArgumentParser(prog="benchmarks/run.py", description="jaxgraph benchmark driver")
    p.add_argument("--quick", action="store_true", help="smoke run: N = 1, 100, 3 repeats, short samples")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory (default: %(default)s)")
    p.add_argument("--loops", action="store_true",
                   help="only the loop modes (device loops, fori_loops) in every setting, 'while' included")
    p.add_argument("--scale", action="store_true",
                   help="only the scale run (benchmarks/large_graphs.py: N = 10k and 100k kernels, two buffer "
                   "patterns); writes <device>-scale.{json,md}")
    p.add_argument("--settings", type=_settings, default=None,
                   help="comma-separated subset of " + ",".join(config.SETTINGS)
                   + " (default: all but 'while'; all with --loops)")
    p.add_argument("--ns", type=_ints, help="chain lengths, e.g. 1,10,100,1000")
    p.add_argument("--modes", type=_modes, help="comma-separated subset of the modes (the raw floor always runs)")
    p.add_argument("--repeats", type=int, help="interleaved rounds per N")
    p.add_argument("--target-ms", type=float, help="wall time per sample")
    p.add_argument("--jax-calls-budget-s", type=float, help="skip a jax_calls N estimated to compile longer")
    p.add_argument("--timeout-s", type=float, default=None, help="per worker (default 240, quick 120)")
    p.add_argument("--capture-policy", choices=("auto", "bind", "copy", "whole"),
                   help="how replays go into XLA's command buffers (jaxgraph.diagnostics.CapturePolicy; "
                   "default: jaxgraph's)")
    p.add_argument("--runs", type=int, default=1,
                   help="run the whole harness this many times back to back, each with fresh workers: "
                   "<stem>-run1.json ..., the last also as <stem>.json, and <stem>-runs.md (default: %(default)s)")
    p.add_argument("--no-plot", action="store_true", help="write JSON and markdown only")
    args = p.parse_args(argv)
    if args.settings is None:
        args.settings = tuple(config.SETTINGS) if args.loops else config.DEFAULT_SETTINGS
    if args.runs < 1:
        p.error(f"--runs must be >= 1, got {args.runs}")
    if args.scale and args.runs > 1:
        p.error("--scale is one run; run it again for another")
    if args.scale and (args.loops or args.quick):
        p.error("--scale is its own run; benchmarks/large_graphs.py takes --points, --repeats and --target-ms")
    if args.loops and args.quick:
        p.error("--loops and --quick are separate runs; narrow --loops with --ns, --repeats, --target-ms")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.timeout_s is None:
        args.timeout_s = 120.0 if args.quick else 240.0
    return args


def build_config(args: argparse.Namespace) -> config.RunConfig:
    """The quick or full budgets, with the command line's overrides."""
    base = config.LOOPS if getattr(args, "loops", False) else config.QUICK if args.quick else config.FULL
    overrides = {"ns": args.ns, "repeats": args.repeats, "target_ms": args.target_ms,
                 "jax_calls_budget_s": args.jax_calls_budget_s, "modes": args.modes,
                 "capture_policy": getattr(args, "capture_policy", None)}
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


def worker_env(setting: config.Setting, base: dict[str, str]) -> dict[str, str]:
    """The worker's environment: ``XLA_FLAGS`` exactly the setting's (removed for JAX's defaults)."""
    env = dict(base)
    env.pop("XLA_FLAGS", None)
    if setting.xla_flags is not None:
        env["XLA_FLAGS"] = setting.xla_flags
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # leave device memory to jaxgraph and torch too
    env["PYTHONUNBUFFERED"] = "1"  # progress lines as they happen
    return env


def worker_command(setting: str, json_path: Path, cfg: config.RunConfig) -> list[str]:
    return [sys.executable, "-m", "benchmarks.harness.worker", "--setting", setting, "--json", str(json_path),
            "--config", json.dumps(cfg.to_json())]


def run_worker(setting: config.Setting, cfg: config.RunConfig | None, tmp: Path, timeout_s: float,
               command: list[str] | None = None) -> dict:
    """Run one worker, echoing its output; return its record, or ``{"failed": why}``.

    ``command``: another worker program (as ``benchmarks/vs_idiomatic.py`` runs), given
    ``--json <path>`` after its own arguments, instead of ``benchmarks.harness.worker`` with ``cfg``.
    """
    json_path = tmp / f"{setting.key}.json"
    print(f"[{setting.key}] starting: {setting.label}; XLA_FLAGS={setting.xla_flags!r}", flush=True)
    argv = [*command, "--json", str(json_path)] if command else worker_command(setting.key, json_path, cfg)
    proc = subprocess.Popen(argv, cwd=ROOT,
                            env=worker_env(setting, os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    tail: collections.deque = collections.deque(maxlen=30)
    try:
        for line in proc.stdout:
            print(line, end="", flush=True)
            tail.append(line)
        code = proc.wait()
    finally:
        timer.cancel()
    why = f"timed out after {timeout_s:.0f} s" if killed.is_set() else f"exit code {code}"
    failed = {"setting": setting.key, "xla_flags": setting.xla_flags, "failed": why,
              "output_tail": "".join(tail)[-3000:]}
    if not json_path.exists():
        return failed
    try:
        record = json.loads(json_path.read_text())
    except ValueError:  # stopped while writing
        return failed
    if record.get("partial"):  # a worker that records as it goes, stopped before its end
        return {**record, **failed, "failed": f"{why}; the groups measured before are kept"}
    if killed.is_set():
        return failed
    record["exit_code"] = code
    return record


def shared_seed(seed: int | None, argv: list[str]) -> tuple[int, list[str]]:
    """``seed``, or a fresh one appended to ``argv`` as ``--seed``: the driver passes its argv to every
    worker process, so each XLA setting's process draws the same random inputs."""
    if seed is not None:
        return seed, argv
    seed = int(np.random.SeedSequence().entropy % 2**31)
    return seed, [*argv, "--seed", str(seed)]


def collect_meta(cfg: config.RunConfig, argv: list[str], settings: tuple[str, ...] = ()) -> dict:
    """Date, command, versions, git commit, each setting's ``XLA_FLAGS`` and nvidia-smi's view of the device."""
    meta = {"schema": 1, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", "benchmarks/run.py", *argv]), "quick": cfg.quick,
            "config": cfg.to_json(), "versions": provenance.versions(),
            "git": provenance.git_commit(), "git_from": provenance.git_from()}
    if settings:  # what the driver sets (None: XLA_FLAGS unset); each process records its own too
        meta["xla_flags_by_setting"] = {key: config.SETTINGS[key].xla_flags for key in settings}
    smi = provenance.nvidia_smi()
    if smi:
        meta["device"] = {"nvidia_smi": smi, "driver": smi.split(",")[-1].strip()}
    return meta


def output_stem(results: dict) -> str:
    """``<device>``, ``<device>-quick`` or ``<device>-loops``: the results files' names without extension."""
    loops = results.get("config", {}).get("loops")
    return results["device"]["slug"] + ("-loops" if loops else "-quick" if results.get("quick") else "")


def write_outputs(results: dict, out_dir: Path, plot: bool = True, stem: str | None = None) -> list[Path]:
    """Write ``<stem>.json`` and ``.md`` (and ``.png`` when matplotlib is there); return the paths.

    ``stem`` defaults to :func:`output_stem`; a run of a group is written as ``<stem>-run<i>``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = stem or output_stem(results)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(stats.json_ready(results), indent=1) + "\n")
    md_path.write_text(run_report.markdown(results))
    written = [json_path, md_path]
    if plot:
        try:
            from benchmarks.reports import plot as plotting

            written.append(plotting.render(results, out_dir / f"{stem}.png"))
        except ImportError as exc:
            print(f"no PNG: {exc}; render it elsewhere with python benchmarks/reports/plot.py {json_path}")
        except Exception:  # a plotting bug must not cost the measured numbers
            traceback.print_exc()
    return written


def run_once(args: argparse.Namespace, cfg: config.RunConfig, argv: list[str]) -> dict:
    """One whole run: each setting's worker in turn, merged into the results document (``wall_s`` its time)."""
    start = time.perf_counter()
    meta = collect_meta(cfg, argv, args.settings)  # the date is the start of the run
    print(f"jaxgraph benchmark: settings {', '.join(args.settings)}; N = {list(cfg.ns)}; "
          f"{cfg.repeats} repeats of ~{cfg.target_ms:g} ms per mode", flush=True)
    processes = {}
    with tempfile.TemporaryDirectory(prefix="jaxgraph-bench-") as tmp:
        for key in args.settings:
            processes[key] = run_worker(config.SETTINGS[key], cfg, Path(tmp), args.timeout_s)
    meta["wall_s"] = round(time.perf_counter() - start, 1)
    return stats.merge(meta, processes)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.scale:
        from benchmarks import large_graphs

        return large_graphs.main(["--out", str(args.out)])  # it regenerates the targets file too
    cfg = build_config(args)
    done: list[dict] = []
    written: list[Path] = []
    for index in range(1, args.runs + 1):
        if args.runs > 1:
            print(f"\n=== run {index} of {args.runs} ===", flush=True)
        results = run_once(args, cfg, argv)
        if args.runs > 1:  # the group is named by its first run: its start and its files' stem
            group, stem = (done[0]["runs"]["group"], done[0]["runs"]["stem"]) if done else (results["date"],
                                                                                            output_stem(results))
            results["runs"] = consecutive_runs.record(index, args.runs, group, stem)
            written += write_outputs(results, args.out, plot=False, stem=f"{stem}-run{index}")
            print(f"run {index} of {args.runs}: {results['wall_s']:.0f} s", flush=True)
        done.append(results)
    results = done[-1]
    written += write_outputs(results, args.out, plot=not args.no_plot)  # the last run under the plain name
    if args.runs > 1:
        stem = results["runs"]["stem"]
        written.append(args.out / f"{stem}-runs.md")
        written[-1].write_text(consecutive_runs.markdown(done, consecutive_runs.file_names(stem, args.runs)))
    # Issue 8's targets are judged on the full and loop runs, issue 19's on the quick run too.
    targets_path = targets.write(args.out, results["device"]["slug"])
    written += [targets_path] if targets_path else []
    walls = ", ".join(f"{r['wall_s']:.0f} s" for r in done)
    print("\nwrote " + ", ".join(str(p) for p in written) + f"; wall time per run: {walls}\n")
    print(run_report.markdown(results))
    if args.runs > 1:
        print(consecutive_runs.markdown(done, consecutive_runs.file_names(results["runs"]["stem"], args.runs)))
    failed = [i for i, r in enumerate(done, 1)
              if r["failures"] or any(p.get("errors") for p in r["processes"].values())]
    if failed and args.runs > 1:
        print(f"failures or errors in {verdicts.runs_words(failed)}: see each run's markdown")
    return 1 if failed else 0


def _settings(text: str) -> tuple[str, ...]:
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in keys if k not in config.SETTINGS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"unknown setting(s) {unknown or text!r}; choose from "
                                         + ",".join(config.SETTINGS))
    return keys


def _modes(text: str) -> tuple[str, ...]:
    known = (set(config.NOJAX_MODES) | set(config.JAX_MODES) | set(config.SCALAR_INFO)
             | set(config.LOOP_NOJAX_MODES) | set(config.LOOP_JAX_MODES))
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in keys if k not in known]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {unknown or text!r}; choose from "
                                         + ",".join(sorted(known)))
    return keys


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"chain lengths must be >= 1, got {text!r}")
    return tuple(sorted(set(values)))


if __name__ == "__main__":
    sys.exit(main())
