"""``jaxgraph.compare`` run for real on the CPU: worker processes per setting, agreement, failures, the CLI.

Every test here starts worker processes (each imports JAX under its setting's
``XLA_FLAGS``) on tiny arrays with few rounds and short samples: seconds each.
The factories are in ``compare_factories.py`` beside this file.
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import jaxgraph.compare as compare
from jaxgraph.compare import SETTINGS

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FACTORIES = str(HERE / "compare_factories.py")
FAST = dict(rounds=3, target_ms=1.0, timeout_s=120.0)


@pytest.fixture(scope="module", autouse=True)
def _workers_on_the_cpu():
    """The tool's mechanics are tested with its workers' JAX on the CPU, on a GPU machine too: a worker
    starts in about a second instead of initialising CUDA, and these tests start over a hundred
    (``test_compare_gpu.py`` runs the tool on the GPU)."""
    saved = os.environ.get("JAX_PLATFORMS")
    os.environ["JAX_PLATFORMS"] = "cpu"
    yield
    if saved is None:
        os.environ.pop("JAX_PLATFORMS", None)
    else:
        os.environ["JAX_PLATFORMS"] = saved


@pytest.fixture(scope="module")
def agreeing():
    """The labelled pair (a fori_loop and an already-jitted scan) under all four settings."""
    return compare.run(f"{FACTORIES}:make_pair", **FAST)


def test_every_setting_times_every_function_and_the_results_agree(agreeing):
    res = agreeing
    assert res.ok, str(res)
    assert res.labels == ("fori", "scan")
    assert [s.name for s in res.settings] == ["off", "on", "defaults", "while"]
    assert res.backend == "cpu" and res.failures == []
    for label in res.labels:
        timings = res.timings[label]
        assert set(timings) == {"off", "on", "defaults", "while"}
        for t in timings.values():
            assert len(t.samples) == 3 and all(s > 0 for s in t.samples)
            assert t.low <= t.median <= t.high and t.calls == res.calls_per_sample[label] >= 1
        assert min(t.ratio for t in timings.values()) == 1.0
        assert res.reference[label] == "off" and res.compared[label] == ["off", "on", "defaults", "while"]
        assert res.mismatches[label] == {}


def test_each_setting_ran_in_its_own_process_with_its_flags(agreeing):
    res = agreeing
    for name in ("off", "on", "while"):
        assert res.xla_flags[name].startswith(SETTINGS[name].xla_flags + " --xla_dump_to="), res.xla_flags[name]
    assert res.xla_flags["defaults"].startswith("--xla_dump_to=")  # JAX's defaults: only the dump
    assert SETTINGS["on"].xla_flags == ("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                                        "--xla_gpu_graph_min_graph_size=1")
    assert SETTINGS["off"].xla_flags == "--xla_gpu_enable_command_buffer="


def test_command_buffers_are_counted_from_xla_s_dump(agreeing):
    # On the CPU XLA makes none; the count still comes from the module XLA dumped for each function.
    for label in agreeing.labels:
        for name, source in agreeing.command_buffers_from[label].items():
            assert source.startswith("XLA dump: module_") and "cpu_after_optimizations.txt" in source, source
            assert agreeing.command_buffers[label][name] == 0


def test_the_table_says_what_ran_and_how(agreeing):
    table = str(agreeing)
    assert "on cpu" in table and "3 interleaved rounds" in table
    assert "| setting" in table and "median (" in table and "vs best" in table and "command buffers" in table
    lines = table.splitlines()
    for label in ("fori", "scan"):
        block = lines[lines.index(next(ln for ln in lines if ln.startswith(label + " "))):]
        rows = [ln for ln in block[3:7]]
        assert [r.split("|")[1].strip() for r in rows] == ["off", "on", "defaults", "while"]
        assert all("n/a (no GPU)" in r for r in rows)  # a CPU makes no command buffers: not "0"
        assert "reference" in rows[0] and all("agree" in r for r in rows[1:])
        assert sum("1.00x" in r for r in rows) >= 1
    for s in SETTINGS.values():
        assert s.label in table
    assert "XLA_FLAGS='--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1'" in table
    assert "XLA_FLAGS=unset" in table and "results agree" in table and "rtol=1e-05, atol=1e-08" in table
    assert "failures:" not in table


def test_to_json_holds_the_data(agreeing):
    data = json.loads(agreeing.to_json())
    assert data["ok"] is True and data["labels"] == ["fori", "scan"]
    assert [s["name"] for s in data["settings"]] == ["off", "on", "defaults", "while"]
    for label in ("fori", "scan"):
        for name, t in data["timings"][label].items():
            assert t["samples"] == list(agreeing.timings[label][name].samples)
            assert t["median"] == agreeing.timings[label][name].median


def test_a_result_that_depends_on_the_setting_is_reported_with_where():
    res = compare.run(f"{FACTORIES}:make_setting_dependent", ["off", "defaults"],
                      factory_kwargs={"differ_in": "defaults"}, **FAST)
    assert not res.ok and res.failures == []
    m = res.mismatches["loop"]["defaults"]
    assert m.output == "result" and m.index == (3,) and m.count == 1 and m.size == 64
    assert m.max_abs_diff == pytest.approx(1.0, rel=1e-6)
    assert m.value == pytest.approx(m.reference_value + 1.0, rel=1e-6)
    table = str(res)
    assert "DIFFER (result)" in table and "results DIFFER" in table
    assert "loop: defaults vs off: result: 1 of 64 elements not within rtol=1e-05" in table
    assert "at index (3,)" in table
    # The same program under a looser tolerance agrees.
    loose = compare.run(f"{FACTORIES}:make_setting_dependent", ["off", "defaults"], atol=1.5,
                        factory_kwargs={"differ_in": "defaults"}, **FAST)
    assert loose.ok, str(loose)


def test_the_functions_can_be_compared_with_each_other():
    same = compare.run(f"{FACTORIES}:make_two_ways", ["off"], compare_functions=True, **FAST)
    assert same.ok and same.function_mismatches == {} and same.function_reference == "off", str(same)
    assert "functions agree: unrolled match fori (under off)" in str(same)
    # fori returns the state; scan returns (state, means): not the same result.
    other = compare.run(f"{FACTORIES}:make_pair", ["off"], compare_functions=True, **FAST)
    assert not other.ok and list(other.function_mismatches) == ["scan"]
    assert "structure" in other.function_mismatches["scan"].reason
    assert "functions DIFFER from fori (under off):" in str(other)
    assert json.loads(other.to_json())["function_mismatches"]["scan"]["output"] == "(structure)"


@pytest.mark.parametrize("factory, kind, text", [
    (str(HERE / "broken_factory.py") + ":make_case", "ModuleNotFoundError", "jaxgraph_no_such_module"),
    (str(HERE / "no_such_file.py") + ":make_case", "FileNotFoundError", "no such factory file"),
    ("jaxgraph_no_such_module_either:make_case", "ModuleNotFoundError", "jaxgraph_no_such_module_either"),
    (f"{FACTORIES}:no_such_factory", "AttributeError", "no_such_factory"),
])
def test_a_factory_that_fails_to_import_is_reported_per_setting(factory, kind, text):
    res = compare.run(factory, ["off", "defaults"], **FAST)
    assert not res.ok and res.labels == ()
    assert [(f.setting, f.label, f.stage, f.type) for f in res.failures] == [
        ("off", None, "import", kind), ("defaults", None, "import", kind)]
    assert all(text in f.message and "Traceback" in f.traceback for f in res.failures)
    table = str(res)
    assert "no function ran" in table and f"off (import): {kind}" in table and "Traceback" not in table
    assert "Traceback" in res.table(verbose=True)


@pytest.mark.parametrize("factory, kind, text", [
    ("make_raising", "RuntimeError", "the factory itself fails"),
    ("make_wrong_type", "TypeError", "must be (fn, args), a jaxgraph.compare.Case or a dict"),
])
def test_a_factory_that_raises_is_reported_per_setting(factory, kind, text):
    res = compare.run(f"{FACTORIES}:{factory}", ["off"], **FAST)
    assert [(f.setting, f.stage, f.type) for f in res.failures] == [("off", "factory", kind)]
    assert text in res.failures[0].message and f"off (factory): {kind}: " in str(res)


def test_a_function_failing_in_one_setting_leaves_the_others_timed():
    res = compare.run(f"{FACTORIES}:make_failing", ["off", "defaults"], factory_kwargs={"fail_in": "defaults"},
                      **FAST)
    assert not res.ok
    failed = {(f.setting, f.label): f for f in res.failures}
    assert set(failed) == {("defaults", "bad"), ("defaults", "late")}
    bad, late = failed["defaults", "bad"], failed["defaults", "late"]
    assert (bad.stage, bad.type, bad.message) == ("first call", "ValueError", "bad refuses to run under defaults")
    assert (late.stage, late.type, late.message) == ("round 1", "RuntimeError", "late fails at call 3")
    assert "Traceback" in bad.traceback and "in bad" in bad.traceback
    assert set(res.timings["good"]) == {"off", "defaults"} and set(res.timings["bad"]) == {"off"}
    assert set(res.timings["late"]) == {"off"} and len(res.timings["late"]["off"].samples) == 3
    table = str(res)
    row = next(ln for ln in table.splitlines() if ln.startswith("| defaults") and "ValueError" in ln)
    assert "failed" in row and "ValueError: bad refuses to run under defaults (first call)" in row
    assert "defaults / late (round 1): RuntimeError: late fails at call 3" in table
    assert "Traceback" not in table and "in bad" in res.table(verbose=True)


def test_a_worker_past_the_timeout_is_stopped_and_reported():
    start = time.monotonic()
    res = compare.run(f"{FACTORIES}:make_slow", ["off", "defaults"], rounds=2, target_ms=1.0, timeout_s=8.0,
                      factory_kwargs={"slow_in": "defaults", "seconds": 300})
    assert time.monotonic() - start < 60  # the hung worker was not waited for
    [f] = res.failures
    assert (f.setting, f.label, f.stage, f.type) == ("defaults", None, "start", "Timeout")
    assert "no answer within the timeout of 8 s while starting" in f.message
    assert set(res.timings["make_slow"]) == {"off"}
    assert "Timeout: no answer within the timeout of 8 s" in str(res)
    assert not _alive(res.pids["defaults"])  # killed, with its process group


def test_the_environment_s_xla_flags_are_replaced_and_extra_flags_reach_every_worker(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_no_such_flag=1")  # would kill every worker if it were passed on
    res = compare.run(f"{FACTORIES}:make_loop", ["off", "defaults"],
                      extra_xla_flags="--xla_cpu_enable_fast_math=false", count_command_buffers=False, **FAST)
    assert res.ok, str(res)
    assert res.xla_flags == {"off": "--xla_gpu_enable_command_buffer= --xla_cpu_enable_fast_math=false",
                             "defaults": "--xla_cpu_enable_fast_math=false"}
    assert res.command_buffers["make_loop"] == {"off": None, "defaults": None}
    assert "your environment's XLA_FLAGS='--xla_no_such_flag=1' were left out of every process" in str(res)


def test_a_worker_that_dies_is_reported_with_its_last_words():
    res = compare.run(f"{FACTORIES}:make_loop", ["off", "bogus=--xla_no_such_flag=1"], **FAST)
    [f] = res.failures
    assert (f.setting, f.stage, f.type) == ("bogus", "start", "WorkerExited")
    assert "Unknown flag in XLA_FLAGS: --xla_no_such_flag=1" in f.message
    assert set(res.timings["make_loop"]) == {"off"}


# ----------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------


def test_the_command_line_prints_the_table_writes_json_and_never_imports_jax(tmp_path):
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    argv = [f"{FACTORIES}:make_pair", "--settings", "off,on", "--rounds", "2", "--target-ms", "1",
            "--json", str(out_json), "--plot", str(out_png), "--arg", "steps=3"]
    script = ("import sys\nfrom jaxgraph.compare.__main__ import main\n"
              f"rc = main({argv!r})\n"
              "print('parent imported jax:', 'jax' in sys.modules)\nsys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "parent imported jax: False" in proc.stdout
    assert "| off " in proc.stdout and "| on " in proc.stdout and "results agree" in proc.stdout
    data = json.loads(out_json.read_text())
    assert data["ok"] and set(data["timings"]["fori"]) == {"off", "on"}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no plot written: matplotlib is not installed" in proc.stdout and not out_png.exists()
    else:
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {out_png}" in proc.stdout


def test_the_command_line_without_matplotlib_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    from jaxgraph.compare import __main__ as cli
    from jaxgraph.compare import plot

    real = plot.importlib.util.find_spec
    monkeypatch.setattr(plot.importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else
                        real(name, *a))
    rc = cli.main([f"{FACTORIES}:make_loop", "--settings", "off", "--rounds", "1", "--target-ms", "1",
                   "--plot", str(tmp_path / "p.png")])
    out = capsys.readouterr().out
    assert rc == 0 and not (tmp_path / "p.png").exists()
    assert [ln for ln in out.splitlines() if "matplotlib" in ln] == [
        "no plot written: matplotlib is not installed (pip install matplotlib)"]


def test_the_command_line_exits_1_when_results_differ_and_shows_tracebacks_with_verbose():
    proc = subprocess.run([sys.executable, "-m", "jaxgraph.compare", f"{FACTORIES}:make_failing", "--settings",
                           "off,defaults", "--rounds", "1", "--target-ms", "1", "--verbose"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ValueError: bad refuses to run under defaults" in proc.stdout
    assert "Traceback (most recent call last)" in proc.stdout     # the worker's, under --verbose
    assert "Traceback" not in proc.stderr                          # never the tool's own
    assert "[defaults] ready after" in proc.stderr                 # progress, under --verbose


@pytest.mark.parametrize("args, text", [
    (["x:make", "--settings", "off,fast"], "unknown setting 'fast'"),
    (["no_colon"], "must be 'module:function' or 'path/to/file.py:function'"),
    (["x:make", "--rounds", "0"], "rounds must be an int >= 1"),
    (["x:make", "--settings", "off", "--setting", "off=--x"], "two settings share a name"),
])
def test_usage_errors_exit_2_with_a_message(args, text):
    proc = subprocess.run([sys.executable, "-m", "jaxgraph.compare", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and text in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_workers_leave_no_process_behind(agreeing):
    # Every worker answered "quit" (or was killed): none of them is alive once run() returns.
    assert sorted(agreeing.pids) == ["defaults", "off", "on", "while"]
    assert not any(_alive(pid) for pid in agreeing.pids.values())


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
