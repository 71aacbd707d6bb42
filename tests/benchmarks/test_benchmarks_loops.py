"""The benchmark harness's ``--loops`` on the CPU: the driver's loop modes, ``xla_fori``, their markdown."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks import run  # noqa: E402
from benchmarks.harness import config, stats  # noqa: E402
from benchmarks.reports import run_report  # noqa: E402
from support.benchmark_records import worker_record  # noqa: E402


# ---------------------------------------------------------------------------
# --loops: the loop modes
# ---------------------------------------------------------------------------


def test_driver_loops_runs_only_the_loop_modes_in_every_setting():
    args = run.parse_args(["--loops"])
    assert args.settings == ("nojax", "off", "on", "defaults", "while")
    cfg = run.build_config(args)
    assert cfg.loops and cfg.ns == (1, 10, 100)
    assert cfg.runs("loop_k8") and cfg.runs("xla_fori") and cfg.runs("jit_fori") and cfg.runs("raw")
    assert cfg.runs("xla_while") and cfg.runs("loop_until") and cfg.runs("loop_until_k1")
    assert not cfg.runs("jit_loop") and not cfg.runs("jax_calls") and not cfg.runs("capture_1000")
    assert config.RunConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    assert run.build_config(run.parse_args(["--loops", "--ns", "10", "--modes", "loop_k2"])).modes == ("loop_k2",)
    assert run.worker_env(config.SETTINGS["while"], {})["XLA_FLAGS"].startswith(
        "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL")
    with pytest.raises(SystemExit):
        run.parse_args(["--loops", "--quick"])


def test_xla_fori_mode_checks_and_times_on_cpu():
    from benchmarks.harness import loop_modes

    mode = loop_modes.xla_fori(lambda x: x + np.float32(1), 3, np.random.default_rng())
    assert mode.per_call == 3 * config.fori_trips(3) and mode.info["steps"] == config.fori_trips(3)
    mode.calls = 2
    assert mode.sample() > 0
    with pytest.raises(AssertionError, match="expected x"):
        loop_modes.xla_fori(lambda x: x + np.float32(2), 3, np.random.default_rng())


@pytest.mark.parametrize("factory", ["jnp_fori", "jnp_while"])
def test_idiomatic_loop_modes_check_and_time_on_cpu(factory):
    from benchmarks.harness import loop_modes

    mode = getattr(loop_modes, factory)(3, np.random.default_rng())
    assert mode.per_call == 3 * config.fori_trips(3) and mode.info["steps"] == config.fori_trips(3)
    assert "matches numpy" in mode.check
    mode.calls = 2
    assert mode.sample() > 0


def test_loop_markdown_puts_idiomatic_jax_first_and_the_stops_over_the_floor():
    nojax = worker_record("nojax", 1.0, {"loop_unrolled": 1.0, "loop_kdefault": 1.1, "loop_until": 5.5,
                                         "loop_until_k8": 1.6, "loop_until_k32": 1.2}, ns=("1",))
    on = worker_record("on", 2.0, {"jnp_fori": 3.0, "jnp_while": 15.0, "loop_jit": 1.2, "loop_jit_until": 6.0,
                                   "loop_jit_until_k8": 1.5, "xla_fori": 4.8}, ns=("1",))
    meta = {"schema": 1, "date": "2026-11-27T10:00:00+00:00", "quick": False, "device": {},
            "config": {"repeats": 3, "loops": True}, "versions": {}}
    text = run_report.markdown(stats.merge(meta, {"nojax": nojax, "on": on}))
    assert "| N | raw | jnp_fori | jnp_while | loop_jit | loop_jit_until | loop_jit_until_k8 | xla_fori |" in text
    assert text.index("| on | 1 | jnp_fori / loop_jit | 2.50x |") < text.index("| on | 1 | xla_fori / loop_jit |")
    assert "| on | 1 | jnp_while / loop_jit_until | 2.50x |" in text
    assert "| on | 1 | jnp_while / loop_jit_until_k8 | 10.00x |" in text
    assert "### Device stops over the unrolled floor (nojax, us per step)" in text
    assert "| 1 | 1.000 | 1.100 (+0.10) | 5.500 (+4.50) | 1.600 (+0.60) | 1.200 (+0.20) |" in text


def test_loop_markdown_states_the_exact_stop_targets_at_each_sides_best_setting():
    nojax = worker_record("nojax", 1.0, {"loop_unrolled": 1.0, "loop_until": 2.2, "loop_until_k1": 5.2}, ns=("1",))
    on = worker_record("on", 2.0, {"loop_jit_until": 2.5, "xla_while": 12.0}, ns=("1",))
    while_ = worker_record("while", 2.0, {"loop_jit_until": 2.4, "xla_while": 7.2}, ns=("1",))
    meta = {"schema": 1, "date": "2026-11-28T10:00:00+00:00", "quick": False, "device": {},
            "config": {"repeats": 3, "loops": True}, "versions": {}}
    text = run_report.markdown(stats.merge(meta, {"nojax": nojax, "on": on, "while": while_}))
    assert "### Exact stop: the targets (us per step)" in text
    assert "| 1 | +1.20 | 14.40 (while) | 4.800 (while) | 3.00x |" in text  # worker_record scales by raw
    assert "| on | 1 | xla_while / loop_jit_until | 4.80x |" in text


def test_xla_while_mode_checks_and_times_on_cpu():
    from benchmarks.harness import loop_modes

    mode = loop_modes.xla_while(lambda x: x + np.float32(1), 3, np.random.default_rng())
    assert mode.per_call == 3 * config.fori_trips(3) and mode.info["steps"] == config.fori_trips(3)
    mode.calls = 2
    assert mode.sample() > 0
    with pytest.raises(AssertionError, match="expected x"):
        loop_modes.xla_while(lambda x: x + np.float32(2), 3, np.random.default_rng())


def test_loop_markdown_per_step_and_same_process_ratios(tmp_path):
    nojax = worker_record("nojax", 1.0, {"loop_k8": 1.05, "loop_unrolled": 1.0, "loop_until": 4.0},
                          ns=("1", "10"))
    nojax["modes"]["loop_k8"]["by_n"]["1"]["unroll"] = 8
    on = worker_record("on", 2.0, {"loop_jit": 0.6, "xla_fori": 6.0, "jit_fori": 3.0}, ns=("1", "10"))
    meta = {"schema": 1, "date": "2026-11-23T10:00:00+00:00", "quick": False, "device": {},
            "config": {"repeats": 3, "loops": True}, "versions": {}}
    results = stats.merge(meta, {"nojax": nojax, "on": on})
    text = run_report.markdown(results)
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
