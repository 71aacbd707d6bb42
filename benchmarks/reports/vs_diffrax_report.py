"""The report of ``benchmarks/vs_diffrax.py``: diffrax, a ``jnp`` Dopri5, the same kernels via ``jax_call``, jaxgraph.

Pure functions of the JSON the run writes (no GPU, no JAX);
``tests/benchmarks/test_vs_diffrax.py`` checks them on made-up records.
Every figure is ms per solve; a mode's figure at a setting is the median of
its interleaved rounds there, with the range over the rounds.
"""

from __future__ import annotations

from benchmarks.harness import stats

__all__ = ["COLUMNS", "MODES", "TARGETS", "best", "markdown", "ratio", "summarize"]

MODES = {
    "diffrax": "`jax.jit` of `diffrax.diffeqsolve(ODETerm(f), Dopri5(), ..., PIDController(rtol, atol, pcoeff=0.4, "
               "icoeff=0.3))` (`adaptive_ode.diffrax_solver`)",
    "jnp_dopri5": "Dopri5 by hand in `jax.numpy`, the same controller, every attempted step one trip of one "
                  "`lax.while_loop` in `jax.jit` (`adaptive_ode.jnp_solver`)",
    "xla_kernels": "the device loop's own step kernel(s) through `Kernel.jax_call` in a `lax.while_loop` that "
                   "stops on the same flag, in `jax.jit` (`AdaptiveDopri5.xla_solve`): what the kernels buy "
                   "without jaxgraph's graphs",
    "jaxgraph_jit": "jaxgraph's device loop (`graphed_loop(..., until=done)`) as one FFI call in `jax.jit` "
                    "(`AdaptiveDopri5.jax_solve`)",
    "jaxgraph_eager": "the device loop eagerly: numpy in, one launch, numpy out (`AdaptiveDopri5.solve`)",
    "jaxgraph_stages": "as jaxgraph_jit with `path=\"stages\"`: six kernels a step (a kernel a stage)",
}
# The main table's columns, in order: the baselines, then jaxgraph
COLUMNS = ("diffrax", "jnp_dopri5", "xla_kernels", "jaxgraph_jit")
# issue 37 (H100, each side at its best setting): jaxgraph at least this many times faster than ...,
# at these N (None: every N)
TARGETS = [("xla_kernels", 1.3, (40, 2000, 20000)), ("jnp_dopri5", 1.5, None), ("diffrax", 5.0, None)]


def summarize(processes: dict) -> dict:
    """Give each sampled mode's record ``stats`` (median, range over the rounds), in ms per solve."""
    for proc in processes.values():
        for records in proc.get("by_n", {}).values():
            for rec in records.values():
                if rec.get("samples"):
                    rec["stats"] = {k: (v / 1e3 if k in ("median", "min", "max", "q1", "q3") else v)
                                    for k, v in stats.summarize(rec["samples"]).items()}
    return processes


def best(processes: dict, n: str, key: str, settings: tuple | None = None) -> tuple[str, dict] | None:
    """(setting, stats) of mode ``key`` at size ``n`` at its lowest median over ``settings`` (default all)."""
    found = None
    for setting, proc in processes.items():
        if settings is not None and setting not in settings:
            continue
        st = proc.get("by_n", {}).get(n, {}).get(key, {}).get("stats")
        if st and (found is None or st["median"] < found[1]["median"]):
            found = (setting, st)
    return found


def ratio(slow: dict, fast: dict) -> dict:
    """How many times ``fast`` beats ``slow``: the medians' ratio, and the range from the extreme rounds."""
    return {"x": slow["median"] / fast["median"], "min": slow["min"] / fast["max"], "max": slow["max"] / fast["min"]}


def _cell(found: tuple[str, dict] | None, with_setting: bool) -> str:
    if found is None:
        return "-"
    setting, st = found
    text = f"{st['median']:.2f} [{st['min']:.2f}-{st['max']:.2f}]"
    return f"{text} ({setting})" if with_setting else text


def _table(results: dict, settings: tuple | None) -> list[str]:
    procs = results["processes"]
    head = ("| N | diffrax | jnp Dopri5 | same kernels via `jax_call` | jaxgraph | jaxgraph vs diffrax | vs jnp "
            "| vs same kernels |")
    lines = [head, "|---:" + "|---:" * 7 + "|"]
    for n in map(str, results["config"]["sizes"]):
        found = {k: best(procs, n, k, settings) for k in COLUMNS}
        if not any(found.values()):
            continue
        cells = [_cell(found[k], settings is None) for k in COLUMNS]
        mine = found["jaxgraph_jit"]
        for other in ("diffrax", "jnp_dopri5", "xla_kernels"):
            if mine and found[other]:
                r = ratio(found[other][1], mine[1])
                cells.append(f"**{r['x']:.2f}x** [{r['min']:.2f}-{r['max']:.2f}]")
            else:
                cells.append("-")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def targets(results: dict) -> list[str]:
    """Issue 37's targets, each at each N: met or missed on this device, by how much."""
    procs, out = results["processes"], []
    for other, want, sizes in TARGETS:
        for n in results["config"]["sizes"]:
            if sizes is not None and n not in sizes:
                continue
            mine, theirs = best(procs, str(n), "jaxgraph_jit"), best(procs, str(n), other)
            if not (mine and theirs):
                continue
            x = ratio(theirs[1], mine[1])["x"]
            verdict = "met" if x >= want else f"missed by {want / x:.2f}x"
            out.append(f"- N = {n}: jaxgraph vs {other} {x:.2f}x (target >= {want:g}x): {verdict}")
    return out


def markdown(results: dict) -> str:
    """The report: the three columns and diffrax at each one's best setting, then at JAX's defaults, then
    per N every mode at every setting, with the step counts checked."""
    procs, cfg = results["processes"], results["config"]
    lines = [f"# Adaptive Dopri5 on Lorenz-96: diffrax, a `jnp` Dopri5, the same kernels via `jax_call`, jaxgraph "
             f"({results['device']})", "",
             f"`{results['command']}` at {results.get('git')}, {results['date']}; t in [0, {cfg['t_end']}], "
             f"rtol = atol = 1e-5, float64, the same random initial state in every process (seed {cfg.get('seed')}); "
             f"{cfg['repeats']} interleaved rounds per process, one process per XLA setting "
             f"({', '.join(cfg['settings'])}); ms per solve, median [min-max over the rounds]; ratios: the medians', "
             "[range] from the extreme rounds.", ""]
    lines += [f"- `{k}`: {v}" for k, v in MODES.items() if any(k in r for p in procs.values()
                                                                for r in p.get("by_n", {}).values())]
    for name, proc in procs.items():
        if proc.get("failed"):
            lines.append(f"- setting `{name}` failed: {proc['failed']}")
    lines += ["", "## Each at its best of the settings (the setting in brackets)", "", *_table(results, None)]
    if "defaults" in procs:
        lines += ["", "## All at JAX's defaults (no XLA_FLAGS)", "", *_table(results, ("defaults",))]
    met = targets(results)
    if met:
        lines += ["", "## Issue 37's targets (set for the H100), on this device", "", *met]
    for n in map(str, cfg["sizes"]):
        settings = [s for s in procs if n in procs[s].get("by_n", {})]
        if not settings:
            continue
        first = next(iter(procs[settings[0]]["by_n"][n].values()))
        counts = "; ".join(f"{s}: " + ", ".join(f"{k} {v}" for k, v in (r.get("steps") or {}).items())
                           for s in settings for r in [next(iter(procs[s]["by_n"][n].values()))])
        per_step = []  # each solver at its best setting over its own attempted steps (accepted + rejected)
        for key in COLUMNS:
            found = best(procs, n, key)
            steps = (procs[found[0]]["by_n"][n][key].get("steps") or {}).get(key) if found else None
            if found and steps:
                per_step.append(f"{key} {found[1]['median'] * 1e3 / sum(steps):.1f}")
        lines += ["", f"## N = {n}", "", f"jaxgraph's step: {first.get('geometry', '?')}. Steps (accepted, rejected) "
                  f"per solver: {counts}. Checked: {first.get('check', '?')}.", "",
                  *([f"us per attempted step, each at its best setting: {', '.join(per_step)}.", ""]
                    if per_step else []),
                  "| mode | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
        for key in MODES:
            if not any(key in procs[s]["by_n"][n] for s in settings):
                continue
            cells = []
            for s in settings:
                rec = procs[s]["by_n"][n].get(key, {})
                st = rec.get("stats")
                cells.append(f"{st['median']:.3f} [{st['min']:.3f}-{st['max']:.3f}]" if st
                             else str(rec.get("error") or rec.get("skipped") or "-"))
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
