"""The text report of a :class:`~jaxgraph.compare.Result`: one table per function, then the legend.

A row per setting: the median time per call, the range over the rounds, the
ratio to the best setting's median, how many command buffers XLA made, and
whether the results agree with the reference setting's. A setting that failed
shows the error's type and message in its row.
"""

from __future__ import annotations

# ``Result`` (report.py) is named in annotations only: report.py imports this module, not the other way.

__all__ = ["fmt_seconds", "render"]

ERROR_WIDTH = 90


def fmt_seconds(seconds: float, unit: str | None = None) -> str:
    """``seconds`` in ``unit`` (``"s"``, ``"ms"``, ``"us"``; picked from the value when None), 3 significant digits."""
    unit = unit or _unit(seconds)
    value = seconds * {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    return (f"{value:#.3g}".rstrip(".") if value < 1000 else f"{value:.0f}") + f" {unit}"


def render(res: "Result", verbose: bool = False) -> str:
    where = res.backend or "an unknown backend (no worker got past its factory)"
    if res.devices:
        where += f" ({', '.join(res.devices[:2])}{', ...' if len(res.devices) > 2 else ''})"
    lines = [f"jaxgraph.compare {res.factory}",
             f"on {where}" + (f", jax {res.jax_version}" if res.jax_version else "")
             + f"; {res.rounds} interleaved round{'s' if res.rounds != 1 else ''}, each setting in its own process",
             "time per call: median and range (fastest - slowest) of the rounds' samples; a sample is that many "
             "back-to-back calls, then block_until_ready; compilation and warm-up calls excluded"]
    if res.backend == "cpu":
        lines.append("backend cpu: XLA accepts the --xla_gpu_* flags and ignores them, so on the CPU the settings "
                     "run the same program; command buffers exist only on a GPU")
    whole = [f for f in res.failures if f.label is None]
    for label in res.labels:
        lines += ["", _block(res, label)]
    if not res.labels:
        lines += ["", "no function ran: every setting failed before its factory returned (see below)"]
    lines += ["", "settings (one process each):"]
    width = max(len(s.name) for s in res.settings) if res.settings else 0
    dumped = False
    for s in res.settings:
        flags = res.xla_flags.get(s.name, s.xla_flags)
        if flags and "--xla_dump_to=" in flags:  # the tool's own addition: only a dump
            dumped = True
            flags = " ".join(f for f in flags.split() if not f.startswith("--xla_dump_to=")) or None
        lines.append(f"  {s.name.ljust(width)}  {s.label}: XLA_FLAGS="
                     + (repr(flags) if flags is not None else "unset"))
    if res.replaced_xla_flags:
        lines.append(f"  your environment's XLA_FLAGS={res.replaced_xla_flags!r} were left out of every process "
                     "(add flags to all with --xla-flags)")
    if dumped:
        lines.append("  each process also had --xla_dump_to=<a temporary folder>: the command buffers are counted in "
                     "the optimized HLO XLA dumps there")
    lines += ["", *_agreement_lines(res), *_function_lines(res)]
    problems = [f for f in res.failures if f not in whole] + whole
    if problems:
        lines += ["", "failures:"]
        for f in problems:
            lines.append(f"  {f.setting}" + (f" / {f.label}" if f.label else "") + f" ({f.stage}): {f.summary()}")
            if verbose and f.traceback:
                lines += ["    " + t for t in f.traceback.rstrip().splitlines()]
        if not verbose:
            lines.append("  (--verbose, or Result.table(verbose=True), shows each traceback)")
    return "\n".join(lines)


def _block(res: "Result", label: str) -> str:
    timings = res.timings.get(label, {})
    unit = _unit(min(t.median for t in timings.values())) if timings else "ms"
    calls = res.calls_per_sample.get(label)
    title = f"{label}" + (f"  ({calls} call{'s' if calls != 1 else ''} a sample)" if calls else "")
    header = ["setting", f"median ({unit})", "range", "vs best", "command buffers", "results"]
    rows = []
    for s in res.settings:
        t = timings.get(s.name)
        failure = res.failure(s.name, label)
        if t is None:
            why = failure.summary(ERROR_WIDTH) + f" ({failure.stage})" if failure else "not timed"
            rows.append([s.name, "failed" if failure else "–", why, "–", "–", "–"])
            continue
        spread = f"{fmt_seconds(t.low, unit).split()[0]} - {fmt_seconds(t.high, unit).split()[0]}"
        extra = f"; then {failure.summary(60)} ({failure.stage})" if failure else ""
        rows.append([s.name, fmt_seconds(t.median, unit).split()[0], spread + extra, f"{t.ratio:.2f}x",
                     _command_buffers(res, label, s.name), _agrees(res, label, s.name)])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = [title, _row(header, widths), _row(["-" * w for w in widths], widths)]
    out += [_row(r, widths) for r in rows]
    return "\n".join(out)


def _command_buffers(res: "Result", label: str, setting: str) -> str:
    if res.backend == "cpu":
        return "n/a (no GPU)"
    n = res.command_buffers.get(label, {}).get(setting)
    return "?" if n is None else str(n)


def _agrees(res: "Result", label: str, setting: str) -> str:
    if res.reference.get(label) == setting:
        return "reference"
    if setting in res.mismatches.get(label, {}):
        return f"DIFFER ({res.mismatches[label][setting].output})"
    return "agree"


def _agreement_lines(res: "Result") -> list[str]:
    tol = f"rtol={res.rtol:g}, atol={res.atol:g} (np.allclose; integers and bools exactly)"
    differ = [(lb, s, m) for lb, by in res.mismatches.items() for s, m in by.items()]
    if not differ:
        if not any(len(c) > 1 for c in res.compared.values()):
            return ["results: fewer than two settings produced a result, so nothing was compared"]
        lines = [f"results agree: every setting's outputs match the reference setting's within {tol}"]
        lines += [f"  {lb}: only {c[0]} produced a result, nothing to compare it with"
                  for lb, c in res.compared.items() if len(c) == 1]
        return lines
    lines = [f"results DIFFER (beyond {tol}):"]
    for label, setting, m in differ:
        lines.append(f"  {label}: {setting} vs {res.reference[label]}: {m}")
    return lines


def _function_lines(res: "Result") -> list[str]:
    if not res.compare_functions or len(res.labels) < 2:
        return []
    first, where = res.labels[0], res.function_reference
    if where is None:
        return [f"functions: not compared ({first} produced no result)"]
    if not res.function_mismatches:
        others = ", ".join(res.labels[1:])
        return [f"functions agree: {others} match {first} (under {where}) within the same tolerance"]
    return [f"functions DIFFER from {first} (under {where}):"] + [
        f"  {label}: {m}" for label, m in res.function_mismatches.items()]


def _row(cells: list[str], widths: list[int]) -> str:
    return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"


def _unit(seconds: float) -> str:
    return "us" if seconds < 1e-3 else "ms" if seconds < 1.0 else "s"
