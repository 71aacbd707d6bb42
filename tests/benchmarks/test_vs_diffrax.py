"""benchmarks/vs_diffrax.py on the CPU: its arguments, and its report on made-up worker records.

The timings need the GPU (``python benchmarks/vs_diffrax.py``). Here each
mode's best setting, jaxgraph's ratios with their ranges, the table at JAX's
defaults, the target verdicts and the per-N tables are checked on samples
whose answers are known.
"""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import vs_diffrax as bench  # noqa: E402
from benchmarks.reports import vs_diffrax_report as report  # noqa: E402


def rec(samples_us):
    return {"samples": samples_us, "steps": {"diffrax": [280, 9], "jnp_dopri5": [280, 9], "jaxgraph_jit": [280, 9]},
            "geometry": "<AdaptiveDopri5 n=40: one kernel a step (tile_step), one block of 64 threads>",
            "check": "t_end reached by all"}


def processes():
    # diffrax best at "while" (20 ms), jnp best "on" (5), same kernels best "while" (3.2), jaxgraph best "off" (2.0)
    table = {"off": (90, 6, 6.0, 2.0), "on": (45, 5, 5.5, 2.1), "defaults": (70, 7, 6.5, 2.2),
             "while": (20, 5.5, 3.2, 2.3)}
    return {s: {"by_n": {"40": {k: rec([v * 1e3 * 0.95, v * 1e3, v * 1e3 * 1.05]) for k, v in
                                zip(report.COLUMNS, t)}}} for s, t in table.items()}


def results(procs):
    report.summarize(procs)
    return {"processes": procs, "device": "NVIDIA H100 80GB HBM3", "command": "python benchmarks/vs_diffrax.py",
            "git": "abc123", "date": "2026-11-28",
            "config": {"t_end": 10.0, "repeats": 3, "sizes": [40], "seed": 7,
                       "settings": ["off", "on", "defaults", "while"]}}


def test_each_mode_at_its_best_setting_and_the_ratios():
    procs = processes()
    report.summarize(procs)
    assert report.best(procs, "40", "diffrax")[0] == "while"
    assert report.best(procs, "40", "jnp_dopri5")[0] == "on"
    assert report.best(procs, "40", "xla_kernels")[0] == "while"
    assert report.best(procs, "40", "jaxgraph_jit") == ("off", procs["off"]["by_n"]["40"]["jaxgraph_jit"]["stats"])
    assert report.best(procs, "40", "diffrax", ("defaults",))[0] == "defaults"
    sp = bench.speedups(procs, "40")
    assert sp["diffrax"]["x"] == pytest.approx(10.0) and sp["diffrax"]["setting"] == "while"
    assert sp["xla_kernels"]["x"] == pytest.approx(1.6)
    assert sp["xla_kernels"]["min"] == pytest.approx(3.2 * 0.95 / (2.0 * 1.05))  # their fastest round, our slowest
    assert sp["xla_kernels"]["max"] == pytest.approx(3.2 * 1.05 / (2.0 * 0.95))
    assert bench.speedups({"off": {"by_n": {}}}, "40") is None


def test_markdown_tables_targets_and_failures():
    procs = processes()
    procs["on"]["by_n"]["40"]["jnp_dopri5"] = {"error": "RuntimeError: boom"}  # jnp's best is now "while" (5.5)
    procs["broken"] = {"failed": "exit code 1"}
    text = report.markdown(results(procs))
    best_row = next(line for line in text.splitlines() if line.startswith("| 40 | 20.00"))
    assert best_row.startswith("| 40 | 20.00 [19.00-21.00] (while) | 5.50 [5.22-5.78] (while) | "
                               "3.20 [3.04-3.36] (while) | 2.00 [1.90-2.10] (off) | **10.00x**")
    assert "**2.75x**" in best_row and "**1.60x**" in best_row
    defaults = text.split("## All at JAX's defaults")[1].split("##")[0]
    assert "| 40 | 70.00 [66.50-73.50] | 7.00 [6.65-7.35] | 6.50 [6.17-6.83] | 2.20 [2.09-2.31] | " \
           "**31.82x**" in defaults
    assert "- N = 40: jaxgraph vs xla_kernels 1.60x (target >= 1.3x): met" in text
    assert "- N = 40: jaxgraph vs diffrax 10.00x (target >= 5x): met" in text
    assert "setting `broken` failed: exit code 1" in text
    assert "| jnp_dopri5 | 6.000 [5.700-6.300] | RuntimeError: boom | 7.000" in text
    assert "diffrax [280, 9], jnp_dopri5 [280, 9]" in text and "one block of 64 threads" in text
    # xla_kernels records no steps of its own here: left out
    assert (f"us per attempted step, each at its best setting: diffrax {20e3 / 289:.1f}, jnp_dopri5 "
            f"{5.5e3 / 289:.1f}, jaxgraph_jit {2e3 / 289:.1f}.") in text


def test_a_missed_target_says_by_how_much():
    procs = processes()
    for s in procs:
        procs[s]["by_n"]["40"]["jaxgraph_jit"] = rec([2.9e3, 3.0e3, 3.1e3])
    text = report.markdown(results(procs))
    assert "- N = 40: jaxgraph vs xla_kernels 1.07x (target >= 1.3x): missed by 1.22x" in text


def test_arguments():
    args = bench.parse_args([])
    assert args.sizes == [40, 100, 2000, 20000, 65536] and args.settings == bench.SETTINGS == (
        "off", "on", "defaults", "while")
    assert args.modes == ("diffrax", "jnp_dopri5", "xla_kernels", "jaxgraph_jit") and args.t_end == 10.0
    quick = bench.parse_args(["--quick"])
    assert quick.sizes == [40, 2000] and quick.settings == ("defaults", "while") and quick.repeats == 3
    for bad in (["--settings", "fast"], ["--modes", "torch"], ["--sizes", "3"], ["--sizes", "4,x"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_without_a_gpu_nothing_is_measured(capsys):
    import jaxgraph

    if jaxgraph.device_count() > 0:
        pytest.skip("a GPU is here: the benchmark would run")
    assert bench.main(["--quick"]) == 0
    assert "no CUDA device" in capsys.readouterr().out
