"""A PNG of a comparison: per function, each setting's median time per call with its range.

matplotlib is optional: :func:`matplotlib_missing` says so in one line, and the
command line prints that line instead of a plot.
"""

from __future__ import annotations

import importlib.util

# ``Result`` (report.py) is named in annotations only: report.py imports this module, not the other way.

__all__ = ["matplotlib_missing", "write_png"]


def matplotlib_missing() -> str | None:
    """``None`` when matplotlib can be imported, else the one-line reason no plot is written."""
    if importlib.util.find_spec("matplotlib") is None:
        return "no plot written: matplotlib is not installed (pip install matplotlib)"
    return None


def write_png(res: "Result", path: str) -> None:
    """One panel per function: a bar per setting (its median), the whisker its range, failures marked.

    Raises
    ------
    ModuleNotFoundError
        matplotlib is not installed (the message says how to install it).
    """
    missing = matplotlib_missing()
    if missing:
        raise ModuleNotFoundError(missing)
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    labels = list(res.labels) or ["(nothing ran)"]
    fig, axes = plt.subplots(1, len(labels), figsize=(max(4.5, 3.2 * len(labels)), 3.6), squeeze=False)
    names = [s.name for s in res.settings]
    for ax, label in zip(axes[0], labels):
        timings = res.timings.get(label, {})
        unit, scale = _unit(min((t.median for t in timings.values()), default=1.0))
        for i, name in enumerate(names):
            t = timings.get(name)
            if t is None:
                ax.text(i, 0, "failed" if res.failure(name, label) else "–", ha="center", va="bottom",
                        rotation=90, color="firebrick")
                continue
            ax.bar(i, t.median * scale, color="tab:blue" if t.ratio > 1.0 else "tab:green")
            ax.errorbar(i, t.median * scale, yerr=[[(t.median - t.low) * scale], [(t.high - t.median) * scale]],
                        color="black", capsize=4)
        ax.set_xticks(range(len(names)), names)
        ax.set_title(label, fontsize=10)
        ax.set_ylabel(f"{unit} per call (median, range)")
    where = res.backend or "?"
    fig.suptitle(f"{res.factory.rsplit('/', 1)[-1]} on {where}: {res.rounds} interleaved rounds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _unit(seconds: float) -> tuple[str, float]:
    return ("us", 1e6) if seconds < 1e-3 else ("ms", 1e3) if seconds < 1.0 else ("s", 1.0)
