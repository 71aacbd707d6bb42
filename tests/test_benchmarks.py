"""The benchmark harness on the CPU: driver arguments, statistics, the merge, markdown, the plot.

The GPU measurements themselves run only on a GPU machine (``python
benchmarks/run.py``); here every pure function is checked on synthetic
numbers, the jit modes run on the CPU with a pure-JAX stand-in for the
replayable, and a worker without a GPU must say so in its JSON.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks import config, harness, report, run, stats  # noqa: E402
from benchmarks.workload import check_result  # noqa: E402

HAS_GPU = __import__("jaxgraph").device_count() > 0


# ---------------------------------------------------------------------------
# Synthetic records, shaped as the workers write them
# ---------------------------------------------------------------------------


def worker_record(setting, floor, factors, ns=("1", "100"), skipped=()):
    """A worker record whose mode ``m`` takes ``floor * factors[m]`` us per kernel in every round."""
    modes = {}
    for mode, factor in {"raw": 1.0, **factors}.items():
        unit = "us_per_call" if mode == "trivial_jit" else "us_per_kernel"
        by_n = {}
        for n in ns:
            if (mode, n) in skipped:
                by_n[n] = {"skipped": "too slow to compile"}
                continue
            base = floor[n] if isinstance(floor, dict) else floor
            by_n[n] = {"samples": [base * factor * d for d in (1.0, 1.2, 0.9)], "calls": 10, "per_call": int(n),
                       "check": "ok"}
        modes[mode] = {"unit": unit, "clock": "wall", "by_n": by_n}
    return {"setting": setting, "xla_flags": config.SETTINGS[setting].xla_flags, "modes": modes,
            "scalars": {}, "errors": [], "device": {"name": "NVIDIA H100 80GB HBM3", "ordinal": 0}}


def synthetic_results():
    nojax = worker_record("nojax", 1.0, {"replay": 1.0, "torch_cupy": 1.2, "torch_add": 1.15})
    nojax["scalars"] = {"capture_1000": {"unit": "ms", "clock": "wall", "samples": [15.0, 16.0, 15.5]},
                        "eager.torch_add": {"skipped": "torch is not installed"}}
    on = worker_record("on", {"1": 2.0, "100": 1.0},
                       {"jit_loop": 20.0, "jit_changing": 25.0, "jax_calls": 19.0, "trivial_jit": 38.0},
                       skipped={("jax_calls", "100")})
    processes = {"nojax": nojax, "on": on, "off": {"setting": "off", "failed": "exit code 1"}}
    meta = {"schema": 1, "date": "2026-11-23T10:00:00+00:00", "quick": False,
            "config": {"repeats": 3}, "versions": {"jax": "0.11.2", "torch": "2.11.0"},
            "device": {"driver": "580.159.04"}}
    return stats.merge(meta, processes)


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
    assert cmd[:3] == [sys.executable, "-m", "benchmarks.worker"]
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


# ---------------------------------------------------------------------------
# Timing machinery with fake modes
# ---------------------------------------------------------------------------


def fake_mode(key, seconds_per_call, log=None, fail_on=None):
    calls_seen = []

    def run_calls(calls):
        calls_seen.append(calls)
        if log is not None:
            log.append(key)
        if fail_on is not None and len(calls_seen) >= fail_on:
            raise RuntimeError("device fell over")
        return calls * seconds_per_call

    mode = harness.Mode(key, run_calls, per_call=10)
    mode.calls_seen = calls_seen
    return mode


def test_sampling_is_round_robin_and_a_failing_mode_drops_out():
    order = []
    modes = [fake_mode("a", 1e-3, order), fake_mode("b", 2e-3, order, fail_on=2), fake_mode("c", 1e-3, order)]
    rounds = []
    samples, errors = harness.sample_interleaved(modes, 3, rounds.append)
    assert order == ["a", "b", "c", "a", "b", "c", "a", "c"]
    assert rounds == [0, 1, 2]
    assert samples["a"] == pytest.approx([100.0] * 3)  # 1 ms per call / 10 kernels = 100 us per kernel
    assert samples["b"] == pytest.approx([200.0]) and "device fell over" in errors["b"]
    assert "a" not in errors


def test_calibration_aims_at_the_target_and_caps_calls():
    mode = fake_mode("a", 1e-4)
    assert harness.calibrate(mode, 0.025, 20_000) == 250 and mode.calls == 250
    assert mode.calls_seen == [1, 8, 64]  # grows until a run lasts a quarter of the target
    slow = fake_mode("b", 1.0)
    assert harness.calibrate(slow, 0.025, 20_000) == 1
    capped = fake_mode("c", 1e-9)
    assert harness.calibrate(capped, 0.025, 100) == 100


def test_prepare_records_skips_and_errors_without_raising():
    def skipping():
        raise harness.Skip("cupy is not installed")

    def broken():
        raise ValueError("bad launch")

    assert harness.prepare(skipping, 0.01, 10) == (None, {"skipped": "cupy is not installed"})
    mode, record = harness.prepare(broken, 0.01, 10)
    assert mode is None and record == {"error": "setup: ValueError: bad launch"}
    mode, record = harness.prepare(lambda: fake_mode("ok", 1e-3), 0.01, 1000)
    assert mode.key == "ok" and record["calls"] == mode.calls and record["per_call"] == 10


class FakeCounters:
    """Counters that grow by ``per_call[k]`` each call while ``settle_after`` calls have not yet been made
    (then by ``later[k]``): a handler that re-records XLA's graph for a while, then stops."""

    def __init__(self, per_call, later, settle_after):
        self.values = dict.fromkeys(per_call, 0)
        self.per_call, self.later, self.settle_after, self.calls = per_call, later, settle_after, 0

    def __call__(self):
        return dict(self.values)

    def mode(self, key, seconds_per_call):
        def run_calls(calls):
            for _ in range(calls):
                rates = self.per_call if self.calls < self.settle_after else self.later
                for k, v in rates.items():
                    self.values[k] += v
                self.calls += 1
            return calls * seconds_per_call

        return harness.Mode(key, run_calls, per_call=10)


def test_counters_per_call_and_settling():
    counters = FakeCounters({"handler_calls": 3, "splice_nodes": 3, "handler_ns": 9000},
                            {"handler_calls": 3, "splice_nodes": 0, "handler_ns": 2000}, settle_after=50)
    mode = counters.mode("mixed", 1e-4)
    mode.counters = counters
    mode.calls = 40
    # 40 calls a run: run 2 re-records on 10 of its calls, runs 3 and 4 on none;
    # then calls per sample from the last run (40 calls of 0.1 ms) for a 10 ms target
    assert harness.settle(mode, 0.01, 1000) == {"settle_runs": 4, "settled": True}
    assert mode.calls == 100
    mode.calls = 40
    mode.sample()
    assert mode.counter_samples == [{"handler_calls": 3.0, "splice_nodes": 0.0, "handler_ns": 2000.0}]
    rebinds, runs = [0], [0]

    def more_each_run(calls):  # 1, then 4, then 9 rebinds per call: never settles
        runs[0] += 1
        rebinds[0] += calls * runs[0] ** 2
        return 1e-3

    growing = harness.Mode("x", more_each_run, calls=40, counters=lambda: {"rebind": rebinds[0]})
    assert harness.settle(growing, 0.01, 1000, rounds=3) == {"settle_runs": 3, "settled": False}
    plain = fake_mode("no_counters", 1e-3)
    assert harness.settle(plain, 0.025, 1000) == {} and plain.calls_seen == [1] and plain.calls == 25
    # an event every other call, over an odd number of calls, still reads as settled
    assert harness._same_events({"rebind": 100 * 2 / 5}, {"rebind": 100 * 3 / 5}, 5)
    assert not harness._same_events({"rebind": 0.0}, {"rebind": 100.0}, 5)
    assert harness._same_events({"copy": 1.0, "launch_ns": 10.0}, {"copy": 1.0, "launch_ns": 99.0}, 5)  # times
    assert harness.counter_deltas({"a": 1, "b": 5}, {"a": 7, "b": 5}, 3) == {"a": 2.0, "b": 0.0}


def test_measure_group_records_median_counters_per_call():
    counters = FakeCounters({"handler_calls": 1, "launch": 1, "handler_ns": 5000}, {}, settle_after=10 ** 9)
    factories = [("jit_loop", lambda: counters.mode("jit_loop", 1e-4))]
    records = harness.measure_group("[t] N=1", factories, 3, 0.002, 1000, lambda line: None, counters)
    record = records["jit_loop"]
    assert record["counters"] == {"handler_calls": 1.0, "launch": 1.0, "handler_ns": 5000.0}
    assert record["settled"] and record["settle_runs"] == 2 and len(record["samples"]) == 3
    assert record["warm_up_calls"] == harness.WARM_UP_CALLS  # 64 calls of 0.1 ms: within WARM_UP_S


def test_warm_up_makes_the_first_calls_before_calibration_within_a_bound():
    fast = fake_mode("fast", 1e-4)
    assert harness.warm_up(fast) == {"warm_up_calls": 64, "warm_up_us": [100.0] * 7}
    assert fast.calls_seen == [1, 2, 4, 8, 16, 32, 1]
    slow = fake_mode("slow", 0.1)  # 0.1 s per call: stops once 0.25 s have gone
    assert harness.warm_up(slow)["warm_up_calls"] == 3 and slow.calls_seen == [1, 2]
    # A mode whose first calls are slow (XLA recording) is calibrated on its steady calls.
    first = iter([0.05] + [1e-4] * 1000)
    recording = harness.Mode("jit_loop", lambda calls: sum(next(first) for _ in range(calls)), per_call=100)
    harness.warm_up(recording)
    assert harness.calibrate(recording, 0.025, 20_000) == 250


def test_measure_group_returns_samples_per_mode():
    lines = []
    factories = [("a", lambda: fake_mode("a", 1e-4)), ("b", lambda: (_ for _ in ()).throw(harness.Skip("no")))]
    records = harness.measure_group("[t] N=10", factories, 2, 0.002, 1000, lines.append)
    assert len(records["a"]["samples"]) == 2 and records["b"] == {"skipped": "no"}
    assert lines[0].startswith("[t] N=10 ready in") and "[t] N=10 repeat 2/2" in lines


# ---------------------------------------------------------------------------
# The jit modes on the CPU, with a pure-JAX stand-in for the replayable
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7])
def test_jit_modes_check_and_time_on_cpu(n):
    from benchmarks import jax_modes

    rng = np.random.default_rng()
    step = lambda x: x + np.float32(n)  # what the replayed chain computes
    one_kernel = lambda x: x + np.float32(1)
    modes = [jax_modes.jit_loop(step, n, rng), jax_modes.jit_changing(step, n, rng),
             jax_modes.jit_fori(step, n, rng), jax_modes.jit_unrolled(step, n, rng),
             jax_modes.jax_calls(one_kernel, n, rng), jax_modes.trivial_jit(rng)]
    per_call = {m.key: m.per_call for m in modes}
    assert per_call == {"jit_loop": n, "jit_changing": n, "jit_fori": n * config.fori_trips(n),
                        "jit_unrolled": n * config.UNROLL, "jax_calls": n, "trivial_jit": 1}
    assert "each of 8 inputs" in modes[1].check and modes[2].info["trips"] == config.fori_trips(n)
    for mode in modes:
        mode.calls = 3
        assert mode.sample() > 0


@pytest.mark.parametrize("n", [1, 5])
def test_mixed_modes_check_and_time_on_cpu(n):
    from benchmarks import jax_modes

    rng = np.random.default_rng()
    step = lambda x: x + np.float32(n)
    one_kernel = lambda x: x + np.float32(1)
    modes = [jax_modes.mixed(step, n, rng), jax_modes.mixed(step, n, rng, changing=True),
             jax_modes.mixed_calls(one_kernel, n, rng), jax_modes.mixed_calls(one_kernel, n, rng, changing=True)]
    assert [m.key for m in modes] == list(config.MIXED_MODES)
    assert all(m.per_call == n * config.MIXED_REPLAYS for m in modes)
    assert all(f"{config.MIXED_REPLAYS} stages of x + {n} with x * 2 - 3 between them" in m.check for m in modes)
    assert "each of 8 inputs" in modes[1].check and "each of" not in modes[0].check
    for mode in modes:
        mode.calls = 2
        assert mode.sample() > 0
    x = np.array([1.0, -7.0], np.float32)
    want, _ = jax_modes.mixed_reference(x, n)  # ((x + n) * 2 - 3 + n) * 2 - 3 + n
    np.testing.assert_array_equal(want, ((x + n) * 2 - 3 + n) * 2 - 3 + n)


def test_mixed_modes_refuse_a_wrong_answer_and_honour_skips():
    from benchmarks import jax_modes

    rng = np.random.default_rng()
    with pytest.raises(AssertionError, match="wrong result: expected 3 stages of x \\+ 4"):
        jax_modes.mixed(lambda x: x + np.float32(3), 4, rng)  # one kernel short per replay
    with pytest.raises(AssertionError, match="wrong result"):
        jax_modes.mixed_calls(lambda x: x * np.float32(1), 2, rng, changing=True)  # kernels that do nothing
    with pytest.raises(harness.Skip, match="budget"):
        jax_modes.mixed_calls(lambda x: x + 1, 1000, rng, skip="over the budget")


def test_jit_modes_refuse_a_wrong_answer_and_honour_skips():
    from benchmarks import jax_modes

    rng = np.random.default_rng()
    with pytest.raises(AssertionError, match="expected x \\+ 2000"):
        jax_modes.jit_fori(lambda x: x + np.float32(1), 2, rng)  # half the work per replay
    with pytest.raises(harness.Skip, match="budget"):
        jax_modes.jax_calls(lambda x: x + 1, 1000, rng, skip="over the budget")


def test_fori_trips_bounds():
    assert [config.fori_trips(n) for n in (1, 10, 100, 1000, 100_000)] == [1000, 1000, 100, 10, 10]


# ---------------------------------------------------------------------------
# Markdown, files and the plot
# ---------------------------------------------------------------------------


def test_markdown_tables_from_synthetic_results():
    text = report.markdown(synthetic_results())
    assert text.startswith("# jaxgraph benchmark: NVIDIA H100 80GB HBM3")
    assert "| N | raw | replay | torch_cupy | torch_add |" in text
    assert "| 1 | 1.000 | 1.000 (1.00x) | 1.200 (1.20x) | 1.150 (1.15x) |" in text
    assert "| N | raw | jit_loop | jit_changing | jit_fori | jit_unrolled | jax_calls |" in text
    assert "| 1 | 2.000 | 40.00 (20.00x) | 50.00 (25.00x) | – | – | 38.00 (19.00x) |" in text
    assert "| 100 | 1.000 | 20.00 (20.00x) | 25.00 (25.00x) | – | – | skipped |" in text
    # Per call: us per kernel times N; trivial_jit as recorded; changing over fixed.
    assert "| on | jit_loop | 40.00 | 2000 |" in text
    assert "| on | trivial_jit | 76.00 | 38.00 |" in text
    assert "| on | jit_changing / jit_loop | 1.25x | 1.25x |" in text
    assert "| capture + instantiate of 1000 launches with `jaxgraph.graph` (ms) | 15.50 ms | 15.00-16.00 |" in text
    assert "torch is not installed" in text
    assert "## off: XLA command buffers off" in text and "Failed: exit code 1" in text
    assert "- on jax_calls N=100: skipped: too slow to compile" in text
    assert "580.159.04" in text and "jax 0.11.2" in text


def test_markdown_mixed_headline_and_counters():
    on = worker_record("on", 1.0, {"mixed": 1.05, "mixed_calls": 1.5, "mixed_changing": 1.1,
                                   "mixed_calls_changing": 1.6, "jit_loop": 1.02}, ns=("10", "100"))
    for mode in config.MIXED_MODES:
        for n in ("10", "100"):
            on["modes"][mode]["by_n"][n]["per_call"] = int(n) * config.MIXED_REPLAYS
    on["modes"]["jit_loop"]["by_n"]["100"].update(
        counters={"handler_calls": 1.0, "launch": 0.0, "splice_nodes": 0.5, "splice_whole": 0.0,
                  "uncaptured_launch": 0.0, "instantiate": 0.0, "rebind": 0.0, "copy": 0.5,
                  "handler_ns": 12345.0}, settled=True, settle_runs=3)
    on["modes"]["mixed"]["by_n"]["100"].update(counters={"handler_calls": 3.0, "launch": 3.0, "handler_ns": 3000.0},
                                               settled=False, settle_runs=8)
    on["modes"]["raw"]["by_n"]["100"]["counters"] = {"handler_calls": 0.0}  # never listed
    meta = {"schema": 1, "date": "2026-11-23", "quick": True, "config": {"repeats": 3}, "versions": {}, "device": {}}
    text = report.markdown(stats.merge(meta, {"on": on}))
    assert "## Replays between XLA ops (3 stages of N kernels" in text
    # per call: 1.05 us x 300 kernels; ahead: 1.5 / 1.05
    assert "| on | 100 | 315.0 (1.05x) | 450.0 (1.50x) | 1.43x | 330.0 (1.10x) | 480.0 (1.60x) | 1.45x |" in text
    assert "| on | 10 | 31.50 (1.05x) |" in text
    assert text.index("## Replays between XLA ops") < text.index("## on:")
    assert "| N | raw | jit_loop | jit_changing | jit_fori | jit_unrolled | jax_calls |" in text  # no mixed there
    assert ("| setting | N | mode | handler_calls | launch | splice_nodes | splice_whole | uncaptured_launch "
            "| instantiate | rebind | copy | to_copy | handler us |") in text
    assert "| on | 100 | jit_loop | 1 | 0 | 0.50 | 0 | 0 | 0 | 0 | 0.50 | 0 | 12.35 |" in text
    assert "| on | 100 | mixed (not settled) | 3 | 3 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 3.000 |" in text
    assert "| on | 100 | raw |" not in text


def test_fmt_keeps_significant_digits_without_exponents():
    assert [report.fmt(v) for v in (1.0234, 36.44, 123.46, 20480.4, None)] == ["1.023", "36.44", "123.5",
                                                                              "20480", "–"]


def test_write_outputs_names_files_after_the_device(tmp_path):
    results = synthetic_results()
    results["quick"] = True
    written = run.write_outputs(results, tmp_path, plot=False)
    assert [p.name for p in written] == ["nvidia-h100-80gb-hbm3-quick.json", "nvidia-h100-80gb-hbm3-quick.md"]
    again = json.loads(written[0].read_text())
    assert again["processes"]["on"]["modes"]["jit_loop"]["by_n"]["1"]["ratio"] == pytest.approx(20.0)
    assert written[1].read_text() == report.markdown(again)


def test_plot_series_and_png_from_json(tmp_path):
    from benchmarks import plot

    results = synthetic_results()
    lines = plot.series(results)
    keys = {(line["setting"], line["mode"]) for line in lines}
    assert ("nojax", "raw") in keys and ("on", "jit_loop") in keys
    assert ("on", "trivial_jit") not in keys  # per call, not per kernel
    assert next(l for l in lines if l["mode"] == "jax_calls")["n"] == [1]  # N=100 was skipped
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: the PNG is rendered elsewhere")
    json_path = tmp_path / "dev.json"
    json_path.write_text(json.dumps(stats.json_ready(results)))
    assert plot.main([str(json_path)]) == 0
    png = tmp_path / "dev.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


# ---------------------------------------------------------------------------
# A worker without a GPU
# ---------------------------------------------------------------------------


@pytest.mark.skipif(HAS_GPU, reason="on a GPU machine the worker would really measure")
def test_worker_without_a_gpu_writes_its_failure(tmp_path):
    out = tmp_path / "off.json"
    cmd = run.worker_command("off", out, config.QUICK)
    env = run.worker_env(config.SETTINGS["off"], os.environ)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    assert record["setting"] == "off" and record["xla_flags"] == "--xla_gpu_enable_command_buffer="
    assert record["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert any("no CUDA device" in e for e in record["errors"]), record["errors"]


def test_markdown_of_a_run_that_measured_nothing():
    processes = {key: {"setting": key, "modes": {}, "scalars": {}, "errors": ["process: RuntimeError: no CUDA device"]}
                 for key in ("nojax", "on")}
    text = report.markdown(stats.merge({"quick": True, "config": {"repeats": 3}}, processes))
    assert text.startswith("# jaxgraph benchmark: unknown device")
    assert text.count("Nothing measured") == 2 and "## Per call" not in text
    assert "- on: process: RuntimeError: no CUDA device" in text


def test_profile_call_markdown_lists_every_probe_and_errors():
    from benchmarks import profile_call

    results = {
        "nojax": {"g.replay()": {"median": 2.5, "min": 2.4, "max": 2.9, "n": 15}, "_flags": None},
        "off": {"replay_jit": {"median": 41.25, "min": 40.0, "max": 44.0, "n": 15},
                "replay_jit.handler": {"median": 1.125, "min": 1.0, "max": 1.5, "n": 15}},
        "on": {"_error": "RuntimeError: no CUDA device"},
    }
    text = profile_call.markdown(results)
    assert "| g.replay() | 2.50 | [2.40, 2.90] |" in text
    assert "| replay_jit.handler | 1.12 | [1.00, 1.50] |" in text or "| replay_jit.handler | 1.13 |" in text
    assert "RuntimeError: no CUDA device" in text
    assert "_flags" not in text  # bookkeeping keys are not probes


# ---------------------------------------------------------------------------
# Scaling over GPUs (benchmarks/scaling.py)
# ---------------------------------------------------------------------------


def test_scaling_arguments():
    from benchmarks import scaling

    args = scaling.parse_args([])
    assert (args.elements, args.kernels, args.repeats, args.target_ms, args.devices) == (1 << 22, 100, 9, 100.0, None)
    quick = scaling.parse_args(["--quick", "--kernels", "10", "--devices", "2", "--out", "/tmp/s"])
    assert (quick.repeats, quick.target_ms, quick.kernels, quick.devices, quick.out) == (3, 20.0, 10, 2, Path("/tmp/s"))
    for bad in (["--devices", "1"], ["--kernels", "0"], ["--elements", "-4"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            scaling.parse_args(bad)


def scaling_results(t1, t2, r1=5.0, r2=5.2):
    from benchmarks import scaling

    records = {"jit_1gpu": {"samples": [t1, t1 * 1.1, t1 * 0.9]}, "jit_2gpus": {"samples": [t2, t2 * 1.2, t2]},
               "replay_1gpu": {"samples": [r1] * 3}, "replay_2gpus": {"samples": [r2] * 3},
               "broken": {"error": "setup: RuntimeError: boom"}}
    for record in records.values():
        if "samples" in record:
            record["stats"] = stats.summarize(record["samples"])
    results = {"n": 2, "modes": records, "scaling": scaling.scaling(records, 2), "date": "2026-11-23",
               "git": "abc", "device": {"name": "NVIDIA H200"},
               "config": {"elements": 1 << 22, "kernels": 100, "repeats": 3, "target_ms": 100.0}}
    return results


def test_scaling_ratio_is_n_times_t1_over_tn_with_the_target():
    from benchmarks import scaling

    r = scaling_results(1000.0, 1040.0)["scaling"]
    assert r["jit"]["ratio"] == pytest.approx(2 * 1000 / 1040)
    # Per round: (1000, 1040), (1100, 1248), (900, 1040).
    assert r["jit"]["ratio_min"] == pytest.approx(2 * 900 / 1040) and r["jit"]["ratio_max"] == pytest.approx(2 * 1000 / 1040)
    assert r["jit"]["met"] and r["jit"]["target"] == scaling.TARGET
    assert r["replay"]["ratio"] == pytest.approx(2 * 5.0 / 5.2) and "target" not in r["replay"]
    assert not scaling_results(1000.0, 1100.0)["scaling"]["jit"]["met"]  # 1.82x
    assert scaling.scaling({"jit_1gpu": {"samples": [1.0]}}, 2) == {}  # nothing to compare


def test_scaling_markdown():
    from benchmarks import scaling

    text = scaling.markdown(scaling_results(1000.0, 1040.0))
    assert text.startswith("# jaxgraph scaling over GPUs: NVIDIA H200")
    assert "| `jit_1gpu` | `jax.jit(jax.shard_map(sg))`, one call per step | 1000 | 900.0-1100 |" in text
    assert "| `replay_2gpus` | `sg.replay(d)` on each device per step, from the host | 5.200 | 5.200-5.200 |" in text
    assert "**jitted shard_map step: throughput on 2 GPUs = 1.92x one GPU** (rounds 1.73-1.92); target >= 1.9x: met" in text
    assert "host replays, no JAX: throughput on 2 GPUs = 1.92x" in text
    assert "- broken: setup: RuntimeError: boom" in text
    assert "NOT met" in scaling.markdown(scaling_results(1000.0, 1200.0))


SCALING_ON_CPU = r'''
import sys
import numpy as np
import jax
sys.path.insert(0, sys.argv[1])
from benchmarks import scaling

rng = np.random.default_rng()
kernels = 7
step = lambda x: x + np.float32(kernels)  # what each device's graph computes
for devices in (jax.devices()[:1], jax.devices()[:2]):
    mode = scaling.jit_step_mode(f"jit_{len(devices)}", step, devices, 512, kernels, rng)
    mode.calls = 3
    assert mode.sample() > 0 and mode.unit == "us_per_call" and f"({len(devices)} shard(s))" in mode.check
    print("OK", mode.key, mode.check)
try:
    scaling.jit_step_mode("wrong", lambda x: x + 1, jax.devices()[:2], 512, kernels, rng)
except AssertionError as exc:
    print("REFUSED", exc)
'''


def test_scaling_jit_mode_checks_every_shard_on_two_cpu_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCALING_ON_CPU, str(ROOT)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK jit_1 x + 7 on 512 random floats matches numpy (1 shard(s))" in proc.stdout
    assert "OK jit_2 x + 7 on 1024 random floats matches numpy (2 shard(s))" in proc.stdout
    assert "REFUSED wrong result: expected x + 7" in proc.stdout


@pytest.mark.skipif(HAS_GPU, reason="on a GPU machine the benchmark would really run")
def test_scaling_without_gpus_says_so():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--quick"], cwd=ROOT,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "scaling needs JAX with CUDA on several GPUs" in proc.stderr


# ---------------------------------------------------------------------------
# --loops: the loop modes
# ---------------------------------------------------------------------------


def test_driver_loops_runs_only_the_loop_modes_in_every_setting():
    args = run.parse_args(["--loops"])
    assert args.settings == ("nojax", "off", "on", "defaults", "while")
    cfg = run.build_config(args)
    assert cfg.loops and cfg.ns == (1, 10, 100)
    assert cfg.runs("loop_k8") and cfg.runs("xla_fori") and cfg.runs("jit_fori") and cfg.runs("raw")
    assert not cfg.runs("jit_loop") and not cfg.runs("jax_calls") and not cfg.runs("capture_1000")
    assert config.RunConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    assert run.build_config(run.parse_args(["--loops", "--ns", "10", "--modes", "loop_k2"])).modes == ("loop_k2",)
    assert run.worker_env(config.SETTINGS["while"], {})["XLA_FLAGS"].startswith(
        "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL")
    with pytest.raises(SystemExit):
        run.parse_args(["--loops", "--quick"])


def test_xla_fori_mode_checks_and_times_on_cpu():
    from benchmarks import loop_modes

    mode = loop_modes.xla_fori(lambda x: x + np.float32(1), 3, np.random.default_rng())
    assert mode.per_call == 3 * config.fori_trips(3) and mode.info["steps"] == config.fori_trips(3)
    mode.calls = 2
    assert mode.sample() > 0
    with pytest.raises(AssertionError, match="expected x"):
        loop_modes.xla_fori(lambda x: x + np.float32(2), 3, np.random.default_rng())


def test_loop_markdown_per_step_and_same_process_ratios(tmp_path):
    nojax = worker_record("nojax", 1.0, {"loop_k8": 1.05, "loop_unrolled": 1.0, "loop_until": 4.0},
                          ns=("1", "10"))
    nojax["modes"]["loop_k8"]["by_n"]["1"]["unroll"] = 8
    on = worker_record("on", 2.0, {"loop_jit": 0.6, "xla_fori": 6.0, "jit_fori": 3.0}, ns=("1", "10"))
    meta = {"schema": 1, "date": "2026-11-23T10:00:00+00:00", "quick": False, "device": {},
            "config": {"repeats": 3, "loops": True}, "versions": {}}
    results = stats.merge(meta, {"nojax": nojax, "on": on})
    text = report.markdown(results)
    assert "## Loops: us per step" in text
    assert "| N | raw | loop_k8 | loop_until | loop_unrolled |" in text
    assert "| 1 | 1.000 | 1.050 K=8 (1.05x) | 4.000 (4.00x) | 1.000 (1.00x) |" in text
    assert "| 10 | 10.00 | 10.50 (1.05x) |" in text              # per step = per kernel x N
    assert "| nojax | 1 | loop_k8 / loop_unrolled | 1.05x |" in text
    assert "| on | 1 | xla_fori / loop_jit | 10.00x |" in text
    assert "| on | 10 | jit_fori / loop_jit | 5.00x |" in text
    written = run.write_outputs(results, tmp_path, plot=False)
    assert sorted(p.suffix for p in written) == [".json", ".md"]
    assert all(p.stem.endswith("-loops") for p in written)
