"""The report of a gray_scott benchmark run (``benchmarks/gray_scott_bench.py``): medians, speeds, markdown.

Pure functions of the JSON the run writes (the modes' descriptions included);
``tests/benchmarks/test_gray_scott_bench.py`` checks them on synthetic records.
"""

from __future__ import annotations

import statistics

from benchmarks.harness import stats
from benchmarks.reports.run_report import fmt

__all__ = ["MODES", "markdown", "summarize"]

MODES = {
    "xla_fori": "XLA: the kernels as `Kernel.jax_call`s in the fori_loop",
    "graphed_fori": "jaxgraph: the example's graphed step (in place) in the fori_loop",
    "graphed_fori_min1": "the same, jitted with `compiler_options={\"xla_gpu_graph_min_graph_size\": 1}`",
    "graphed_fresh": "the graphed step as before: new u, v and a memset for the total",
    "graphed_memset": "in place, the total zeroed by a memset node instead of a kernel",
    "graphed_forked": "in place, the zero kernel on a forked stream: a graph branch beside the first substep",
    "loop_jit": "device loop (`graphed_loop`) in jit: one FFI call, not a fori_loop",
}


def summarize(processes: dict) -> dict:
    """Medians per mode and the graphed step's speed relative to XLA's (XLA's time over ours), per setting."""
    for proc in processes.values():
        modes = proc.get("modes", {})
        for record in modes.values():
            if record.get("samples"):
                record["stats"] = stats.summarize(record["samples"])
        xla = modes.get("xla_fori", {}).get("samples")
        proc["speed_vs_xla"] = {}
        for key, record in modes.items():
            if key == "xla_fori" or not xla or not record.get("samples"):
                continue
            rounds = [a / b for a, b in zip(xla, record["samples"]) if b > 0]
            proc["speed_vs_xla"][key] = {"median": statistics.median(xla) / statistics.median(record["samples"]),
                                         "min": min(rounds), "max": max(rounds)}
    return processes


def markdown(results: dict) -> str:
    """The headline (graphed step vs XLA per setting), then every mode with what each process saw."""
    cfg = results["config"]
    lines = [f"# gray_scott step in a jitted fori_loop: {results.get('device', 'unknown device')}", "",
             f"{results.get('date')} · git {results.get('git') or '?'} · {cfg['repeats']} interleaved rounds · "
             f"{cfg['grid']} x {cfg['grid']} grid, {cfg['steps']} steps of {2 * cfg['substeps'] + 2} kernels "
             "per call", "",
             "Median host wall time per step (back-to-back calls of the jitted loop, the last waited for "
             "with `block_until_ready`); "
             "speed = XLA's time over the mode's (> 1: faster than XLA), the medians' ratio, min-max over the "
             "rounds' paired ratios. Each XLA setting in its own process.", "",
             "| setting | XLA `jax_call`s us/step | graphed step us/step | graphed step speed vs XLA |",
             "| --- | ---: | ---: | ---: |"]
    for setting, proc in results["processes"].items():
        if proc.get("failed"):
            lines.append(f"| {setting} | failed: {proc['failed']} | | |")
            continue
        modes, r = proc.get("modes", {}), proc["speed_vs_xla"].get("graphed_fori")
        lines.append(f"| {setting} | {fmt(_median(modes, 'xla_fori'))} | {fmt(_median(modes, 'graphed_fori'))} | "
                     + (f"**{r['median']:.3f}x** ({r['min']:.2f}-{r['max']:.2f})" if r else "–") + " |")
    lines += ["", "| mode | what |", "| --- | --- |"] + [f"| `{k}` | {w} |" for k, w in MODES.items()]
    lines += ["", "## Every mode, per setting", "",
              "Replay counters per step once warm (nonzero ones; none: XLA replays its command buffer without "
              "calling the handler), the replay handler's host time per call, array copies XLA placed in the "
              "loop (outside the entry computation), and the replayable's bindings.", ""]
    for setting, proc in results["processes"].items():
        lines += [f"### {setting}: `XLA_FLAGS={proc.get('xla_flags')}`", ""]
        if proc.get("failed"):
            lines += [f"failed: {proc['failed']}", ""]
            continue
        lines += ["| mode | us/step | speed vs XLA | per step | handler us/call | loop copies | bindings |",
                  "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
        for key, record in proc.get("modes", {}).items():
            if "error" in record or "skipped" in record:
                lines.append(f"| `{key}` | {record.get('error') or record.get('skipped')} | | | | | |")
                continue
            r = proc["speed_vs_xla"].get(key)
            speed = f"{r['median']:.3f}x" if r else "–"
            per_step = ", ".join(f"{k} {v:g}" for k, v in record.get("per_step", {}).items() if v) or "none"
            handler = record.get("handler_us_per_handler_call")
            c = record.get("compiled", {})
            lines.append(f"| `{key}` | {fmt(_median(proc['modes'], key))} | "
                         f"{speed} | {per_step} | "
                         f"{fmt(handler) if handler is not None else '–'} | {c.get('loop_array_copies', '–')} | "
                         f"{'; '.join(record.get('bindings', [])) or '–'} |")
        lines.append("")
    first = next((p for p in results["processes"].values() if p.get("summary")), None)
    if first:
        lines += ["The graphed step (`graphed_fori`) and the device loop:", "", "```", first["summary"],
                  first.get("loop", ""), "```"]
    return "\n".join(lines)


def _median(modes: dict, key: str) -> float | None:
    record = modes.get(key, {})
    return statistics.median(record["samples"]) if record.get("samples") else None
