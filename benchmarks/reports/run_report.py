"""The markdown report of a results document (what ``run.py`` writes and prints last).

Pure: :func:`markdown` reads the merged results dict (see ``stats.merge``) and
returns text, so it can be re-rendered from a committed JSON::

    python -c "import json, sys; from benchmarks import report; print(report.markdown(json.load(open(sys.argv[1]))))" results/x.json
"""

from __future__ import annotations

from ..harness.config import (COUNTERS, JAX_MODES, LOOP_JAX_MODES, LOOP_NOJAX_MODES, MIXED_MODES, MIXED_REPLAYS, MODE_INFO,
                               NOJAX_MODES, SCALAR_INFO, SETTINGS)

__all__ = ["fmt", "markdown"]

VERSION_KEYS = ("jax", "jaxlib", "cuda-bindings", "cuda-core", "torch", "cupy-cuda13x", "numpy")
PER_CALL_MODES = ("trivial_jit", "jit_loop", "jax_calls")


def markdown(results: dict) -> str:
    """The whole report: header, one table per process, per-call figures, extras, problems."""
    lines = _header(results)
    processes = results.get("processes", {})
    if results.get("config", {}).get("loops"):
        return "\n".join(lines + _loop_tables(processes) + _legend() + _problems(results)) + "\n"
    lines += _mixed_table(processes)
    for key in _ordered(processes):
        lines += _process_table(key, processes[key])
    lines += _per_call_table(processes)
    lines += _counters_table(processes)
    lines += _scalars_table(processes)
    lines += _legend()
    lines += _problems(results)
    return "\n".join(lines) + "\n"


def fmt(value: float | None) -> str:
    """A time with three or four significant digits and no exponent."""
    if value is None:
        return "–"
    for limit, digits in ((10, 3), (100, 2), (1000, 1)):
        if abs(value) < limit:
            return f"{value:.{digits}f}"
    return f"{value:.0f}"


# ----------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------


def _header(results: dict) -> list[str]:
    device = results.get("device", {})
    versions = results.get("versions", {})
    cfg = results.get("config", {})
    soft = ", ".join(f"{k} {versions[k]}" for k in VERSION_KEYS if k in versions)
    run = "quick run" if results.get("quick") else "full run"
    if cfg.get("capture_policy"):
        run += f", capture policy {cfg['capture_policy']}"
    group = results.get("runs") or {}
    if group.get("of", 1) > 1:
        run += f", run {group['index']} of {group['of']} (`{group['stem']}-runs.md`)"
    facts = [results.get("date", "undated"), f"{run}, {cfg.get('repeats', '?')} interleaved repeats per N",
             f"driver {device.get('driver', '?')}", soft, f"git {results.get('git') or '?'}"]
    return [
        f"# jaxgraph benchmark: {device.get('name', 'unknown device')}", "",
        " · ".join(f for f in facts if f), "",
        "A chain of N dependent `add_one` kernels (y = x + 1 on 4096 float32). Cells: median **us per "
        "kernel** (time per call / N) and, in parentheses, the ratio to the raw `cuGraphLaunch` floor "
        "measured in the same process; `jit_loop` and `jit_changing` also give it for streaming calls "
        "(the burst's fixed start and end left out: `harness.Mode.steady`). Spread (min-max, quartiles) "
        "and every sample are in the JSON. "
        "Host timings drift 10-30% between processes: compare ratios, not times across tables.", "",
    ]


def _process_table(key: str, proc: dict) -> list[str]:
    setting = SETTINGS.get(key)
    title = f"## {key}: {setting.label if setting else ''}"
    if proc.get("failed"):
        return [title, "", f"Failed: {proc['failed']}", ""]
    if not _ns(proc):
        return [title, "", "Nothing measured (see *Skipped and failed*).", ""]
    # trivial_jit is per call; the mixed modes have their own table.
    modes = [m for m in (NOJAX_MODES if key == "nojax" else JAX_MODES) if m != "trivial_jit" and m not in MIXED_MODES]
    lines = [title, "", "| N | " + " | ".join(modes) + " |", "| ---: |" + " ---: |" * len(modes)]
    for n in _ns(proc):
        cells = [_cell(proc, mode, n) for mode in modes]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines + [""]


def _cell(proc: dict, mode: str, n: str) -> str:
    entry = proc.get("modes", {}).get(mode, {}).get("by_n", {}).get(n)
    if entry is None:
        return "–"
    if "stats" not in entry:
        return "skipped" if "skipped" in entry else "error"
    text = fmt(entry["stats"]["median"])
    if mode != "raw" and entry.get("ratio") is not None:
        steady = entry.get("steady_ratio")
        text += f" ({entry['ratio']:.2f}x" + (f", streaming {steady:.2f}x)" if steady is not None else ")")
    return text + (" (error)" if "error" in entry else "")


def _loop_tables(processes: dict) -> list[str]:
    """``--loops``: us per step (per kernel x N) of each loop mode, ratio to the process's raw floor,
    then the same-process comparisons the issue's targets name."""
    lines = ["## Loops: us per step (R steps of N kernels; in parentheses, per-kernel ratio to raw)", ""]
    for key in _ordered(processes):
        proc = processes[key]
        setting = SETTINGS.get(key)
        modes = [m for m in (LOOP_NOJAX_MODES if key == "nojax" else LOOP_JAX_MODES)
                 if m in proc.get("modes", {})]
        lines += [f"### {key}: {setting.label if setting else ''}", ""]
        if proc.get("failed") or not modes:
            lines += [f"Failed: {proc['failed']}" if proc.get("failed") else "Nothing measured.", ""]
            continue
        lines += ["| N | " + " | ".join(modes) + " |", "| ---: |" + " ---: |" * len(modes)]
        for n in _ns(proc):
            lines.append(f"| {n} | " + " | ".join(_step_cell(proc, m, n) for m in modes) + " |")
        lines.append("")
    rows = []
    nojax = processes.get("nojax", {})
    for n in _ns(nojax):
        floor = _median(nojax, "loop_unrolled", n)
        for m in [m for m in LOOP_NOJAX_MODES if m.startswith(("loop_k", "loop_until")) or m == "loop_copy"]:
            if floor and _median(nojax, m, n):
                rows.append(f"| nojax | {n} | {m} / loop_unrolled | {_median(nojax, m, n) / floor:.2f}x |")
    for key in [k for k in _ordered(processes) if k != "nojax"]:
        proc = processes[key]
        for n in _ns(proc):
            # The idiomatic programs first: the same loop as a JAX user writes it, over jaxgraph's.
            pairs = [("jnp_fori", "loop_jit"), ("jnp_while", "loop_jit_until"),
                     *(("jnp_while", m) for m in LOOP_JAX_MODES if m.startswith("loop_jit_until_k")),
                     ("xla_fori", "loop_jit"), ("xla_while", "loop_jit_until"), ("jit_fori", "loop_jit")]
            for other, ours in pairs:
                theirs, mine = _median(proc, other, n), _median(proc, ours, n)
                if mine and theirs:
                    rows.append(f"| {key} | {n} | {other} / {ours} | {theirs / mine:.2f}x |")
    if rows:
        lines += ["### Ratios within one process (per step)", "", "| process | N | ratio | value |",
                  "| --- | ---: | --- | ---: |", *rows, ""]
    return lines + _stop_table(nojax) + _stop_targets(processes) + _trip_table(nojax)


def _stop_targets(processes: dict) -> list[str]:
    """Issue 37's exact-stop targets: the exact stop over the unrolled floor (nojax), and the one-kernel
    data-stopped loop in jit against the same kernel through ``jax_call`` in ``lax.while_loop``, each at
    its best XLA setting (every setting ran in its own process)."""
    nojax, rows = processes.get("nojax", {}), []
    jax_keys = [k for k in _ordered(processes) if k != "nojax"]
    for n in _ns(nojax) or sorted({n for k in jax_keys for n in _ns(processes[k])}, key=int):
        floor, exact = _median(nojax, "loop_unrolled", n), _median(nojax, "loop_until", n)
        over = f"{(exact - floor) * int(n):+.2f}" if floor and exact else "–"

        def best(mode: str) -> tuple[float | None, str]:
            found = [(_median(processes[k], mode, n), k) for k in jax_keys if _median(processes[k], mode, n)]
            return min(found) if found else (None, "–")

        (xla, xla_at), (mine, mine_at) = best("xla_while"), best("loop_jit_until")
        ratio = f"{xla / mine:.2f}x" if xla and mine else "–"
        rows.append(f"| {n} | {over} | {fmt(xla * int(n)) if xla else '–'} ({xla_at}) | "
                    f"{fmt(mine * int(n)) if mine else '–'} ({mine_at}) | {ratio} |")
    if not rows:
        return []
    return ["### Exact stop: the targets (us per step)", "",
            "`loop_until` over `loop_unrolled` (nojax; target at most +1.5 at N=1), and the data-stopped loop in "
            "jit, `loop_jit_until`, against `xla_while` (the same kernel through `Kernel.jax_call` in a data-stopped "
            "`lax.while_loop`), each at its best setting (target at least 2.5x at N=1).", "",
            "| N | loop_until over the floor | xla_while, best (setting) | loop_jit_until, best (setting) | ratio |",
            "| ---: | ---: | ---: | ---: | ---: |", *rows, ""]


def _stop_table(nojax: dict) -> list[str]:
    """The device stops' cost: us per step of each loop and what it adds over the unrolled floor."""
    modes = [m for m in LOOP_NOJAX_MODES if m == "loop_kdefault" or m.startswith("loop_until")]
    modes = [m for m in modes if m in nojax.get("modes", {})]
    rows = []
    for n in _ns(nojax):
        floor = _median(nojax, "loop_unrolled", n)
        if not floor:
            continue
        cells = []
        for m in modes:
            mine = _median(nojax, m, n)
            cells.append(f"{fmt(mine * int(n))} ({(mine - floor) * int(n):+.2f})" if mine else "–")
        rows.append(f"| {n} | {fmt(floor * int(n))} | " + " | ".join(cells) + " |")
    if not modes or not rows:
        return []
    return ["### Device stops over the unrolled floor (nojax, us per step)", "",
            "Median us per step, in parentheses what it adds over `loop_unrolled` (us per step). `loop_until` "
            "is the exact stop; `loop_until_kK` tests the flag once every K steps; `loop_kdefault` has no flag.",
            "", "| N | loop_unrolled | " + " | ".join(modes) + " |", "| ---: | ---: |" + " ---: |" * len(modes),
            *rows, ""]


def _trip_table(nojax: dict) -> list[str]:
    """What one WHILE trip adds over the unrolled floor: (per-step time - floor's) * K, per N and K."""
    modes = [m for m in LOOP_NOJAX_MODES if m.startswith("loop_k") and m in nojax.get("modes", {})]
    rows = []
    for n in _ns(nojax):
        floor = _median(nojax, "loop_unrolled", n)
        cells = []
        for m in modes:
            entry = nojax["modes"][m]["by_n"].get(n, {})
            mine = _median(nojax, m, n)
            cells.append(fmt((mine - floor) * int(n) * entry["unroll"]) + f" (K={entry['unroll']})"
                         if floor and mine and entry.get("unroll") else "–")
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    if not modes or not rows:
        return []
    return ["### A WHILE trip over the unrolled floor (nojax, us per trip)", "",
            "(us per step - `loop_unrolled`'s) x K: what one trip of the device loop adds. Where N x K is "
            "large the difference is within the samples' spread.", "",
            "| N | " + " | ".join(modes) + " |", "| ---: |" + " ---: |" * len(modes), *rows, ""]


def _median(proc: dict, mode: str, n: str) -> float | None:
    entry = proc.get("modes", {}).get(mode, {}).get("by_n", {}).get(n, {})
    return entry["stats"]["median"] if "stats" in entry else None


def _step_cell(proc: dict, mode: str, n: str) -> str:
    entry = proc.get("modes", {}).get(mode, {}).get("by_n", {}).get(n)
    if entry is None:
        return "–"
    if "stats" not in entry:
        return "skipped" if "skipped" in entry else "error"
    text = fmt(entry["stats"]["median"] * int(n))
    if entry.get("unroll"):
        text += f" K={entry['unroll']}"
    if mode != "raw" and entry.get("ratio") is not None:
        text += f" ({entry['ratio']:.2f}x)"
    return text


def _per_call_table(processes: dict) -> list[str]:
    keys = [k for k in _ordered(processes) if k != "nojax" and _ns(processes[k])]
    if not keys:
        return []
    ns = sorted({n for k in keys for n in _ns(processes[k])}, key=int)
    lines = ["## Per call (us per jitted call of the whole chain)", "",
             "| setting | mode | " + " | ".join(f"N={n}" for n in ns) + " |",
             "| --- | --- |" + " ---: |" * len(ns)]
    for key in keys:
        proc = processes[key]
        for mode in PER_CALL_MODES:
            lines.append(f"| {key} | {mode} | " + " | ".join(_per_call(proc, mode, n) for n in ns) + " |")
        ratios = [_changing_ratio(proc, n) for n in ns]
        lines.append(f"| {key} | jit_changing / jit_loop | " + " | ".join(ratios) + " |")
    return lines + [""]


def _per_call(proc: dict, mode: str, n: str) -> str:
    entry = proc.get("modes", {}).get(mode, {}).get("by_n", {}).get(n, {})
    if "stats" not in entry:
        return "skipped" if "skipped" in entry else "–"
    per_kernel = entry["stats"]["median"]
    # trivial_jit is recorded per call; the chain modes per kernel, N kernels per call.
    return fmt(per_kernel if proc["modes"][mode].get("unit") == "us_per_call" else per_kernel * int(n))


def _changing_ratio(proc: dict, n: str) -> str:
    by_n = {m: proc.get("modes", {}).get(m, {}).get("by_n", {}).get(n, {}) for m in ("jit_changing", "jit_loop")}
    if not all("stats" in e for e in by_n.values()):
        return "–"
    return f"{by_n['jit_changing']['stats']['median'] / by_n['jit_loop']['stats']['median']:.2f}x"


def _mixed_table(processes: dict) -> list[str]:
    """The headline: replays between XLA ops against the same program of `jax_call` calls, per setting and N."""
    rows = []
    for key in [k for k in _ordered(processes) if k != "nojax"]:
        proc = processes[key]
        for n in _ns(proc):
            pairs = (("mixed", "mixed_calls"), ("mixed_changing", "mixed_calls_changing"))
            if not any(_median(proc, m, n) for pair in pairs for m in pair):
                continue
            cells = []
            for mine, theirs in pairs:
                cells += [_mixed_cell(proc, mine, n), _mixed_cell(proc, theirs, n), _ahead(proc, mine, theirs, n)]
            rows.append(f"| {key} | {n} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [f"## Replays between XLA ops ({MIXED_REPLAYS} stages of N kernels, `x * 2 - 3` between them)", "",
            "us per jitted call (in parentheses, per kernel over the process's raw floor). *ahead*: the "
            "`jax_call` program's time over the replay program's (above 1: replay is faster).", "",
            "| setting | N | replay (fixed input) | jax_calls (fixed) | ahead | replay (rotating inputs) "
            "| jax_calls (rotating) | ahead |", "| --- | ---: |" + " ---: |" * 6, *rows, ""]


def _mixed_cell(proc: dict, mode: str, n: str) -> str:
    entry = proc.get("modes", {}).get(mode, {}).get("by_n", {}).get(n, {})
    if "stats" not in entry:
        return "skipped" if "skipped" in entry else "error" if "error" in entry else "–"
    text = fmt(entry["stats"]["median"] * entry.get("per_call", int(n) * MIXED_REPLAYS))
    return text + (f" ({entry['ratio']:.2f}x)" if entry.get("ratio") is not None else "")


def _ahead(proc: dict, mine: str, theirs: str, n: str) -> str:
    a, b = _median(proc, mine, n), _median(proc, theirs, n)
    return f"{b / a:.2f}x" if a and b else "–"


def _counters_table(processes: dict) -> list[str]:
    """The replay handler's counters per call of each mode that called it."""
    rows = []
    for key in [k for k in _ordered(processes) if k != "nojax"]:
        proc = processes[key]
        for n in _ns(proc):
            for mode in proc.get("modes", {}):
                counted = proc["modes"][mode].get("by_n", {}).get(n, {}).get("counters")
                if not counted or not counted.get("handler_calls"):
                    continue
                cells = [_count(counted.get(c, 0)) for c in COUNTERS if c != "handler_ns"]
                settle = proc["modes"][mode]["by_n"][n]
                note = "" if settle.get("settled", True) else " (not settled)"
                rows.append(f"| {key} | {n} | {mode}{note} | " + " | ".join(cells)
                            + f" | {fmt(counted.get('handler_ns', 0) / 1e3)} |")
    if not rows:
        return []
    names = [c for c in COUNTERS if c != "handler_ns"]
    return ["## What the replay handler did per call (median over the samples)", "",
            "`jaxgraph.diagnostics.counters()`, change per jitted call: handler calls, calls per replay path "
            "(launch, splice_nodes, splice_whole, uncaptured_launch), executables instantiated, kernel nodes "
            "rebound in executables, buffers copied, buffers switched to copying by their cost, and the "
            "handler's host time. Under XLA command buffers a "
            "splice is a re-record of XLA's graph: when XLA's addresses repeat there is none.", "",
            "| setting | N | mode | " + " | ".join(names) + " | handler us |",
            "| --- | ---: | --- |" + " ---: |" * (len(names) + 1), *rows, ""]


def _count(value: float) -> str:
    return "0" if value == 0 else f"{value:.0f}" if value >= 100 or float(value).is_integer() else f"{value:.2f}"


def _scalars_table(processes: dict) -> list[str]:
    rows = []
    for key in _ordered(processes):
        for name, entry in processes[key].get("scalars", {}).items():
            label = SCALAR_INFO.get(name, name)
            if "stats" not in entry:
                rows.append(f"| {label} | {entry.get('skipped') or entry.get('error', '–')} | |")
                continue
            unit = "ms" if entry.get("unit") == "ms" else "us"
            s = entry["stats"]
            rows.append(f"| {label} | {fmt(s['median'])} {unit} | {fmt(s['min'])}-{fmt(s['max'])} |")
    if not rows:
        return []
    return ["## Capture and eager launch (host wall time; eager: per launch)", "",
            "| figure | median | min-max |", "| --- | ---: | ---: |", *rows, ""]


def _legend() -> list[str]:
    lines = ["## Modes", ""]
    lines += [f"- `{key}`: {text}" for key, text in MODE_INFO.items()]
    lines.append("- raw, replay and torch are timed with CUDA events; jit modes and extras by host wall clock "
                 "over many calls ending in `jax.block_until_ready`. Every mode was checked against numpy "
                 "(x + N on fresh random input) before it was timed.")
    return lines + [""]


def _problems(results: dict) -> list[str]:
    lines = []
    for key, why in results.get("failures", {}).items():
        lines.append(f"- {key}: process failed: {why}")
    for key in _ordered(results.get("processes", {})):
        proc = results["processes"][key]
        for mode, record in proc.get("modes", {}).items():
            for n, entry in record.get("by_n", {}).items():
                if "skipped" in entry:
                    lines.append(f"- {key} {mode} N={n}: skipped: {entry['skipped']}")
        lines += [f"- {key}: {error}" for error in proc.get("errors", [])]
    return (["## Skipped and failed", "", *lines, ""]) if lines else []


def _ordered(processes: dict) -> list[str]:
    """Settings in the canonical order, unknown ones last."""
    return sorted(processes, key=lambda k: list(SETTINGS).index(k) if k in SETTINGS else len(SETTINGS))


def _ns(proc: dict) -> list[str]:
    return sorted({n for m in proc.get("modes", {}).values() for n in m.get("by_n", {})}, key=int)
