"""Reading figures out of results JSON and turning them into verdicts: what the targets files share.

``targets.py`` (issue 8) and ``targets19.py`` (issue 19) judge targets on the
JSON that ``run.py`` (``stats.merge``), ``gray_scott_bench.py`` and
``scale.py`` write. The readers here return ``None`` where the JSON lacks a
figure, so a target says *not measured* instead of failing; :func:`verdict`
turns ``{where: met?}`` into the words of the targets table.
"""

from __future__ import annotations

__all__ = ["entry", "fmt", "median", "ns", "per_call", "ratio", "runs_words", "source_line", "verdict"]


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


def runs_words(indices) -> str:
    """Runs by number, in words: ``run 2``, ``runs 1 and 3``, ``runs 1, 2 and 3``."""
    items = [str(i) for i in indices]
    if len(items) == 1:
        return f"run {items[0]}"
    return "runs " + ", ".join(items[:-1]) + " and " + items[-1]


def fmt(value: float) -> str:
    """Two decimals under 100, one above: the precision the medians carry."""
    return f"{value:.2f}" if value < 100 else f"{value:.1f}"
