"""The PNG plot of a results JSON: us per kernel vs N, log-log, one line per mode and setting.

    python benchmarks/reports/plot.py benchmarks/results/<device>.json [--out plot.png]

Colour says the mode, line style and marker the process (XLA flag setting);
the raw ``cuGraphLaunch`` floors are thick black lines. Error bars span the
min-max of the samples. Needs only matplotlib and the JSON, so the PNG can be
rendered on any machine (``run.py`` calls :func:`render` when matplotlib is there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.config import FLOOR, JAX_MODES, NOJAX_MODES, SETTINGS  # noqa: E402

STYLES = {"nojax": ("-", "o"), "off": (":", "v"), "on": ("-.", "^"), "defaults": ("--", "s")}


def series(results: dict) -> list[dict]:
    """The lines to draw: setting, mode, Ns, medians and min/max of each per-kernel mode with data."""
    out = []
    for key, proc in results.get("processes", {}).items():
        for mode in (NOJAX_MODES if key == "nojax" else JAX_MODES):
            record = proc.get("modes", {}).get(mode, {})
            if record.get("unit", "us_per_kernel") != "us_per_kernel":
                continue  # trivial_jit is per call, not per kernel
            points = sorted((int(n), e["stats"]) for n, e in record.get("by_n", {}).items() if "stats" in e)
            if points:
                out.append({"setting": key, "mode": mode, "n": [n for n, _ in points],
                            "median": [s["median"] for _, s in points], "min": [s["min"] for _, s in points],
                            "max": [s["max"] for _, s in points]})
    return out


def render(results: dict, path: str | Path) -> Path:
    """Draw :func:`series` into ``path`` (PNG); raises ``ImportError`` without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on the GPU machine
    import matplotlib.pyplot as plt

    lines = series(results)
    modes = [m for m in dict.fromkeys(NOJAX_MODES + JAX_MODES) if m != FLOOR]
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(modes)}
    fig, ax = plt.subplots(figsize=(11, 6.5))
    for line in lines:
        style, marker = STYLES.get(line["setting"], ("-", "x"))
        floor = line["mode"] == FLOOR
        yerr = [[m - lo for m, lo in zip(line["median"], line["min"])],
                [hi - m for m, hi in zip(line["median"], line["max"])]]
        ax.errorbar(line["n"], line["median"], yerr=yerr, linestyle=style, marker=marker,
                    color="black" if floor else colours[line["mode"]], linewidth=3.0 if floor else 1.4,
                    markersize=5, capsize=2, alpha=0.9, zorder=3 if floor else 2,
                    label=f"{line['mode']} [{line['setting']}]" + (" (floor)" if floor else ""))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N (kernels in the chain)")
    ax.set_ylabel("us per kernel (median; bars: min-max)")
    device = results.get("device", {}).get("name", "unknown device")
    ax.set_title(f"jaxgraph: chain of N add_one kernels, {device}, {results.get('date', '')[:10]}")
    ax.grid(True, which="both", alpha=0.3)
    if lines:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
                  title="mode [process]: " + ", ".join(f"{k} {s[0]}" for k, s in STYLES.items() if k in SETTINGS),
                  title_fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render the benchmark PNG from its results JSON.")
    parser.add_argument("json", type=Path, help="benchmarks/results/<device>.json")
    parser.add_argument("--out", type=Path, help="PNG path (default: next to the JSON)")
    args = parser.parse_args(argv)
    results = json.loads(args.json.read_text())
    path = render(results, args.out or args.json.with_suffix(".png"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
