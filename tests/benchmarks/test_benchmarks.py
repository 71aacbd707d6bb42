"""The benchmark harness on the CPU: the driver's arguments and worker environment, statistics, the merge.

The GPU measurements themselves run only on a GPU machine (``python
benchmarks/run.py``); here every pure function is checked on synthetic
numbers. The timing machinery is in test_benchmarks_timing.py, markdown and
the plot in test_benchmarks_report.py, scaling in test_benchmarks_scaling.py,
the loop modes in test_benchmarks_loops.py.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks import run  # noqa: E402
from benchmarks.harness import config, stats  # noqa: E402
from benchmarks.harness.workload import check_result  # noqa: E402
from support.benchmark_records import synthetic_results, worker_record  # noqa: E402


# ---------------------------------------------------------------------------
# The driver's command line and worker environment
# ---------------------------------------------------------------------------


def test_driver_defaults_run_every_setting_with_the_full_budget():
    args = run.parse_args([])
    assert args.settings == ("nojax", "off", "on", "defaults") and not args.quick
    assert args.out == ROOT / "benchmarks" / "results"
    cfg = run.build_config(args)
    assert cfg.ns == (1, 10, 100, 1000) and cfg.repeats == 7 and not cfg.quick


def test_driver_quick_and_overrides():
    args = run.parse_args(["--quick", "--ns", "100,1,100", "--repeats", "2", "--settings", "on,nojax",
                           "--out", "/tmp/x"])
    cfg = run.build_config(args)
    assert cfg.quick and cfg.ns == (1, 100) and cfg.repeats == 2
    assert cfg.target_ms == config.QUICK.target_ms and args.timeout_s == 120.0
    assert args.settings == ("on", "nojax") and args.out == Path("/tmp/x")
    assert cfg.capture_policy is None
    whole = run.build_config(run.parse_args(["--quick", "--capture-policy", "whole"]))
    assert whole.capture_policy == "whole" and config.RunConfig.from_json(whole.to_json()) == whole
    with pytest.raises(SystemExit):
        run.parse_args(["--capture-policy", "sometimes"])


def test_driver_runs_a_subset_of_the_modes_and_always_the_floor(tmp_path):
    cfg = run.build_config(run.parse_args(["--quick", "--modes", "jax_calls, jit_loop"]))
    assert cfg.modes == ("jax_calls", "jit_loop")
    assert cfg.runs("jax_calls") and cfg.runs("raw") and not cfg.runs("jit_fori") and not cfg.runs("capture_1000")
    assert config.RunConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    everything = run.build_config(run.parse_args([]))
    assert everything.modes is None and all(everything.runs(m) for m in config.JAX_MODES + config.NOJAX_MODES)


@pytest.mark.parametrize("argv", [["--settings", "on,bogus"], ["--ns", "1,x"], ["--ns", "0,10"],
                                  ["--repeats", "0"], ["--settings", ""], ["--modes", "jit_loop,warp"]])
def test_driver_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        run.parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_worker_environment_sets_the_flags_explicitly():
    inherited = {"XLA_FLAGS": "--xla_something_else", "PATH": "/bin"}
    off = run.worker_env(config.SETTINGS["off"], inherited)
    on = run.worker_env(config.SETTINGS["on"], inherited)
    defaults = run.worker_env(config.SETTINGS["defaults"], inherited)
    assert off["XLA_FLAGS"] == "--xla_gpu_enable_command_buffer="
    assert on["XLA_FLAGS"] == ("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                               "--xla_gpu_graph_min_graph_size=1")
    assert "XLA_FLAGS" not in defaults and defaults["PATH"] == "/bin"
    assert all(env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" for env in (off, on, defaults))
    assert inherited["XLA_FLAGS"] == "--xla_something_else"  # the driver's own environment is untouched


def test_worker_command_round_trips_the_config(tmp_path):
    cfg = run.build_config(run.parse_args(["--quick", "--ns", "1,10"]))
    cmd = run.worker_command("on", tmp_path / "on.json", cfg)
    assert cmd[:3] == [sys.executable, "-m", "benchmarks.harness.worker"]
    assert cmd[cmd.index("--setting") + 1] == "on"
    assert config.RunConfig.from_json(json.loads(cmd[cmd.index("--config") + 1])) == cfg


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def test_quantile_and_summary_match_numpy():
    samples = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    s = stats.summarize(samples)
    assert s["median"] == pytest.approx(np.median(samples))
    assert s["q1"] == pytest.approx(np.percentile(samples, 25)) and s["q3"] == pytest.approx(np.percentile(samples, 75))
    assert (s["min"], s["max"], s["count"]) == (1.0, 9.0, 6)
    assert s["spread"] == pytest.approx(8.0)
    with pytest.raises(ValueError):
        stats.summarize([])


def test_ratios_are_to_the_floor_of_the_same_process_and_round():
    proc = worker_record("on", {"1": 2.0, "100": 1.0}, {"jit_loop": 3.0, "trivial_jit": 40.0})
    proc["modes"]["jit_loop"]["by_n"]["100"]["samples"] = [3.0, 4.0, 2.0]   # floor: 1.0, 1.2, 0.9
    out = stats.summarize_process(proc)
    assert "stats" not in proc["modes"]["raw"]["by_n"]["1"]  # the input is not modified
    raw, loop = out["modes"]["raw"]["by_n"], out["modes"]["jit_loop"]["by_n"]
    assert raw["1"]["ratio"] == pytest.approx(1.0)
    assert loop["1"]["ratio"] == pytest.approx(3.0)  # 6.0 / 2.0 at N=1
    assert loop["100"]["ratio"] == pytest.approx(3.0 / 1.0)  # median over median
    assert loop["100"]["ratio_min"] == pytest.approx(2.0 / 0.9)  # round 3
    assert loop["100"]["ratio_max"] == pytest.approx(4.0 / 1.2)  # round 2
    assert "ratio" not in out["modes"]["trivial_jit"]["by_n"]["1"]  # per call: no per-kernel ratio
    assert stats.paired_ratios([2.0, 3.0], [1.0, 0.0]) == [2.0]


def test_merge_lifts_device_records_failures_and_keeps_processes_apart():
    results = synthetic_results()
    assert results["device"]["name"] == "NVIDIA H100 80GB HBM3" and results["device"]["driver"] == "580.159.04"
    assert results["device"]["slug"] == "nvidia-h100-80gb-hbm3"
    assert results["failures"] == {"off": "exit code 1"}
    assert set(results["processes"]) == {"nojax", "on", "off"}
    on = results["processes"]["on"]["modes"]
    assert on["jit_loop"]["by_n"]["1"]["ratio"] == pytest.approx(20.0)  # on's floor, not nojax's
    assert on["jax_calls"]["by_n"]["100"] == {"skipped": "too slow to compile"}
    assert results["processes"]["nojax"]["scalars"]["capture_1000"]["stats"]["median"] == 15.5
    json.dumps(stats.json_ready(results), allow_nan=False)  # writable as strict JSON


def test_calls_per_sample_and_the_jax_calls_budget():
    assert stats.calls_for_target(0.001, 10, 0.025, 20_000) == 250
    assert stats.calls_for_target(1.0, 1, 0.025, 20_000) == 1
    assert stats.calls_for_target(1e-9, 8, 0.025, 500) == 500
    assert stats.calls_for_target(0.0, 8, 0.025, 500) == 500
    assert stats.jax_calls_skip_reason(100, None, 40.0) is None
    assert stats.jax_calls_skip_reason(1000, (100, 2.0), 40.0) is None  # 20 s estimated
    reason = stats.jax_calls_skip_reason(1000, (100, 5.0), 40.0)
    assert reason and "50 s" in reason and "--jax-calls-budget-s" in reason


def test_device_slug_and_json_ready():
    assert stats.device_slug("NVIDIA H200 (SXM) ") == "nvidia-h200-sxm"
    assert stats.device_slug("") == "unknown-device"
    assert stats.json_ready({"a": [1.0, math.inf], "b": math.nan}) == {"a": [1.0, None], "b": None}


def test_check_result_is_exact():
    x = np.arange(-5, 5, dtype=np.float32)
    assert "matches numpy" in check_result(x + 3, x, 3)
    with pytest.raises(AssertionError, match="expected x \\+ 3"):
        check_result(x + 2, x, 3)
    bad = x + 3
    bad[7] += 0.5
    with pytest.raises(AssertionError, match="1 of 10 elements differ"):
        check_result(bad, x, 3)
