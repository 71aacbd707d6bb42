"""Where one replay call's host time goes, at N=1 (where fixed per-call costs dominate).

    python benchmarks/probes/profile_call.py [--out DIR] [--repeats 15] [--calls 2000]

One process per setting (as ``run.py``: XLA reads ``XLA_FLAGS`` once). Each
times, in interleaved rounds, host microseconds per call of:

- ``nojax``: ``cuGraphLaunch`` from cuda.bindings (the harness's floor), the
  native ``graph_launch`` jaxgraph's ``replay()`` ends in, and ``g.replay()``;
- ``off`` / ``on`` / ``defaults``: a trivial jitted call, one ``Kernel.jax_call``
  in jit, one replayable in jit, and the ``jaxgraph_replay`` handler's own host
  time per call (its counters); then per-iteration costs of a jitted
  ``lax.fori_loop`` of ``x + 1``, of one ``jax_call`` and of one replay, so a
  loop's own cost (XLA's loop, not the body) is visible.

The difference between a replay call and a trivial jitted call, minus the
handler's time, is what JAX and XLA spend dispatching a custom call: the
``jax_call`` row shows the same cost for a call that is not ours to trim.
Writes ``profile_call.json`` and ``profile_call.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import run  # noqa: E402
from benchmarks.harness import config, stats  # noqa: E402
from benchmarks.harness.workload import SOURCE, Chain, check_result, random_input  # noqa: E402

FORI_TRIPS = 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="directory for profile_call.json / .md")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000, help="calls per sample")
    parser.add_argument("--setting", help=argparse.SUPPRESS)  # set in the child processes
    args = parser.parse_args(argv)
    if args.setting:
        result = measure(args.setting, args.repeats, args.calls)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for key in ("nojax", "off", "on", "defaults"):
        results[key] = _child(key, args)
    with open(os.path.join(args.out, "profile_call.json"), "w") as f:
        json.dump(results, f, indent=1)
    table = markdown(results)
    with open(os.path.join(args.out, "profile_call.md"), "w") as f:
        f.write(table)
    print(table)
    return 0


def measure(setting: str, repeats: int, calls: int) -> dict:
    """Median host us per call of each probe of ``setting`` (see the module docstring)."""
    import jaxgraph

    rng = np.random.default_rng()
    kernel = jaxgraph.Kernel(SOURCE, "add_one")
    chain = Chain(kernel, 1)
    if setting == "nojax":
        probes = _eager_probes(chain, rng)
    else:
        probes = _jit_probes(chain, kernel, rng)
    samples: dict[str, list[float]] = {key: [] for key in probes}
    extra: dict[str, list[float]] = {}
    for _ in range(repeats):  # interleaved: drift hits every probe alike
        for key, run in probes.items():
            before = _handler_counters()
            seconds, units = run(calls)
            samples[key].append(seconds / units * 1e6)
            after = _handler_counters()
            if after[0] > before[0]:
                extra.setdefault(f"{key}.handler", []).append((after[1] - before[1]) / (after[0] - before[0]) / 1e3)
    out = {key: stats.summarize(v) for key, v in samples.items()}
    out.update({key: stats.summarize(v) for key, v in extra.items()})
    out["_flags"] = os.environ.get("XLA_FLAGS")
    return out


def _eager_probes(chain: Chain, rng: np.random.Generator) -> dict:
    import jaxgraph
    from cuda.bindings import driver as cu
    from jaxgraph.diagnostics import native_module as native

    stream = jaxgraph.Stream()
    g = chain.graph
    g.replay()
    chain.check(g.replay, rng)
    exec_handle, exec_address = cu.CUgraphExec(g.raw_cuda_graph_exec()), g.raw_cuda_graph_exec()
    h_stream, stream_address = cu.CUstream(int(stream)), int(stream)
    launch_bindings, launch_native = cu.cuGraphLaunch, native("launch").graph_launch

    def timed(body: Callable[[], Any]) -> Callable[[int], tuple[float, int]]:
        def run(calls: int) -> tuple[float, int]:
            with jaxgraph.stream(stream):  # g.replay() launches on the current stream
                stream.synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    body()
                stream.synchronize()
                return time.perf_counter() - start, calls
        return run

    return {"cuda_bindings_cuGraphLaunch": timed(lambda: launch_bindings(exec_handle, h_stream)),
            "native_graph_launch": timed(lambda: launch_native(exec_address, stream_address)),
            "g.replay()": timed(g.replay)}


def _jit_probes(chain: Chain, kernel: Any, rng: np.random.Generator) -> dict:
    import jax
    import jaxgraph

    step = jaxgraph.replayable(chain.graph, inputs=[chain.x_s], outputs=[chain.y_s])
    one_kernel = lambda x: kernel.jax_call(jax.ShapeDtypeStruct(x.shape, x.dtype), x, x.size)  # noqa: E731
    trivial = lambda x: x + 1  # noqa: E731

    def fori(body: Callable) -> Callable:
        return jax.jit(lambda x: jax.lax.fori_loop(0, FORI_TRIPS, lambda i, v: body(v), x))

    functions = {"trivial_jit": (jax.jit(trivial), 1), "jax_call_jit": (jax.jit(one_kernel), 1),
                 "replay_jit": (jax.jit(step), 1), "fori_trivial": (fori(trivial), FORI_TRIPS),
                 "fori_jax_call": (fori(one_kernel), FORI_TRIPS), "fori_replay": (fori(step), FORI_TRIPS)}
    x_host = random_input(rng)
    x = jax.numpy.asarray(x_host)
    probes = {}
    for key, (f, trips) in functions.items():
        check_result(f(x), x_host, trips)  # compiles, and a fast wrong answer cannot hide

        def run(calls: int, f=f, trips=trips) -> tuple[float, int]:
            calls = max(3, calls // trips)  # a fori call runs `trips` iterations
            jax.block_until_ready(x)
            jaxgraph.synchronize()
            out = None
            start = time.perf_counter()
            for _ in range(calls):
                out = f(x)
            jax.block_until_ready(out)
            return time.perf_counter() - start, calls * trips

        probes[key] = run
    return probes


def _handler_counters() -> tuple[int, int]:
    try:
        from jaxgraph.diagnostics import native_module as native

        c = native("replay").counters()
        return c["handler_calls"], c["handler_ns"]
    except Exception:
        return 0, 0


def _child(key: str, args: argparse.Namespace) -> dict:
    setting = config.SETTINGS[key]
    env = run.worker_env(setting, os.environ)  # the flags exactly as the harness's workers get them
    print(f"[profile_call] {key}: {setting.label}", flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--setting", key, "--repeats", str(args.repeats),
           "--calls", str(args.calls)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"_error": (proc.stderr or proc.stdout)[-2000:]}


def markdown(results: dict) -> str:
    """One table per process: probe, median host us per call (fori rows: per iteration), range."""
    lines = ["# Per-call host time at N=1 (median us, [min, max])", ""]
    for key, probes in results.items():
        lines += [f"## {key}: {config.SETTINGS[key].label}", ""]
        if "_error" in probes:
            lines += ["```", probes["_error"], "```", ""]
            continue
        lines += ["| probe | us | range |", "| --- | --- | --- |"]
        for probe, s in probes.items():
            if probe.startswith("_"):
                continue
            lines.append(f"| {probe} | {s['median']:.2f} | [{s['min']:.2f}, {s['max']:.2f}] |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
