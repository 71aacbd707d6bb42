"""What an executable updated in place costs on every later launch, against fresh ones.

Run:  python benchmarks/probes/exec_update_cost.py [--n 1000] [--repeats 9] [--launches 20] [--out DIR]

Why: the replay handler (``ffi/replay/device_graph.h``) gives a new set of XLA
buffer addresses a freshly instantiated executable rather than updating an
old one in place, because kernels of an executable updated in place
(``cuGraphExecUpdate``) ran slower on every later launch. This measures it.

Two captures of the same chain of N dependent ``add_one`` kernels
(``benchmarks/harness/workload.py``), on buffers A and B. Modes, each launched
``--launches`` times per sample on one stream, timed with CUDA events, in
interleaved rounds:

- ``fresh``: ``cuGraphInstantiate`` of the B capture;
- ``updated``: an executable of the A capture, then ``cuGraphExecUpdate``
  pointed at the B capture (same topology, other buffers);
- ``set_params``: an executable of the A capture whose kernel nodes are each
  rewritten with the B capture's parameters (``cuGraphExecKernelNodeSetParams``,
  as the replay handler rewrites an executable in place);
- ``set_params_same``: the same, each node rewritten with its own (unchanged)
  parameters: whether the slowdown comes from the rewrite or from new values;
- ``set_params_one``: only the first of the N nodes rewritten with its own
  parameters: whether the slowdown is per rewritten kernel or per executable;
- ``alternate_2`` / ``alternate_4``: launches alternating over 2 or 4 fresh
  executables (of A and B), as the handler's cache of executables does.

Each mode is checked against numpy once before timing (fresh random input,
output poisoned). Writes ``<device>-exec_update.json`` and ``.md`` to
``--out`` (default ``benchmarks/results``) and prints the markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness import stats  # noqa: E402
from benchmarks.probes.micro import ROOT, run_meta, write_report  # noqa: E402
from benchmarks.harness.workload import BLOCK, ELEMENTS, GRID, SOURCE, check_result, random_input  # noqa: E402

__all__ = ["MODES", "capture_chain", "main", "markdown", "measure"]

MODES = ("fresh", "updated", "set_params", "set_params_same", "set_params_one", "alternate_2", "alternate_4")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/probes/exec_update_cost.py", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1000, help="kernels in the chain (default %(default)s)")
    p.add_argument("--repeats", type=int, default=9, help="interleaved rounds (default %(default)s)")
    p.add_argument("--launches", type=int, default=20, help="graph launches per sample (default %(default)s)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    meta = run_meta("benchmarks/probes/exec_update_cost.py", argv if argv is not None else sys.argv[1:])
    if meta is None:
        return 0
    results = {"benchmark": "exec_update_cost", **meta, "n": args.n, "repeats": args.repeats, "launches": args.launches}
    results["modes"] = measure(args.n, args.repeats, args.launches, np.random.default_rng())
    write_report(results, markdown(results), args.out, "exec_update")
    return 0


def measure(n: int, repeats: int, launches: int, rng: np.random.Generator) -> dict:
    """Per mode: samples of us per kernel, their summary, the ratio to ``fresh`` and the numpy check."""
    import jaxgraph
    from cuda.bindings import driver

    def call(name, *args):
        err, *values = getattr(driver, name)(*args)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{name} failed: {err}")
        return values[0] if len(values) == 1 else values

    kernel = jaxgraph.Kernel(SOURCE, "add_one")
    kernel.handle  # noqa: B018 - loaded before the captures
    a, b = capture_chain(kernel, n), capture_chain(kernel, n)
    instantiate = lambda g: call("cuGraphInstantiate", driver.CUgraph(g.raw_cuda_graph()), 0)
    updated = instantiate(a.graph)
    call("cuGraphExecUpdate", updated, driver.CUgraph(b.graph.raw_cuda_graph()))  # now writes B's buffers
    set_params = instantiate(a.graph)
    same, one = instantiate(a.graph), instantiate(a.graph)
    nodes_a = _nodes(a, call)
    for i, (node_a, node_b) in enumerate(zip(nodes_a, _nodes(b, call))):  # both in capture order
        call("cuGraphExecKernelNodeSetParams", set_params, node_a, call("cuGraphKernelNodeGetParams", node_b))
        own = call("cuGraphKernelNodeGetParams", node_a)
        call("cuGraphExecKernelNodeSetParams", same, node_a, own)
        if i == 0:
            call("cuGraphExecKernelNodeSetParams", one, node_a, own)
    fresh = [instantiate(b.graph), instantiate(a.graph), instantiate(b.graph), instantiate(a.graph)]
    plans = {"fresh": [(fresh[0], b)], "updated": [(updated, b)], "set_params": [(set_params, b)],
             "set_params_same": [(same, a)], "set_params_one": [(one, a)],
             "alternate_2": [(fresh[0], b), (fresh[1], a)], "alternate_4": list(zip(fresh, (b, a, b, a)))}
    stream = jaxgraph.Stream()
    h = driver.CUstream(int(stream))
    start, end = jaxgraph.Event(enable_timing=True), jaxgraph.Event(enable_timing=True)
    out = {}
    for mode, plan in plans.items():  # each executable computes x + n from its own buffers
        checks = [_check(exe, chain, h, n, rng, call) for exe, chain in plan]
        out[mode] = {"check": checks[0], "samples": []}
    for _ in range(repeats):
        for mode, plan in plans.items():
            for exe, _chain in plan:  # warm: uploaded, caches hot
                call("cuGraphLaunch", exe, h)
            start.record(stream)
            for i in range(launches):
                call("cuGraphLaunch", plan[i % len(plan)][0], h)
            end.record(stream)
            end.synchronize()
            out[mode]["samples"].append(start.elapsed_time(end) * 1000.0 / (launches * n))
    for record in out.values():
        record["stats"] = stats.summarize(record["samples"])
    floor = out["fresh"]["samples"]
    for record in out.values():
        record["ratio"] = record["stats"]["median"] / out["fresh"]["stats"]["median"]
        paired = stats.paired_ratios(record["samples"], floor)
        record["ratio_min"], record["ratio_max"] = min(paired), max(paired)
    for exe in [updated, set_params, same, one, *fresh]:
        call("cuGraphExecDestroy", exe)
    return out


def markdown(results: dict) -> str:
    """The table: us per kernel per mode, ratio to ``fresh`` (median, and the per-round range)."""
    lines = [f"# Executables updated in place: {results.get('device', '?')}", "",
             f"{results.get('date', '?')} · git {results.get('git') or '?'} · driver {results.get('driver', '?')} · "
             f"`{results.get('command', '')}`", "",
             f"A chain of {results['n']} dependent `add_one` kernels (4096 floats), {results['launches']} launches "
             f"per sample, {results['repeats']} interleaved rounds; us per kernel (median) and ratio to `fresh`.", "",
             "| mode | us per kernel | min-max | ratio to fresh (rounds) |", "| --- | ---: | ---: | ---: |"]
    for mode in MODES:
        r = results["modes"].get(mode)
        if r is None:
            continue
        s = r["stats"]
        lines.append(f"| `{mode}` | {s['median']:.3f} | {s['min']:.3f}-{s['max']:.3f} | "
                     f"{r['ratio']:.3f}x ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}) |")
    what = {"set_params": "Kernel nodes rewritten in place (cuGraphExecKernelNodeSetParams)",
            "set_params_same": "Kernel nodes rewritten in place with their own parameters",
            "set_params_one": "One kernel node of the N rewritten in place with its own parameters"}
    for mode, text in what.items():
        r = results["modes"].get(mode)
        if r is not None:
            extra = r["stats"]["median"] - results["modes"]["fresh"]["stats"]["median"]
            lines += ["", f"{text}: {extra:+.3f} us per kernel on every launch ({r['ratio']:.2f}x a fresh one)."]
    r = results["modes"].get("updated")
    if r is not None:
        extra = r["stats"]["median"] - results["modes"]["fresh"]["stats"]["median"]
        lines += ["", f"An executable updated in place: {extra:+.3f} us per kernel on every launch "
                      f"({r['ratio']:.2f}x a fresh one)."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


class _Chain:
    """One capture of the chain on its own buffers (``keep_graph=True``: the template stays)."""

    def __init__(self, graph, x_s, y_s):
        self.graph, self.x_s, self.y_s = graph, x_s, y_s


def capture_chain(kernel, n: int) -> _Chain:
    """The chain of ``n`` kernels captured on new arrays, its template kept (``.graph``, ``.x_s``, ``.y_s``)."""
    import jaxgraph

    x_s, y_s = jaxgraph.zeros(ELEMENTS, np.float32), jaxgraph.zeros(ELEMENTS, np.float32)
    g = jaxgraph.CUDAGraph(keep_graph=True)
    launch = kernel[GRID, BLOCK]
    with jaxgraph.graph(g):
        launch(y_s, x_s, ELEMENTS)
        for _ in range(n - 1):
            launch(y_s, y_s, ELEMENTS)
    return _Chain(g, x_s, y_s)


def _nodes(chain: _Chain, call) -> list:
    """The kernel nodes of ``chain``'s template, in the order the driver lists them (capture order)."""
    from cuda.bindings import driver

    graph = driver.CUgraph(chain.graph.raw_cuda_graph())
    _, count = call("cuGraphGetNodes", graph, 0)
    nodes, _ = call("cuGraphGetNodes", graph, count)
    return list(nodes)


def _check(exe, chain: _Chain, stream, n: int, rng: np.random.Generator, call) -> str:
    """Fresh input, poisoned output, one launch of ``exe``: ``chain``'s output must be x + n."""
    import jaxgraph

    x = random_input(rng)
    chain.x_s.copy_(x)
    chain.y_s.fill_(np.nan)
    jaxgraph.synchronize()
    call("cuGraphLaunch", exe, stream)
    call("cuStreamSynchronize", stream)
    return check_result(chain.y_s.numpy(), x, n)


if __name__ == "__main__":
    sys.exit(main())
