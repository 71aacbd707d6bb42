"""The markdown of a scale run (``benchmarks/large_graphs.py``): per-kernel replay, the handler's work, phases, memory.

Pure formatting of the JSON the scale run writes; ``tests/benchmarks/test_scale_benchmark.py``
checks it on synthetic records.
"""

from __future__ import annotations

import json

from benchmarks.harness import stats
from benchmarks.reports.run_report import fmt

__all__ = ["markdown"]

def markdown(results: dict) -> str:
    """The tables of a scale run: per-kernel replay, the handler's work per call, phases and memory."""
    lines = [f"# Scale: N `add_one` kernels on {results.get('config', {}).get('elements', '?')} floats", "",
             f"{results.get('date', '')}, {results.get('device', {}).get('name', 'unknown device')}, "
             f"git {results.get('git')}, XLA_FLAGS=`{results.get('xla_flags')}`, "
             f"{results.get('config', {}).get('repeats')} interleaved rounds.", "",
             "| N | pattern | eager us/kernel | jit_feedback | jit_rotating | handler us/call (feedback, rotating) "
             "| of which cudaGraphLaunch | of which copies | of which choosing the executable | instantiations/call "
             "| rebinds/call | copies/call (on the stream, by copy nodes) |",
             "| --- " * 12 + "|"]
    for p in results["points"]:
        if "error" in p and not p.get("modes"):
            lines.append(f"| {p['n']} | {p['pattern']} | failed: {p['error']} | | | | | | | | | |")
            continue
        m = p["modes"]
        pc = {k: m.get(k, {}).get("per_call", {}) for k in ("jit_feedback", "jit_rotating")}

        def pair(field: str) -> str:
            return ", ".join(fmt(pc[k].get(field)) for k in ("jit_feedback", "jit_rotating"))

        lines.append(f"| {p['n']} | {p['pattern']} | {_median(m, 'eager')} | {_ratio(m, 'jit_feedback')} | "
                     f"{_ratio(m, 'jit_rotating')} | {pair('handler_us')} | {pair('launch_us')} | {pair('copy_us')} | "
                     f"{pair('prepare_us')} | {pair('instantiate')} | "
                     f"{pair('rebind')} | {pair('copy')}; {pair('node_copy')} |")
    lines += ["", "Handler host time in a burst (us; feedback, rotating): the first call after the device went idle, "
              "then per call over the next calls, queued while the earlier ones run.", "",
              "| N | pattern | calls | first call | per call after it | of which cudaGraphLaunch "
              "| of which choosing the executable |", "| --- " * 7 + "|"]
    for p in results["points"]:
        bursts = {k: p.get("modes", {}).get(k, {}).get("burst") for k in ("jit_feedback", "jit_rotating")}
        if not all(bursts.values()):
            continue

        def burst(part: str, field: str) -> str:
            return ", ".join(fmt(b[part].get(field)) for b in bursts.values())

        lines.append(f"| {p['n']} | {p['pattern']} | {bursts['jit_feedback']['calls']} | "
                     f"{burst('first', 'handler_us')} | {burst('steady', 'handler_us')} | "
                     f"{burst('steady', 'launch_us')} | {burst('steady', 'prepare_us')} |")
    lines += ["", "| N | pattern | capture s | registration s | first call s | host MB (capture, registration, "
              "first call) | device MB (same) | device KB per kernel | bindings |", "| --- " * 9 + "|"]
    for p in results["points"]:
        ph, mem = p.get("phases_s", {}), p.get("memory", {})
        host = _growth(mem, "host_rss_mb")
        dev = _growth(mem, "device_used_mb")
        per_kernel = ""
        if "base" in mem and "first_call" in mem:
            per_kernel = fmt((mem["first_call"]["device_used_mb"] - mem["base"]["device_used_mb"]) * 1024 / p["n"])
        lines.append(f"| {p['n']} | {p['pattern']} | {fmt(ph.get('capture'))} | {fmt(ph.get('registration'))} | "
                     f"{fmt(ph.get('first_call'))} | {host} | {dev} | {per_kernel} | "
                     f"{'; '.join(p.get('bindings', []))} |")
    lines += ["", "| N | pattern | bindings after jit_rotating (its own registration) |", "| --- | --- | --- |"]
    lines += [f"| {p['n']} | {p['pattern']} | {'; '.join(p.get('bindings_rotating', []))} |" for p in results["points"]]
    lines += ["", "Ratios: median of per-round jit over eager (`g.replay()`) per kernel. Memory: growth over the "
              "process's baseline after each phase. `jit_feedback`: `x = f(x)` (XLA's addresses repeat); "
              "`jit_rotating`: 8 inputs in turn.", ""]
    for p in results["points"]:
        for key in ("graph", "graph_rotating"):
            if p.get(key):
                lines.append(f"- {p['n']} {p['pattern']}: describe_graph ({key}) {json.dumps(p[key])}")
        if p.get("error"):
            lines.append(f"- {p['n']} {p['pattern']}: error {p['error']}")
    return "\n".join(lines) + "\n"


def _median(modes: dict, key: str) -> str:
    s = modes.get(key, {}).get("stats")
    return fmt(s["median"]) if s else "-"


def _ratio(modes: dict, key: str) -> str:
    r = modes.get(key, {}).get("ratio")
    if not r:
        return modes.get(key, {}).get("error", "-")
    return f"{fmt(stats.summarize(r)['median'])}x"


def _growth(mem: dict, field: str) -> str:
    if "base" not in mem:
        return "-"
    base = mem["base"][field]
    return ", ".join(fmt(mem[k][field] - base) if k in mem else "-" for k in ("capture", "registration", "first_call"))


