"""Reports generated from results JSON (CPU): the targets file and the micro-benchmarks' tables.

The targets file is generated (``benchmarks/targets.py``), never written by
hand: checked here on synthetic results shaped as ``stats.merge`` writes
them, through ``run.main`` with stand-in workers, and against the committed
JSON (the committed file must be exactly what the committed JSON gives).
"""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks import config, exec_update_cost, report, run, side_effect_cost, stats, targets  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SLUG = "nvidia-h100-80gb-hbm3"


def record(setting, per_kernel, ns=("1", "10", "100")):
    """A worker record: mode -> (N -> us per kernel; ``trivial_jit``: us per call), two rounds alike."""
    modes = {}
    for mode, values in per_kernel.items():
        unit = "us_per_call" if mode == "trivial_jit" else "us_per_kernel"
        modes[mode] = {"unit": unit, "clock": "wall",
                       "by_n": {n: {"samples": [values[n]] * 2, "calls": 10, "per_call": int(n), "check": "ok"}
                                for n in ns if n in values}}
    return {"setting": setting, "xla_flags": config.SETTINGS[setting].xla_flags, "modes": modes, "scalars": {},
            "errors": [], "device": {"name": "NVIDIA H100 80GB HBM3", "ordinal": 0}}


def synthetic_full():
    """Defaults: jit_loop 1.01x raw at N=100, 1.05x at N=1000; off: changing inputs 1.10x at N=10."""
    jax_modes = lambda changing: {
        "raw": {"1": 2.0, "10": 1.0, "100": 1.0, "1000": 1.0},
        "jit_loop": {"1": 40.0, "10": 4.2, "100": 1.01, "1000": 1.05},
        "jit_changing": {"1": 40.0, "10": 4.2 * changing, "100": 1.01, "1000": 1.05},
        "jax_calls": {"1": 41.0, "10": 4.0, "100": 2.0, "1000": 3.0},
        "trivial_jit": {"1": 38.0, "10": 38.0, "100": 38.0, "1000": 38.0}}
    ns = ("1", "10", "100", "1000")
    processes = {"nojax": record("nojax", {"raw": {"1": 2.0}, "replay": {"1": 2.2}, "torch_add": {"1": 3.6}}, ns),
                 "off": record("off", jax_modes(1.10), ns), "on": record("on", jax_modes(1.0), ns),
                 "defaults": record("defaults", jax_modes(1.0), ns)}
    meta = {"schema": 1, "date": "2026-11-23T10:00:00+00:00", "command": "python benchmarks/run.py", "git": "abc1234",
            "quick": False, "config": {"repeats": 2}, "versions": {"jax": "0.11.2"}, "device": {"driver": "580.159.04"}}
    return stats.merge(meta, processes)


def synthetic_loops():
    fori = lambda mine, xla: {"raw": {"1": 1.0}, "jit_fori": {"1": mine}, "xla_fori": {"1": xla}}
    processes = {key: record(key, fori(*values), ("1",))
                 for key, values in {"off": (12.0, 15.0), "on": (4.5, 4.4), "defaults": (13.0, 14.0)}.items()}
    meta = {"schema": 1, "date": "2026-11-23T11:00:00+00:00", "command": "python benchmarks/run.py --loops",
            "git": "def5678", "quick": False, "config": {"repeats": 2, "loops": True}, "versions": {"jax": "0.11.2"},
            "device": {"driver": "580.159.04"}}
    return stats.merge(meta, processes)


def table(text):
    """target -> (measured, verdict) from the markdown table."""
    cells = [line.strip("|").split(" | ") for line in text.splitlines()
             if line.startswith("| ") and " | " in line and not line.startswith("| ---")]
    return {c[0].strip(): (c[1].strip(), c[2].strip()) for c in cells[1:]}


def test_targets_are_judged_on_the_figures_read_from_the_json():
    text = targets.markdown(synthetic_full(), synthetic_loops(), ("full.json", "loops.json"))
    assert text.startswith("# Issue 8's targets on the NVIDIA H100 80GB HBM3: met, missed, and why")
    assert "commit abc1234" in text and "commit def5678" in text and "[`full.json`](full.json)" in text
    rows = table(text)
    assert list(rows) == list(targets.TARGETS)
    assert rows[targets.TARGETS[0]] == ("N=100: 1.01x, N=1000: 1.05x", "met at N=100; missed at N=1000 (1.05x)")
    measured, verdict = rows[targets.TARGETS[1]]
    assert "us per call: N=1 40.00 vs 41.00" in measured and "N=10 4.20 vs 4.00" in measured
    assert verdict == "met at N=1, N=100, N=1000; missed at N=10 (slower)"
    measured, verdict = rows[targets.TARGETS[2]]  # per call: N=1 40 - 38, N=10 42 - 38
    assert measured.startswith("N=1: +2.0 us (off), +2.0 us (on), +2.0 us (defaults); N=10: +4.0 us (off)")
    assert verdict == "met"
    assert rows[targets.TARGETS[3]] == ("1.10x (torch: torch_add 1.80x)", "met")
    measured, verdict = rows[targets.TARGETS[4]]
    assert measured == "off: 1.00-1.10x; on: 1.00-1.00x; defaults: 1.00-1.00x" and verdict == "met at on, defaults; missed at off (over)"
    measured, verdict = rows[targets.TARGETS[5]]
    assert "off: N=1 12.00 vs 15.00" in measured and verdict == "met in 2 of 3; slower at on N=1"


def test_targets_without_a_loop_run_say_not_measured():
    rows = table(targets.markdown(synthetic_full(), None))
    assert rows[targets.TARGETS[5]] == ("not measured", "not measured")
    assert rows[targets.TARGETS[3]][1] == "met"


def test_write_reads_the_json_files_and_names_them(tmp_path):
    assert targets.write(tmp_path, "dev") is None
    (tmp_path / "dev.json").write_text(json.dumps(synthetic_full()))
    path = targets.write(tmp_path, "dev")
    assert path == tmp_path / "dev-targets.md"
    text = path.read_text()
    assert "[`dev.json`](dev.json)" in text and "`dev-loops.json` not found" in text


def test_the_committed_targets_file_is_what_the_committed_json_gives(tmp_path):
    committed = (RESULTS / f"{SLUG}-targets.md").read_text()
    for name in (f"{SLUG}.json", f"{SLUG}-loops.json"):
        (tmp_path / name).write_bytes((RESULTS / name).read_bytes())
    assert targets.write(tmp_path, SLUG).read_text() == committed, "rerun: python benchmarks/targets.py"


def test_a_full_run_regenerates_the_targets_file(tmp_path, monkeypatch):
    full = synthetic_full()
    records = {key: proc for key, proc in full["processes"].items()}
    monkeypatch.setattr(run, "run_worker", lambda setting, cfg, tmp, timeout_s: records[setting.key])
    assert run.main(["--out", str(tmp_path), "--no-plot", "--settings", "nojax,off,on,defaults"]) == 0
    text = (tmp_path / f"{SLUG}-targets.md").read_text()
    assert table(text)[targets.TARGETS[3]] == ("1.10x (torch: torch_add 1.80x)", "met")
    run.main(["--quick", "--out", str(tmp_path / "quick"), "--no-plot", "--settings", "nojax"])
    assert not (tmp_path / "quick" / f"{SLUG}-targets.md").exists()  # a smoke run judges nothing


@pytest.mark.parametrize("module, modes, expected", [
    (exec_update_cost, {"fresh": 1.0, "updated": 1.25, "alternate_2": 1.0, "alternate_4": 1.01},
     "An executable updated in place: +0.250 us per kernel on every launch (1.25x a fresh one)."),
    (side_effect_cost, {"trivial_jit": 38.0, "replay": 40.0, "replay_side_effects": 110.0},
     "`side_effects=True`: +70.0 us per call (2.75x the plain replay)."),
])
def test_micro_benchmark_tables(module, modes, expected):
    results = {"device": "NVIDIA H100 80GB HBM3", "date": "d", "git": "abc", "driver": "580", "command": "c",
               "n": 1000, "repeats": 3, "launches": 20, "calls": 100, "modes": {}}
    for mode, value in modes.items():
        results["modes"][mode] = {"stats": stats.summarize([value, value]), "ratio": value / modes[module.MODES[0]] if module is exec_update_cost else 0,
                                  "ratio_min": value, "ratio_max": value * 1.1}
    text = module.markdown(results)
    assert text.rstrip().endswith(expected), text
    assert all(f"`{mode}`" in text for mode in module.MODES)


def test_the_loop_report_gives_what_a_while_trip_costs():
    # Per step at N=2: unrolled 1.0 us a kernel; K=4 loops 1.5 (K=4), K=8 1.25: a trip adds 2 x 0.5 x 4 = 4 us.
    nojax = record("nojax", {"raw": {"2": 1.0}, "loop_unrolled": {"2": 1.0}, "loop_k2": {"2": 1.5},
                             "loop_k8": {"2": 1.25}}, ("2",))
    nojax["modes"]["loop_k2"]["by_n"]["2"]["unroll"] = 4
    nojax["modes"]["loop_k8"]["by_n"]["2"]["unroll"] = 8
    results = stats.merge({"config": {"loops": True, "repeats": 2}, "device": {}}, {"nojax": nojax})
    text = report.markdown(results)
    assert "### A WHILE trip over the unrolled floor (nojax, us per trip)" in text
    assert "| 2 | 4.000 (K=4) | 4.000 (K=8) |" in text
