"""The benchmark harness's outputs on the CPU: markdown, files, the plot, a worker without a GPU.

Markdown and files are checked on synthetic records shaped as the workers
write them; a worker without a GPU must say so in its JSON.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks import run  # noqa: E402
from benchmarks.harness import config, stats  # noqa: E402
from benchmarks.reports import run_report  # noqa: E402
from support.benchmark_records import synthetic_results, worker_record  # noqa: E402

HAS_GPU = __import__("jaxgraph").device_count() > 0


# ---------------------------------------------------------------------------
# Markdown, files and the plot
# ---------------------------------------------------------------------------


def test_markdown_tables_from_synthetic_results():
    text = run_report.markdown(synthetic_results())
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
    text = run_report.markdown(stats.merge(meta, {"on": on}))
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
    assert [run_report.fmt(v) for v in (1.0234, 36.44, 123.46, 20480.4, None)] == ["1.023", "36.44", "123.5",
                                                                              "20480", "–"]


def test_write_outputs_names_files_after_the_device(tmp_path):
    results = synthetic_results()
    results["quick"] = True
    written = run.write_outputs(results, tmp_path, plot=False)
    assert [p.name for p in written] == ["nvidia-h100-80gb-hbm3-quick.json", "nvidia-h100-80gb-hbm3-quick.md"]
    again = json.loads(written[0].read_text())
    assert again["processes"]["on"]["modes"]["jit_loop"]["by_n"]["1"]["ratio"] == pytest.approx(20.0)
    assert written[1].read_text() == run_report.markdown(again)


def test_plot_series_and_png_from_json(tmp_path):
    from benchmarks.reports import plot

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
    text = run_report.markdown(stats.merge({"quick": True, "config": {"repeats": 3}}, processes))
    assert text.startswith("# jaxgraph benchmark: unknown device")
    assert text.count("Nothing measured") == 2 and "## Per call" not in text
    assert "- on: process: RuntimeError: no CUDA device" in text


def test_profile_call_markdown_lists_every_probe_and_errors():
    from benchmarks.probes import profile_call

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
