"""The scale harness (benchmarks/large_graphs.py) on the CPU: its arguments, its report, and a point without a GPU.

The measurements themselves need the GPU (``python benchmarks/run.py --scale``).
"""

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks import large_graphs, run  # noqa: E402

HAS_GPU = __import__("jaxgraph").device_count() > 0


def test_points_parse_and_reject_bad_ones():
    assert large_graphs.parse_points("10000:in_place, 100000:one_site") == ((10000, "in_place"), (100000, "one_site"))
    for bad in ("10000", "1:in_place", "10k:in_place", "100:ping_pong", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            large_graphs.parse_points(bad)


def test_run_scale_is_its_own_run():
    assert run.parse_args(["--scale"]).scale
    with pytest.raises(SystemExit):
        run.parse_args(["--scale", "--quick"])


def point(n, pattern, eager, feedback, rotating):
    """A point record as a child process writes it: modes taking ``eager * factor`` us per kernel."""
    def mode(factor, per_call=None):
        samples = [eager * factor * (1 + 0.01 * r) for r in range(3)]
        record = {"samples": samples, "stats": {"median": samples[1]}, "ratio": [factor] * 3}
        return {**record, "per_call": per_call} if per_call else record

    base = {"host_rss_mb": 500.0, "device_used_mb": 1000.0}
    grown = {k: {"host_rss_mb": 500.0 + g, "device_used_mb": 1000.0 + g / 4}
             for k, g in (("capture", 100.0), ("registration", 200.0), ("first_call", 300.0))}
    return {"n": n, "pattern": pattern, "phases_s": {"capture": 0.2, "registration": 0.1, "first_call": 0.5},
            "memory": {"base": base, **grown},
            "modes": {"eager": mode(1.0),
                      "jit_feedback": mode(feedback, {"instantiate": 0.0, "rebind": 0.0, "copy": 2.0,
                                                       "handler_us": 7.5, "launch_us": 5.0}),
                      "jit_rotating": mode(rotating, {"instantiate": 0.25, "rebind": 3.0, "copy": 2.0,
                                                       "handler_us": 40.0, "launch_us": 30.0})},
            "bindings": ["input 0 copied (cheaper)", "output 0 copied (cheaper)"], "graph": {"kernel_nodes": n}}


def test_markdown_reports_ratios_counters_and_memory():
    results = {"date": "2026-11-23", "device": {"name": "Test GPU"}, "git": "abc", "xla_flags": large_graphs.XLA_FLAGS,
               "config": {"repeats": 3, "elements": 1024},
               "points": [point(10000, "in_place", 1.0, 1.03, 1.5),
                          {"n": 100000, "pattern": "one_site", "error": "timed out after 180 s"}]}
    text = large_graphs.markdown(results)
    row = next(line for line in text.splitlines() if line.startswith("| 10000 | in_place | 1.010"))
    assert "1.030x" in row and "1.500x" in row and "7.500, 40.00" in row and "0.000, 0.250" in row
    assert "| 5.000, 30.00 |" in row  # the part inside cudaGraphLaunch
    memory = next(line for line in text.splitlines() if line.startswith("| 10000 | in_place | 0.200"))
    # growth over the baseline per phase; device KB per kernel from the first call's growth (75 MB / 10k)
    assert "100.0, 200.0, 300.0" in memory and "25.00, 50.00, 75.00" in memory and "| 7.680 |" in memory
    assert "| 100000 | one_site | failed: timed out after 180 s" in text
    assert "| 10000 | in_place | 32 |" not in text  # no burst recorded, no burst row
    for key, first, steady in (("jit_feedback", 30.0, 9.0), ("jit_rotating", 35.0, 11.0)):
        results["points"][0]["modes"][key]["burst"] = {
            "calls": 32, "first": {"handler_us": first}, "steady": {"handler_us": steady, "launch_us": 5.0,
                                                                    "prepare_us": 2.0}}
    row = next(line for line in large_graphs.markdown(results).splitlines() if line.startswith("| 10000 | in_place | 32 |"))
    assert row == "| 10000 | in_place | 32 | 30.00, 35.00 | 9.000, 11.00 | 5.000, 5.000 | 2.000, 2.000 |"


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU failure path")
def test_a_point_without_a_gpu_records_its_failure(tmp_path):
    code = large_graphs.main(["--points", "4:one_site", "--repeats", "1", "--out", str(tmp_path)])
    assert code == 1
    written = list(tmp_path.glob("*-scale.json"))
    assert len(written) == 1
    text = written[0].read_text()
    assert '"error"' in text and ("CUDA" in text or "GPU" in text)
