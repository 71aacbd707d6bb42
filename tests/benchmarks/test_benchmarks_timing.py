"""The benchmark harness's timing machinery on the CPU: sampling, calibration, counters, the jit modes.

Fake modes stand in for the GPU's; the jit modes run on the CPU with a
pure-JAX stand-in for the replayable, and must refuse a wrong answer.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks import run  # noqa: E402
from benchmarks.harness import config, timing  # noqa: E402


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

    mode = timing.Mode(key, run_calls, per_call=10)
    mode.calls_seen = calls_seen
    return mode


def test_sampling_is_round_robin_and_a_failing_mode_drops_out():
    order = []
    modes = [fake_mode("a", 1e-3, order), fake_mode("b", 2e-3, order, fail_on=2), fake_mode("c", 1e-3, order)]
    rounds = []
    samples, errors = timing.sample_interleaved(modes, 3, rounds.append)
    assert order == ["a", "b", "c", "a", "b", "c", "a", "c"]
    assert rounds == [0, 1, 2]
    assert samples["a"] == pytest.approx([100.0] * 3)  # 1 ms per call / 10 kernels = 100 us per kernel
    assert samples["b"] == pytest.approx([200.0]) and "device fell over" in errors["b"]
    assert "a" not in errors


def test_steady_samples_leave_out_the_burst_fixed_start_and_end():
    # Each burst costs 0.5 ms at its ends plus 1 ms a call: the sample reads the ends, the steady one not.
    bursts = []

    def run_calls(calls):
        bursts.append(calls)
        return 0.5e-3 + calls * 1e-3

    mode = timing.Mode("jit_loop", run_calls, per_call=10, calls=40, steady=True)
    sample = mode.sample()
    assert bursts == [40, 5]  # the sample's burst, then one of 1/8 the calls
    assert sample == pytest.approx((0.5e-3 + 40e-3) / 400 * 1e6)
    assert mode.steady_samples == [pytest.approx(100.0)]  # 1 ms a call of 10 kernels: 100 us per kernel
    plain = timing.Mode("raw", run_calls, per_call=10, calls=40)
    plain.sample()
    assert plain.steady_samples == [] and bursts[-1] == 40  # no extra burst without steady
    short = timing.Mode("jit_loop", run_calls, per_call=10, calls=15, steady=True)
    short.sample()
    assert short.steady_samples == []  # too few calls to split


def test_calibration_aims_at_the_target_and_caps_calls():
    mode = fake_mode("a", 1e-4)
    assert timing.calibrate(mode, 0.025, 20_000) == 250 and mode.calls == 250
    assert mode.calls_seen == [1, 8, 64]  # grows until a run lasts a quarter of the target
    slow = fake_mode("b", 1.0)
    assert timing.calibrate(slow, 0.025, 20_000) == 1
    capped = fake_mode("c", 1e-9)
    assert timing.calibrate(capped, 0.025, 100) == 100


def test_prepare_records_skips_and_errors_without_raising():
    def skipping():
        raise timing.Skip("cupy is not installed")

    def broken():
        raise ValueError("bad launch")

    assert timing.prepare(skipping, 0.01, 10) == (None, {"skipped": "cupy is not installed"})
    mode, record = timing.prepare(broken, 0.01, 10)
    assert mode is None and record == {"error": "setup: ValueError: bad launch"}
    mode, record = timing.prepare(lambda: fake_mode("ok", 1e-3), 0.01, 1000)
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

        return timing.Mode(key, run_calls, per_call=10)


def test_counters_per_call_and_settling():
    counters = FakeCounters({"handler_calls": 3, "splice_nodes": 3, "handler_ns": 9000},
                            {"handler_calls": 3, "splice_nodes": 0, "handler_ns": 2000}, settle_after=50)
    mode = counters.mode("mixed", 1e-4)
    mode.counters = counters
    mode.calls = 40
    # 40 calls a run: run 2 re-records on 10 of its calls, runs 3 and 4 on none;
    # then calls per sample from the last run (40 calls of 0.1 ms) for a 10 ms target
    assert timing.settle(mode, 0.01, 1000) == {"settle_runs": 4, "settled": True}
    assert mode.calls == 100
    mode.calls = 40
    mode.sample()
    assert mode.counter_samples == [{"handler_calls": 3.0, "splice_nodes": 0.0, "handler_ns": 2000.0}]
    rebinds, runs = [0], [0]

    def more_each_run(calls):  # 1, then 4, then 9 rebinds per call: never settles
        runs[0] += 1
        rebinds[0] += calls * runs[0] ** 2
        return 1e-3

    growing = timing.Mode("x", more_each_run, calls=40, counters=lambda: {"rebind": rebinds[0]})
    assert timing.settle(growing, 0.01, 1000, rounds=3) == {"settle_runs": 3, "settled": False}
    plain = fake_mode("no_counters", 1e-3)
    assert timing.settle(plain, 0.025, 1000) == {} and plain.calls_seen == [1] and plain.calls == 25
    # an event every other call, over an odd number of calls, still reads as settled
    assert timing._same_events({"rebind": 100 * 2 / 5}, {"rebind": 100 * 3 / 5}, 5)
    assert not timing._same_events({"rebind": 0.0}, {"rebind": 100.0}, 5)
    assert timing._same_events({"copy": 1.0, "launch_ns": 10.0}, {"copy": 1.0, "launch_ns": 99.0}, 5)  # times
    assert timing.counter_deltas({"a": 1, "b": 5}, {"a": 7, "b": 5}, 3) == {"a": 2.0, "b": 0.0}


def test_measure_group_records_median_counters_per_call():
    counters = FakeCounters({"handler_calls": 1, "launch": 1, "handler_ns": 5000}, {}, settle_after=10 ** 9)
    factories = [("jit_loop", lambda: counters.mode("jit_loop", 1e-4))]
    records = timing.measure_group("[t] N=1", factories, 3, 0.002, 1000, lambda line: None, counters)
    record = records["jit_loop"]
    assert record["counters"] == {"handler_calls": 1.0, "launch": 1.0, "handler_ns": 5000.0}
    assert record["settled"] and record["settle_runs"] == 2 and len(record["samples"]) == 3
    assert record["warm_up_calls"] == timing.WARM_UP_CALLS  # 64 calls of 0.1 ms: within WARM_UP_S


def test_warm_up_makes_the_first_calls_before_calibration_within_a_bound():
    fast = fake_mode("fast", 1e-4)
    assert timing.warm_up(fast) == {"warm_up_calls": 64, "warm_up_us": [100.0] * 7}
    assert fast.calls_seen == [1, 2, 4, 8, 16, 32, 1]
    slow = fake_mode("slow", 0.1)  # 0.1 s per call: stops once 0.25 s have gone
    assert timing.warm_up(slow)["warm_up_calls"] == 3 and slow.calls_seen == [1, 2]
    # A mode whose first calls are slow (XLA recording) is calibrated on its steady calls.
    first = iter([0.05] + [1e-4] * 1000)
    recording = timing.Mode("jit_loop", lambda calls: sum(next(first) for _ in range(calls)), per_call=100)
    timing.warm_up(recording)
    assert timing.calibrate(recording, 0.025, 20_000) == 250


def test_measure_group_returns_samples_per_mode():
    lines = []
    factories = [("a", lambda: fake_mode("a", 1e-4)), ("b", lambda: (_ for _ in ()).throw(timing.Skip("no")))]
    records = timing.measure_group("[t] N=10", factories, 2, 0.002, 1000, lines.append)
    assert len(records["a"]["samples"]) == 2 and records["b"] == {"skipped": "no"}
    assert lines[0].startswith("[t] N=10 ready in") and "[t] N=10 repeat 2/2" in lines


# ---------------------------------------------------------------------------
# The jit modes on the CPU, with a pure-JAX stand-in for the replayable
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7])
def test_jit_modes_check_and_time_on_cpu(n):
    from benchmarks.harness import jax_modes

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
    from benchmarks.harness import jax_modes

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
    from benchmarks.harness import jax_modes

    rng = np.random.default_rng()
    with pytest.raises(AssertionError, match="wrong result: expected 3 stages of x \\+ 4"):
        jax_modes.mixed(lambda x: x + np.float32(3), 4, rng)  # one kernel short per replay
    with pytest.raises(AssertionError, match="wrong result"):
        jax_modes.mixed_calls(lambda x: x * np.float32(1), 2, rng, changing=True)  # kernels that do nothing
    with pytest.raises(timing.Skip, match="budget"):
        jax_modes.mixed_calls(lambda x: x + 1, 1000, rng, skip="over the budget")


def test_jit_modes_refuse_a_wrong_answer_and_honour_skips():
    from benchmarks.harness import jax_modes

    rng = np.random.default_rng()
    with pytest.raises(AssertionError, match="expected x \\+ 2000"):
        jax_modes.jit_fori(lambda x: x + np.float32(1), 2, rng)  # half the work per replay
    with pytest.raises(timing.Skip, match="budget"):
        jax_modes.jax_calls(lambda x: x + 1, 1000, rng, skip="over the budget")


def test_fori_trips_bounds():
    assert [config.fori_trips(n) for n in (1, 10, 100, 1000, 100_000)] == [1000, 1000, 100, 10, 10]
