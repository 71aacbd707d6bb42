"""Scale: graphs of 10k and 100k kernels, replayed eagerly and inside ``jax.jit``.

    python benchmarks/run.py --scale                 # N = 10k and 100k, both buffer patterns (~2 minutes)
    python benchmarks/large_graphs.py --points 10000:in_place --repeats 3   # one point

The workload is N ``add_one`` kernels on 1024 float32, captured into one
:class:`jaxgraph.CUDAGraph`, in two patterns of static buffers:

- ``one_site``: the static input and output are each touched by one kernel
  (``t = x + 1``, then N - 2 kernels between two scratch arrays, ``y = t + 1``):
  one kernel argument to rebind per buffer;
- ``in_place``: one static array is both the input and the output, and every
  kernel updates it in place (``s = s + 1``, N times, as an iterative method
  does): 2N kernel arguments point at it.

Either way a call computes ``x + N``, checked exactly against numpy on fresh
random input (outputs poisoned first) eagerly, on the first jitted call and
after the feedback loop below. Each point runs in its own process (XLA command
buffers off, so every call takes the launch path, and
``XLA_PYTHON_CLIENT_PREALLOCATE=false``) and reports:

- the phases: capture + instantiate, registration (``jaxgraph.replayable``),
  the first jitted call (trace, compile, first replay), with the host RSS and
  device memory in use after each;
- per-kernel replay time, in interleaved rounds after 16 untimed calls of each
  jit mode: ``eager`` (``g.replay()``, the floor), ``jit_feedback``
  (``x = f(x)``: XLA's buffers alternate, addresses repeat) and
  ``jit_rotating`` (8 inputs in turn, the last 8 results kept: new addresses
  on every call; a second registration of the graph, so the two modes share
  no executables);
- per call of each jit mode, from the native counters: the handler's host time,
  instantiations, executable rebinds and buffer copies;
- the handler's host time in a burst (``scale_modes.BURST`` calls back to back after
  the timed rounds): on the first call, which finds XLA's stream idle, and per
  call over the rest, with the graph in flight as in a long ``x = f(x)`` loop.
  A timed round at 100k holds only 3-4 calls, so its mean weighs the first
  call's cost heavily; ``benchmarks/probes/launch_wrapper_probe.cu`` shows the same
  first-launch cost on plain CUDA;
- ``step.bindings`` and the native ``describe_graph`` (its memory accounting).

Writes ``<device>-scale.json`` and ``.md`` into ``--out``, prints the markdown and
regenerates ``<device>-targets.md`` there (``targets.py``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import provenance, stats, timing  # noqa: E402
from benchmarks.reports import targets  # noqa: E402
from benchmarks.harness.large_graph_modes import (COUNTERS, counted_delta, eager_mode, feedback_mode,  # noqa: E402
                                    handler_burst, per_call, rotating_mode)
from benchmarks.reports.large_graphs_report import markdown  # noqa: E402
from benchmarks.harness.workload import BLOCK, SOURCE  # noqa: E402

__all__ = ["ELEMENTS", "PATTERNS", "main", "markdown", "measure", "parse_args", "parse_points"]

ROOT = Path(__file__).resolve().parents[1]
ELEMENTS = 1024
PATTERNS = ("one_site", "in_place")
DEFAULT_POINTS = tuple((n, p) for n in (10_000, 100_000) for p in PATTERNS)
XLA_FLAGS = "--xla_gpu_enable_command_buffer="  # off: every call takes the launch path
ROTATE = 8  # inputs of jit_rotating
WARMUP = 2 * ROTATE  # untimed calls of each jit mode first (the policy judges after 8 calls)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/large_graphs.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="results directory")
    p.add_argument("--points", type=parse_points, default=DEFAULT_POINTS,
                   help="comma-separated N:pattern (default: 10000 and 100000, one_site and in_place)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default %(default)s)")
    p.add_argument("--target-ms", type=float, default=300.0, help="wall time per sample (default %(default)s)")
    p.add_argument("--timeout-s", type=float, default=180.0, help="per point's process (default %(default)s)")
    p.add_argument("--child", help=argparse.SUPPRESS)  # N:pattern, measured in this process
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def parse_points(text: str) -> tuple[tuple[int, str], ...]:
    """``"10000:in_place,100000:one_site"`` -> ``((10000, "in_place"), (100000, "one_site"))``."""
    points = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        n, _, pattern = item.partition(":")
        if not n.isdigit() or int(n) < 2 or pattern not in PATTERNS:
            raise argparse.ArgumentTypeError(f"expected N:pattern with N >= 2 and pattern one of "
                                             f"{', '.join(PATTERNS)}; got {item!r}")
        points.append((int(n), pattern))
    if not points:
        raise argparse.ArgumentTypeError("no points given")
    return tuple(points)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        (n, pattern), = parse_points(args.child)
        print("RESULT " + json.dumps(stats.json_ready(measure(n, pattern, args))), flush=True)
        return 0
    start = time.perf_counter()
    results = {"schema": 1, "benchmark": "scale",
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join(["python", "benchmarks/large_graphs.py", *argv]), "xla_flags": XLA_FLAGS,
               "config": {"repeats": args.repeats, "target_ms": args.target_ms, "elements": ELEMENTS},
               "git": provenance.git_commit(),
               "points": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for n, pattern in args.points:
        results["points"].append(_child(n, pattern, args))
        results["device"] = next((p["device"] for p in results["points"] if "device" in p), {})
        results["wall_s"] = round(time.perf_counter() - start, 1)
        stem = stats.device_slug(results["device"].get("name", "")) + "-scale"
        text = markdown(results)  # written after every point: a run cut short keeps what it measured
        (args.out / f"{stem}.json").write_text(json.dumps(stats.json_ready(results), indent=1) + "\n")
        (args.out / f"{stem}.md").write_text(text)
    print(f"\nwrote {args.out / stem}.json and .md in {results['wall_s']:.0f} s\n\n{text}")
    print(f"wrote {targets.write(args.out, stem[:-len('-scale')])}")  # benchmarks/reports/targets.py
    return 0 if all("error" not in p for p in results["points"]) else 1


def _child(n: int, pattern: str, args: argparse.Namespace) -> dict:
    """Measure one point in its own process (memory figures are per process); never raises."""
    env = dict(os.environ, XLA_FLAGS=XLA_FLAGS, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "benchmarks.large_graphs", "--child", f"{n}:{pattern}", "--repeats", str(args.repeats),
           "--target-ms", str(args.target_ms)]
    print(f"[{n}:{pattern}] starting", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-3000:]
        return {"n": n, "pattern": pattern, "error": f"timed out after {args.timeout_s:.0f} s",
                "output_tail": tail.decode() if isinstance(tail, bytes) else tail}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
        print(f"[{n}:{pattern}] {line}", flush=True)
    return {"n": n, "pattern": pattern, "error": f"exit code {proc.returncode}",
            "output_tail": (proc.stdout + proc.stderr)[-3000:]}


# ----------------------------------------------------------------------------
# One point, in its own process
# ----------------------------------------------------------------------------


def measure(n: int, pattern: str, args: argparse.Namespace) -> dict:
    """Every figure of one point (see the module docstring); a failure is recorded, not raised."""
    from benchmarks.harness import worker

    out: dict[str, Any] = {"n": n, "pattern": pattern, "phases_s": {}, "memory": {}, "modes": {}}
    try:
        _measure(n, pattern, args, out)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        out["error"] = f"{type(exc).__name__}: {exc}"
    try:
        out["device"] = worker.device_info()
    except Exception:
        pass
    return out


def _measure(n: int, pattern: str, args: argparse.Namespace, out: dict) -> None:
    import jax
    import jax.numpy as jnp

    import jaxgraph
    from jaxgraph.diagnostics import native_module as native
    from jaxgraph.diagnostics import counters

    rng = np.random.default_rng()  # unseeded: every run checks new inputs
    kernel = jaxgraph.Kernel(SOURCE, "add_one")
    jnp.zeros(1).block_until_ready()  # JAX's backend up before the baseline
    arrays = [jaxgraph.zeros(ELEMENTS, np.float32) for _ in range(3)]
    jaxgraph.synchronize()
    out["memory"]["base"] = _memory()

    start = time.perf_counter()
    graph, x_s, y_s = _capture(kernel, n, pattern, arrays)  # arrays[2:] is its scratch
    out["phases_s"]["capture"] = time.perf_counter() - start
    out["memory"]["capture"] = _memory()

    def eager_once(x):
        x_s.copy_(x)
        if y_s is not x_s:
            y_s.fill_(np.nan)  # a replay that does nothing cannot pass
        jaxgraph.synchronize()
        graph.replay()
        jaxgraph.synchronize()
        return y_s.numpy()

    x = _fresh(rng)
    out["check"] = {"eager": _expect(eager_once(x), x, n)}

    start = time.perf_counter()
    step = jaxgraph.replayable(graph, inputs=[x_s], outputs=[y_s])
    out["phases_s"]["registration"] = time.perf_counter() - start
    out["memory"]["registration"] = _memory()
    f = jax.jit(step)
    x = _fresh(rng)
    before = counters()
    start = time.perf_counter()
    got = np.asarray(jax.block_until_ready(f(jnp.asarray(x))))
    out["phases_s"]["first_call"] = time.perf_counter() - start
    out["first_call_counters"] = counted_delta(before, counters(), 1)
    out["memory"]["first_call"] = _memory()
    out["check"]["first_call"] = _expect(got, x, n)
    xs = [jnp.asarray(_fresh(rng)) for _ in range(ROTATE)]
    # Rotating inputs get a registration of their own: its executables and policy state are not
    # those of the feedback loop, whose addresses repeat.
    rotating = jaxgraph.replayable(graph, inputs=[x_s], outputs=[y_s])
    f_rotating = jax.jit(rotating)

    def feedback_check() -> str:
        x0 = _fresh(rng)
        y = f(f(jnp.asarray(x0)))
        return _expect(np.asarray(jax.block_until_ready(y)), x0, 2 * n)

    out["check"]["jit_feedback"] = feedback_check()
    modes = {"eager": eager_mode(graph, n), "jit_feedback": feedback_mode(f, xs[0], n),
             "jit_rotating": rotating_mode(f_rotating, xs, n)}
    for key in ("jit_feedback", "jit_rotating"):
        modes[key].run(WARMUP)  # the cache filled and the bind-or-copy policy settled before timing
    for mode in modes.values():
        timing.calibrate(mode, args.target_ms / 1e3, max_calls=1000)
    for key in ("jit_feedback", "jit_rotating"):
        modes[key].info["counters"] = {c: 0 for c in COUNTERS}
        modes[key].info["calls_counted"] = 0
    samples, errors = timing.sample_interleaved(list(modes.values()), args.repeats)
    for key, mode in modes.items():
        record = {"samples": samples[key], "calls": mode.calls, **({"error": errors[key]} if key in errors else {})}
        if samples[key]:
            record["stats"] = stats.summarize(samples[key])
        if key != "eager" and samples[key] and samples["eager"]:
            record["ratio"] = [s / e for s, e in zip(samples[key], samples["eager"])]
        if "counters" in mode.info:
            record["per_call"] = per_call(mode.info["counters"], mode.info["calls_counted"])
        out["modes"][key] = record
    for key in ("jit_feedback", "jit_rotating"):
        out["modes"][key]["burst"] = handler_burst(modes[key])
    out["check"]["after"] = feedback_check()  # still exact after the policy had its say
    out["memory"]["end"] = _memory()
    out["bindings"] = [str(b) for b in step.bindings[graph.device]]
    out["bindings_rotating"] = [str(b) for b in rotating.bindings[graph.device]]
    out["graph"] = dict(native("replay").describe_graph(step.graph_id, graph.device))
    out["graph_rotating"] = dict(native("replay").describe_graph(rotating.graph_id, graph.device))


def _capture(kernel: Any, n: int, pattern: str, arrays: list) -> tuple:
    """The graph of ``pattern`` on static arrays, instantiated; returns (graph, static input, static output)."""
    import jaxgraph

    launch = kernel[ELEMENTS // BLOCK, BLOCK]
    g = jaxgraph.CUDAGraph()
    if pattern == "in_place":
        s = arrays[0]
        with jaxgraph.graph(g):
            for _ in range(n):
                launch(s, s, ELEMENTS)
        return g, s, s
    x_s, y_s = arrays[0], arrays[1]
    arrays.append(jaxgraph.zeros(ELEMENTS, np.float32))
    scratch = arrays[2:]  # kept alive by the caller's list
    with jaxgraph.graph(g):
        launch(scratch[0], x_s, ELEMENTS)
        for i in range(1, n - 1):
            launch(scratch[i % 2], scratch[(i - 1) % 2], ELEMENTS)
        launch(y_s, scratch[(n - 2) % 2], ELEMENTS)
    return g, x_s, y_s


def _memory() -> dict:
    """Host RSS and device memory in use (``cuMemGetInfo``), in MB."""
    from cuda.bindings import driver as cu

    rss_kb = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    err, free, total = cu.cuMemGetInfo()
    return {"host_rss_mb": rss_kb / 1024, "device_used_mb": (total - free) / 2**20}


def _fresh(rng: np.random.Generator) -> np.ndarray:
    """Integers in [-1000, 1000) as float32: adding N stays exact."""
    return rng.integers(-1000, 1000, ELEMENTS).astype(np.float32)


def _expect(got: np.ndarray, x: np.ndarray, steps: int) -> str:
    from benchmarks.harness.workload import check_result

    return check_result(got, x, steps)


if __name__ == "__main__":
    sys.exit(main())
