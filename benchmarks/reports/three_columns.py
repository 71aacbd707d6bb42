"""What the kernels buy and what the graph buys: ``vs_idiomatic.py``'s results in three columns (issue 37).

Per workload: the idiomatic JAX program (as a user writes it, and its fair
form: as many sweeps or iterations a ``lax.while_loop`` trip as the device
loop runs between reads of its flag), the same CUDA kernels through
``Kernel.jax_call`` in a ``lax`` loop (no graph), and jaxgraph's device loop in
``jax.jit``. "jaxgraph vs idiomatic" is what kernels and graph buy together,
"jaxgraph vs same kernels" what the graph adds to the kernels. Each column at
its own best XLA setting (:func:`rows` with :func:`best`) and again all at
JAX's defaults (:func:`at` ``"defaults"``).

Pure functions of the results document after
``vs_idiomatic_report.summarize`` added each record's ``stats`` and each
mode's ``best``; ``tests/benchmarks/test_vs_idiomatic.py`` checks them on
synthetic records, and ``docs/measured_pages.py`` fills the docs' figures
(:func:`figures`) from them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

__all__ = ["CASES", "ROWS", "TARGETS", "Row", "at", "best", "figures", "fmt_time", "markdown", "rows", "summarize",
           "time_per_step", "values"]

CASES = ("gray_scott", "poisson_jacobi", "poisson_cg")  # the tables' order


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: which modes fill the columns for one kernel of a case."""

    case: str
    kernel: str            # "blocked kernel", "single-block kernel", ...
    key: str               # its part of a figure's name: GS_256_<key>_...
    idiomatic: str
    fair: str | None       # None: the idiomatic program already runs a fixed loop (it is its own fair form)
    kernels: tuple         # the same kernels via jax_call: the fastest of these
    jaxgraph: tuple        # jaxgraph's device loop in jit: the fastest of these
    note: str = ""


# Notes are formatted with the run's config: {per_step} S, {fair_sweeps} / {fair_iterations} F, {check_every} /
# {cg_check_every} K, {block_per_launch} B.
KERNEL_NOTE = ("single block: this path's speed is the kernel's. The kernel runs up to {block_per_launch} sweeps "
               "(iterations) a launch and tests the tolerance on chip, so launches are few and long and the graph, "
               "which only relaunches it, has little to add: compare it with the same kernel through `jax_call` beside "
               "it")
EXACT_NOTE = ("the exact stop: the device loop reads its flag once a step of {per_step} {unit}, the kernels' "
              "`while_loop` once a trip of {fair} (`--fair-{flag}`)")
EVERY_NOTE = ("`check_every={k}`: the device loop reads its flag once per {k} steps ({k} x {per_step} {unit}), the "
              "kernels' `while_loop` still once a trip of {fair}; the every-K stop is jaxgraph's option (up to {k_1} "
              "steps of no-op kernels after the stop), and XLA's loop could run more a trip too")
ROWS = (
    Row("gray_scott", "blocked kernel", "blocked", "jnp", None, ("xla_blocked",), ("loop_blocked_jit",),
        "the temporally blocked kernel (several substeps a launch), the same one in both columns"),
    Row("gray_scott", "fused kernel", "fused", "jnp", None, ("xla_fused",), ("loop_fused_jit",),
        "one substep a launch, as XLA's own fusion"),
    Row("poisson_jacobi", "multi-block kernel, exact stop", "multi", "jnp_jacobi", "jnp_jacobi_fair",
        ("xla_jacobi_fair",), ("jacobi_exact",), EXACT_NOTE),
    Row("poisson_jacobi", "multi-block kernel, check_every", "multi_every", "jnp_jacobi", "jnp_jacobi_fair",
        ("xla_jacobi_fair",), ("jacobi_every",), EVERY_NOTE),
    Row("poisson_jacobi", "single-block kernel", "single", "jnp_jacobi", "jnp_jacobi_fair", ("xla_jacobi_block",),
        ("jacobi_block_exact", "jacobi_block_every"), KERNEL_NOTE),
    Row("poisson_cg", "multi-block kernel, exact stop", "multi", "jax_scipy_cg", "jnp_cg_fair", ("xla_cg_fair",),
        ("cg_exact",), EXACT_NOTE),
    Row("poisson_cg", "multi-block kernel, check_every", "multi_every", "jax_scipy_cg", "jnp_cg_fair",
        ("xla_cg_fair",), ("cg_every",), EVERY_NOTE),
    Row("poisson_cg", "single-block kernel", "single", "jax_scipy_cg", "jnp_cg_fair", ("xla_cg_block",),
        ("cg_block_exact", "cg_block_every"), KERNEL_NOTE),
)
PREFIX = {"gray_scott": "GS", "poisson_jacobi": "JACOBI", "poisson_cg": "CG"}
COLUMNS = ("idiomatic", "fair", "kernels", "jaxgraph")
# Issue 37's targets for Gray-Scott (the blocked kernel's row, each side at its best setting), at every grid.
TARGETS = (("vs_kernels", 1.5, "its own blocked kernel through `jax_call` in `fori_loop`"),
           ("vs_idiomatic", 2.0, "idiomatic JAX"))

Pick = Callable[[str, str], "dict | None"]


def best(results: dict) -> Pick:
    """Each mode at its best setting (``results["best"]``, from ``vs_idiomatic_report.summarize``)."""
    table = results.get("best", {})
    return lambda group, mode: table.get(group, {}).get(mode)


def at(results: dict, setting: str) -> Pick:
    """Each mode at one setting (its process's samples), or ``None`` where that process did not time it."""
    groups = results.get("processes", {}).get(setting, {}).get("groups", {})

    def pick(group: str, mode: str) -> dict | None:
        record = groups.get(group, {}).get("modes", {}).get(mode) or {}
        s = record.get("stats")
        if not s:
            return None
        return {"setting": setting, "median": s["median"], "min": s["min"], "max": s["max"],
                "steps": record.get("steps"), "launches": record.get("launches")}
    return pick


def _fastest(pick: Pick, group: str, modes: tuple) -> dict | None:
    found = [(cell["median"], mode, cell) for mode in modes if (cell := pick(group, mode))]
    if not found:
        return None
    _, mode, cell = min(found, key=lambda t: t[0])
    return {**cell, "mode": mode}


def _ratio(base: dict | None, ours: dict | None) -> dict | None:
    """base over ours: the medians, and the extreme rounds both ways (slowest of ours against fastest of base)."""
    if not base or not ours:
        return None
    return {"median": base["median"] / ours["median"], "min": base["min"] / ours["max"],
            "max": base["max"] / ours["min"]}


def _groups(results: dict) -> list[str]:
    seen = {g for p in results.get("processes", {}).values() for g in p.get("groups", {})}
    known = [g for g in seen if g.split("/")[0] in CASES]
    return sorted(known, key=lambda g: (CASES.index(g.split("/")[0]), int(g.split("/")[1])))


def rows(results: dict, pick: Pick) -> list[dict]:
    """The table's rows: per group and kernel (where jaxgraph's loop was timed), the four cells and the ratios."""
    out = []
    for group in _groups(results):
        case, n = group.split("/")
        for row in (r for r in ROWS if r.case == case):
            cells = {"idiomatic": _fastest(pick, group, (row.idiomatic,)),
                     "fair": _fastest(pick, group, (row.fair or row.idiomatic,)),
                     "kernels": _fastest(pick, group, row.kernels),
                     "jaxgraph": _fastest(pick, group, row.jaxgraph)}
            if cells["jaxgraph"] is None:
                continue
            out.append({"group": group, "case": case, "n": int(n), "kernel": row.kernel, "key": row.key,
                        "note": row.note, "fair_is_idiomatic": row.fair is None, "cells": cells,
                        "ratios": {"vs_idiomatic": _ratio(cells["idiomatic"], cells["jaxgraph"]),
                                   "vs_fair": _ratio(cells["fair"], cells["jaxgraph"]),
                                   "vs_kernels": _ratio(cells["kernels"], cells["jaxgraph"]),
                                   "kernels_vs_idiomatic": _ratio(cells["idiomatic"], cells["kernels"]),
                                   "kernels_vs_fair": _ratio(cells["fair"], cells["kernels"]),
                                   "fair_vs_idiomatic": _ratio(cells["idiomatic"], cells["fair"])}})
    return out


def time_per_step(results: dict, pick: Pick) -> list[dict]:
    """Gray-Scott, where the time goes: per grid, us a step of the blocked kernel's device loop in jit, of the
    eager device loop (CUDA events: the kernels and the graph's own cost a step), of the same kernel via
    ``jax_call`` in ``fori_loop``, and what XLA's loop adds a step over the device loop."""
    out = []
    for group in _groups(results):
        case, n = group.split("/")
        if case != "gray_scott":
            continue
        cells = {k: pick(group, m) for k, m in (("jaxgraph", "loop_blocked_jit"), ("eager", "loop_blocked_eager"),
                                                ("kernels", "xla_blocked"), ("idiomatic", "jnp"))}
        steps = next((c.get("steps") for c in cells.values() if c and c.get("steps")), None)
        if not steps or not cells["jaxgraph"]:
            continue
        us = {k: (c["median"] / steps if c else None) for k, c in cells.items()}
        launches = next((c.get("launches") for c in cells.values() if c and c.get("launches")), None)
        extra = us["kernels"] - us["jaxgraph"] if us["kernels"] is not None else None
        out.append({"group": group, "n": int(n), "steps": steps, "launches": launches, "us": us,
                    "settings": {k: c["setting"] for k, c in cells.items() if c}, "xla_extra_us": extra})
    return out


def summarize(results: dict) -> dict:
    """Add ``results["columns"]``: the rows at each one's best setting and at JAX's defaults, Gray-Scott's
    time a step, and the verdicts on issue 37's Gray-Scott targets."""
    table = rows(results, best(results))
    defaults = rows(results, at(results, "defaults")) if "defaults" in results.get("processes", {}) else []
    verdicts = []
    for r in table:
        if r["case"] != "gray_scott" or r["key"] != "blocked":
            continue
        for ratio, want, against in TARGETS:
            got = r["ratios"][ratio]
            v = {"group": r["group"], "ratio": ratio, "want": want, "against": against}
            if got is None:
                v["status"] = "not measured"
            else:
                v.update(got=got["median"], range=[got["min"], got["max"]],
                         status="met" if got["median"] >= want else
                         f"missed by {(1 - got['median'] / want) * 100:.0f}% ({got['median']:.2f}x of {want:g}x)")
            verdicts.append(v)
    results["columns"] = {"best": table, "defaults": defaults, "gray_scott_per_step": time_per_step(
        results, best(results)), "targets": verdicts}
    return results


# ----------------------------------------------------------------------------
# Text
# ----------------------------------------------------------------------------


def fmt_time(us: float | None) -> str:
    if us is None:
        return "–"
    return f"{us / 1e3:.2f} ms" if us >= 1e3 else f"{us:.1f} us"


def _range(lo: float, hi: float, unit: str = "") -> str:
    return f"{lo:.2f}-{hi:.2f}{unit}"


def fmt_cell(cell: dict | None, mode: bool = False) -> str:
    """``2.38 ms (2.30-2.45) · on`` (median (range over the rounds) · the setting), with the mode if asked."""
    if not cell:
        return "–"
    scale, unit, digits = (1e3, " ms", 2) if cell["median"] >= 1e3 else (1.0, " us", 1)
    lo, hi, med = (cell[k] / scale for k in ("min", "max", "median"))
    text = f"{med:.{digits}f}{unit} ({lo:.{digits}f}-{hi:.{digits}f}) · {cell['setting']}"
    return text + (f" · `{cell['mode']}`" if mode else "")


def fmt_ratio(r: dict | None, bold: bool = True) -> str:
    if not r:
        return "–"
    x = f"{r['median']:.2f}x"
    return f"{'**' + x + '**' if bold else x} ({_range(r['min'], r['max'])})"


def workload(row: dict, cfg: dict) -> str:
    n = row["n"]
    if row["case"] == "gray_scott":
        return f"Gray-Scott {n}², {cfg.get('steps', '?')} x {cfg.get('substeps', '?')}, {row['kernel']}"
    name = "Jacobi" if row["case"] == "poisson_jacobi" else "CG"
    k = cfg.get("check_every" if name == "Jacobi" else "cg_check_every", "K")
    kernel = row["kernel"].replace("check_every", f"`check_every={k}`")
    return f"{name} {n}², rtol {cfg.get('rtol', 0):g}, {kernel}"


def note_text(row: dict, cfg: dict) -> str:
    """A row's note with the run's numbers (sweeps a step, a trip, K, B) in it."""
    jacobi = row["case"] == "poisson_jacobi"
    k = cfg.get("check_every" if jacobi else "cg_check_every", "K")
    return row["note"].format(per_step=cfg.get("per_step", "S"), unit="sweeps" if jacobi else "iterations",
                              fair=cfg.get("fair_sweeps" if jacobi else "fair_iterations", "F"),
                              flag="sweeps" if jacobi else "iterations", k=k,
                              k_1=k - 1 if isinstance(k, int) else "K-1", block_per_launch=cfg.get("block_per_launch",
                                                                                                  "B"))


def _table(table: list[dict], cfg: dict) -> list[str]:
    lines = ["| workload | idiomatic | fair idiomatic | same kernels via `jax_call` | jaxgraph | jaxgraph vs idiomatic "
             "(vs fair) | jaxgraph vs same kernels |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    notes: dict[str, int] = {}
    for r in table:
        c, q = r["cells"], r["ratios"]
        mark = ""
        if r["note"]:
            mark = " [" + str(notes.setdefault(note_text(r, cfg), len(notes) + 1)) + "]"
        fair = "= idiomatic (a fixed loop)" if r["fair_is_idiomatic"] else fmt_cell(c["fair"], True)
        vs = fmt_ratio(q["vs_idiomatic"]) + ("" if r["fair_is_idiomatic"] else f" / {fmt_ratio(q['vs_fair'], False)}")
        lines.append(f"| {workload(r, cfg)}{mark} | {fmt_cell(c['idiomatic'])} | {fair} | "
                     f"{fmt_cell(c['kernels'], True)} | {fmt_cell(c['jaxgraph'], True)} | {vs} | "
                     f"{fmt_ratio(q['vs_kernels'])} |")
    lines += [""] + [f"[{i}] {note}." for note, i in notes.items()]
    return lines


def markdown(results: dict) -> list[str]:
    """The three-column tables (best settings, then JAX's defaults), Gray-Scott's time a step and its targets."""
    cols, cfg = results.get("columns") or {}, results.get("config", {})
    if not cols.get("best"):
        return []
    fair = (f"{cfg.get('fair_sweeps', '?')} Jacobi sweeps or {cfg.get('fair_iterations', '?')} CG iterations a "
            "`lax.while_loop` trip, each after the stop masked (the same result and count as testing after every "
            "one)")
    lines = ["## What the kernels buy and what the graph buys (each column at its best XLA setting)", "",
             "Per workload: the idiomatic JAX program as a user writes it (Jacobi: the tolerance tested after every "
             "sweep; CG: `jax.scipy.sparse.linalg.cg`), its fair form (" + fair + "; CG written in `jax.numpy`), "
             "the same CUDA kernels jaxgraph runs called through `Kernel.jax_call` in `lax.fori_loop` / "
             "`lax.while_loop` (no graph; Jacobi's and CG's multi-block kernels as many a trip as the fair form), "
             f"and jaxgraph's device loop in `jax.jit` (Poisson: {cfg.get('per_step', '?')} sweeps (iterations) a "
             f"step, the exact stop reading its flag once a step, `check_every=K` once per K steps). Each cell: "
             "median per call (range over the rounds) · the XLA setting it ran fastest at · the mode (rows of the "
             "tables below). **jaxgraph vs idiomatic** is what kernels and graph buy together; **jaxgraph vs same "
             "kernels** is what the graph adds to the kernels; ranges: the slowest round of one against the "
             "fastest of the other, both ways.", ""]
    lines += _table(cols["best"], cfg)
    lines += ["", "## The same at JAX's defaults (`XLA_FLAGS` unset: what most users run)", ""]
    lines += _table(cols["defaults"], cfg) if cols.get("defaults") else ["(the `defaults` setting was not run)"]
    per_step = cols.get("gray_scott_per_step") or []
    if per_step:
        lines += ["", "## Gray-Scott: where the time goes (blocked kernel, us a step, each at its best setting)", "",
                  "The eager device loop is timed by CUDA events around the graph's launch: the kernels and the "
                  "graph's own cost a step, no host or `jit` dispatch. **XLA's loop adds** is the same kernels "
                  "via `jax_call` in `fori_loop` less the device loop in jit, a step.", "",
                  "| grid | launches a step | idiomatic | device loop in jit | eager device loop (events) | same "
                  "kernels via `jax_call` | XLA's loop adds |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for g in per_step:
            us = g["us"]
            cell = lambda k: (f"{us[k]:.2f} ({g['settings'][k]})" if us.get(k) is not None else "–")  # noqa: E731
            extra = f"{g['xla_extra_us']:+.2f}" if g["xla_extra_us"] is not None else "–"
            lines.append(f"| {g['n']}² | {g.get('launches') or '–'} | {cell('idiomatic')} | {cell('jaxgraph')} | "
                         f"{cell('eager')} | {cell('kernels')} | {extra} |")
    if cols.get("targets"):
        lines += ["", "## Issue 37's Gray-Scott targets (blocked kernel, each side at its best setting)", "",
                  "| grid | jaxgraph against | target | measured (range) | verdict |", "| --- | --- | ---: | ---: | --- |"]
        for t in cols["targets"]:
            got = f"**{t['got']:.2f}x** ({_range(*t['range'])})" if "got" in t else "–"
            lines.append(f"| {t['group'].split('/')[1]}² | {t['against']} | {t['want']:g}x | {got} | {t['status']} |")
    return lines


# ----------------------------------------------------------------------------
# Named figures for the docs
# ----------------------------------------------------------------------------


RATIOS = (("vs_idiomatic", "graph_vs_idiomatic"), ("vs_fair", "graph_vs_fair"), ("vs_kernels", "graph_vs_kernels"),
          ("kernels_vs_idiomatic", "kernels_vs_idiomatic"), ("kernels_vs_fair", "kernels_vs_fair"),
          ("fair_vs_idiomatic", "fair_vs_idiomatic"))


def _named(results: dict) -> list[tuple[str, str, float | None]]:
    """(name, text, value) of every figure: value is a ratio's median or a time in us, for checks."""
    out = []
    cols = results.get("columns") or {}
    for prefix, table in (("", cols.get("best", [])), ("DEFAULTS_", cols.get("defaults", []))):
        for r in table:
            name = f"{prefix}{PREFIX[r['case']]}_{r['n']}_{r['key']}"
            for column in COLUMNS:
                cell = r["cells"].get(column)
                if cell:
                    out.append((f"{name}_{column}", fmt_cell(cell, column in ("kernels", "jaxgraph")), cell["median"]))
            for ratio, label in RATIOS:
                if r["ratios"].get(ratio):
                    out.append((f"{name}_{label}", fmt_ratio(r["ratios"][ratio]), r["ratios"][ratio]["median"]))
    for g in cols.get("gray_scott_per_step", []):
        for key, us in (("xla_extra_us", g["xla_extra_us"]), ("eager_us", g["us"].get("eager")),
                        ("graph_us", g["us"].get("jaxgraph")), ("kernels_us", g["us"].get("kernels"))):
            if us is not None:
                out.append((f"GS_{g['n']}_{key}", f"{us:.2f} us", us))
    return out


def figures(results: dict) -> dict[str, str]:
    """Every figure of the tables under a name the docs' templates use, e.g. ``GS_256_blocked_graph_vs_kernels``
    (``**1.32x** (1.25-1.40)``), ``JACOBI_64_single_kernels`` (``4.84 ms (4.80-4.90) · while · `xla_...```);
    the same at JAX's defaults prefixed ``DEFAULTS_``; ``GS_256_xla_extra_us`` (what XLA's loop adds a step).
    Only what the run measured is named."""
    return {name: text for name, text, _ in _named(results)}


def values(results: dict) -> dict[str, float]:
    """The numbers behind :func:`figures` (a ratio's median, a time in us), to check what a page says."""
    return {name: value for name, _, value in _named(results)}
