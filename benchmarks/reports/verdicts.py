"""Reading figures out of results JSON and turning them into verdicts: what the targets files share.

``targets.py`` (issue 8) and ``targets_over_runs.py`` (issue 19) judge targets on the
JSON that ``run.py`` (``stats.merge``), ``gray_scott_bench.py`` and
``large_graphs.py`` write. The readers here return ``None`` where the JSON lacks a
figure, so a target says *not measured* instead of failing; :func:`verdict`
turns ``{where: met?}`` into the words of the targets table, :func:`over_runs`
the same over a group of runs (``run.py --runs K``).
"""

from __future__ import annotations

__all__ = ["entry", "fmt", "median", "ns", "over_runs", "per_call", "ratio", "runs_words", "source_line",
           "steady_ratio", "verdict"]


def entry(results: dict, key: str, mode: str, n: str) -> dict:
    """The ``by_n`` record of ``mode`` at ``n`` in process ``key`` of a harness run (``{}`` when absent)."""
    return results.get("processes", {}).get(key, {}).get("modes", {}).get(mode, {}).get("by_n", {}).get(n, {})


def median(results: dict, key: str, mode: str, n: str) -> float | None:
    """The median sample (the mode's unit: us per kernel, or per call) or ``None``."""
    record = entry(results, key, mode, n)
    return record["stats"]["median"] if "stats" in record else None


def ratio(results: dict, key: str, mode: str, n: str) -> float | None:
    """Median over the raw ``cuGraphLaunch`` floor's median in the same process, or ``None``."""
    record = entry(results, key, mode, n)
    return record.get("ratio") if "stats" in record else None


def steady_ratio(results: dict, key: str, mode: str, n: str) -> float | None:
    """The streaming calls' median (``harness.Mode.steady``) over the floor's median, or ``None``."""
    return entry(results, key, mode, n).get("steady_ratio")


def per_call(results: dict, key: str, mode: str, n: str) -> float | None:
    """us per jitted call: chain modes are recorded per kernel (N a call), ``trivial_jit`` per call."""
    value = median(results, key, mode, n)
    unit = results.get("processes", {}).get(key, {}).get("modes", {}).get(mode, {}).get("unit")
    return None if value is None else value if unit == "us_per_call" else value * int(n)


def ns(results: dict, key: str) -> list[str]:
    """The chain lengths any mode of process ``key`` recorded, ascending (as the JSON's string keys)."""
    modes = results.get("processes", {}).get(key, {}).get("modes", {}).values()
    return sorted({n for m in modes for n in m.get("by_n", {})}, key=int)


def verdict(ok: dict, how: dict, label: str = "N=") -> str:
    """``met``, ``missed``, or ``met at ...; missed at ...`` from ``{where: met?}`` (``how[where]``: by how much)."""
    if not ok:
        return "not measured"
    met = [w for w, good in ok.items() if good]
    missed = [w for w, good in ok.items() if not good]
    if not missed:
        return "met"
    if not met:
        return "missed"
    return (f"met at {', '.join(label + w for w in met)}; missed at "
            + ", ".join(f"{label}{w} ({how[w]})" for w in missed))


def source_line(label: str, name: str, results: dict | None) -> str:
    """One bullet naming a results file: its command, date, commit, and the driver and jax version if recorded."""
    if results is None:
        return f"- {label}: `{name}` not found: its targets say *not measured*"
    device = results.get("device") if isinstance(results.get("device"), dict) else {}
    versions = results.get("versions") or {}
    known = [f"driver {device['driver']}"] if device.get("driver") else []  # not every run records them
    known += [f"jax {versions['jax']}"] if versions.get("jax") else []
    return ", ".join([f"- {label}: [`{name}`]({name}), `{results.get('command', '?')}`", str(results.get("date", "?")),
                      f"commit {results.get('git') or '?'}", *known])


def over_runs(figures: list) -> tuple[str, str]:
    """``(measured, verdict)`` of one target over a group of runs: each place's figure in every run side by
    side, and ``met in 3 of 3 runs`` or the places missed (and not measured) grouped by the runs concerned.

    ``figures`` holds one ``targets_over_runs.Figures`` a run (``None`` where the run is missing): ``ok`` maps
    each place judged to whether it met the target, ``how`` to its figure, ``label`` names the figures.
    A run lacking a place another run judged is never called met.
    """
    places = list(dict.fromkeys(w for f in figures if f for w in f.how))
    if not places:
        return f"not measured in any of the {len(figures)} runs", "not measured"
    label = next(f.label for f in figures if f)
    measured = f"{label}, {runs_words(range(1, len(figures) + 1))}: " + "; ".join(
        f"{w} " + ", ".join(f.how.get(w, "–") if f else "–" for f in figures) for w in places)
    unmeasured = [i for i, f in enumerate(figures, 1) if f is None or not f.ok]
    missed: dict[tuple[int, ...], list[str]] = {}  # the runs that missed a place -> those places, with figures
    gaps: dict[tuple[int, ...], list[str]] = {}  # the runs that lack a place the others judged -> those places
    for w in places:
        runs = tuple(i for i, f in enumerate(figures, 1) if f and f.ok.get(w) is False)
        if runs:
            missed.setdefault(runs, []).append(f"{w} ({', '.join(figures[i - 1].how[w] for i in runs)})")
        lacking = tuple(i for i, f in enumerate(figures, 1) if i not in unmeasured and w not in f.ok)
        if lacking:
            gaps.setdefault(lacking, []).append(w)
    short = {i for runs in (*missed, *gaps) for i in runs}
    met = [i for i in range(1, len(figures) + 1) if i not in unmeasured and i not in short]
    if not missed and not gaps and not unmeasured:
        return measured, f"met in {len(met)} of {len(figures)} runs"
    parts = [f"missed in {runs_words(runs)} at {', '.join(ws)}" for runs, ws in missed.items()]
    parts += [f"met in {runs_words(met)}"] if met else []
    parts += [f"not measured in {runs_words(runs)} at {', '.join(ws)}" for runs, ws in gaps.items()]
    parts += [f"not measured in {runs_words(unmeasured)}"] if unmeasured else []
    return measured, "; ".join(parts)


def runs_words(indices) -> str:
    """Runs by number, in words: ``run 2``, ``runs 1 and 3``, ``runs 1, 2 and 3``."""
    items = [str(i) for i in indices]
    if len(items) == 1:
        return f"run {items[0]}"
    return "runs " + ", ".join(items[:-1]) + " and " + items[-1]


def fmt(value: float) -> str:
    """Two decimals under 100, one above: the precision the medians carry."""
    return f"{value:.2f}" if value < 100 else f"{value:.1f}"
