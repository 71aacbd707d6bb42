"""Consecutive harness runs (CPU): ``run.py --runs K``, ``benchmarks/reports/consecutive_runs.py`` and issue 19's verdicts over them.

``run.main`` runs with stand-in workers whose figures change from one run to
the next (a target that holds in 2 of 3 runs must be called missed, naming
the run); the files, each run's provenance and the generated tables are read
back from disk.
"""

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks import run  # noqa: E402
from benchmarks.harness import config  # noqa: E402
from benchmarks.reports import consecutive_runs, run_report, targets, targets_over_runs  # noqa: E402
from support.benchmark_records import synthetic_quick, table  # noqa: E402

SLUG = "nvidia-h100-80gb-hbm3"
T = targets_over_runs.TARGETS


def quick_records(on_jit_loop):
    """Worker records of a quick run: every jit ratio at N=100 within 1.05x but on's `jit_loop` (``on_jit_loop``),
    the replay ahead at every N >= 10; defaults' `jit_changing` 1.03x (over 1.02x) and `kernel.launch` +1.5 us."""
    results = synthetic_quick()
    procs = results["processes"]
    procs["on"]["modes"]["jit_loop"]["by_n"]["100"]["samples"] = [on_jit_loop] * 2
    procs["on"]["modes"]["mixed"]["by_n"]["10"]["samples"] = [2.0] * 2
    return procs


@pytest.fixture
def three_runs(tmp_path, monkeypatch):
    """``run.py --quick --runs 3`` with on's `jit_loop` 1.01x, 1.07x, 1.02x in runs 1, 2, 3; its output dir."""
    per_run = iter([quick_records(1.01)] * 4 + [quick_records(1.07)] * 4 + [quick_records(1.02)] * 4)
    calls = []

    def worker(setting, cfg, tmp, timeout_s):
        calls.append(setting.key)
        return copy.deepcopy(next(per_run)[setting.key])

    monkeypatch.setattr(run, "run_worker", worker)
    monkeypatch.setenv("JAXGRAPH_GIT", "r123456")
    code = run.main(["--quick", "--runs", "3", "--out", str(tmp_path), "--no-plot", "--settings", "nojax,off,on,defaults"])
    assert code == 0 and calls == ["nojax", "off", "on", "defaults"] * 3  # each run its own workers
    return tmp_path


def test_each_run_is_written_with_its_provenance_and_the_last_under_the_plain_name(three_runs):
    stem = f"{SLUG}-quick"
    names = [f"{stem}-run{i}.json" for i in (1, 2, 3)]
    assert consecutive_runs.file_names(stem, 3) == names and consecutive_runs.file_names(stem, 1) == [f"{stem}.json"]
    docs = [json.loads((three_runs / n).read_text()) for n in names]
    group = docs[0]["runs"]["group"]
    for i, doc in enumerate(docs, 1):
        assert doc["runs"] == {"index": i, "of": 3, "group": group, "stem": stem, "files": names}
        assert doc["git"] == "r123456" and doc["git_from"] == "JAXGRAPH_GIT" and doc["date"] and doc["wall_s"] >= 0
        assert doc["command"] == "python benchmarks/run.py --quick --runs 3 --out " + str(three_runs) + \
            " --no-plot --settings nojax,off,on,defaults"
        assert doc["xla_flags_by_setting"] == {k: config.SETTINGS[k].xla_flags for k in ("nojax", "off", "on", "defaults")}
        assert doc["processes"]["on"]["xla_flags"] == config.SETTINGS["on"].xla_flags
        md = (three_runs / f"{stem}-run{i}.md").read_text()
        assert md == run_report.markdown(doc) and f"run {i} of 3 (`{stem}-runs.md`)" in md
    assert docs[1]["processes"]["on"]["modes"]["jit_loop"]["by_n"]["100"]["ratio"] == pytest.approx(1.07)
    assert (three_runs / f"{stem}.json").read_text() == (three_runs / names[2]).read_text()
    assert not (three_runs / f"{stem}-run1.png").exists()


def test_the_runs_table_puts_each_figure_side_by_side(three_runs):
    text = (three_runs / f"{SLUG}-quick-runs.md").read_text()
    assert text.startswith("# NVIDIA H100 80GB HBM3: 3 consecutive quick runs side by side")
    assert f"| 2 | [`{SLUG}-quick-run2.json`]({SLUG}-quick-run2.json) |" in text and "| r123456 |" in text
    assert text.count(" | none |") == 3  # no failed process, no errors
    assert "| on jit_loop N=100 | 1.010x | 1.070x | 1.020x | 2 of 3 (missed in run 2) |" in text
    assert "| off N=10 fixed | 1.50x | 1.50x | 1.50x | 3 of 3 |" in text
    assert "| `kernel.launch(...)` | +1.50 us | +1.50 us | +1.50 us | 0 of 3 (missed in runs 1, 2 and 3) |" in text
    (three_runs / f"{SLUG}-quick-runs.md").unlink()
    assert consecutive_runs.main(["--out", str(three_runs), "--stem", f"{SLUG}-quick"]) == 0  # again from the JSON
    assert (three_runs / f"{SLUG}-quick-runs.md").read_text() == text


def test_issue_19_judges_every_run_and_names_the_one_that_missed(three_runs):
    text = (three_runs / f"{SLUG}-targets.md").read_text()
    for i in (1, 2, 3):
        assert f"- quick run {i} of 3: [`{SLUG}-quick-run{i}.json`]({SLUG}-quick-run{i}.json)" in text
    rows = table(text, "## Issue 19")
    label = (f"quick run, 3 runs, 3 rounds of 25 ms samples: run 1 [`{SLUG}-quick-run1.json`]({SLUG}-quick-run1.json) "
             f"at r123456, run 2 [`{SLUG}-quick-run2.json`]({SLUG}-quick-run2.json) at r123456, "
             f"run 3 [`{SLUG}-quick-run3.json`]({SLUG}-quick-run3.json) at r123456")
    measured, verdict = rows[T[0], label]  # holds in 2 of 3: missed, the run named
    assert measured.startswith("ratio to the floor, runs 1, 2 and 3: off jit_loop N=100 1.040x, 1.040x, 1.040x;")
    assert "on jit_loop N=100 1.010x, 1.070x, 1.020x" in measured
    assert verdict == "missed in run 2 at on jit_loop N=100 (1.070x); met in runs 1 and 3"
    assert rows[T[1], label][1] == "missed in runs 1, 2 and 3 at defaults jit_changing N=100 (1.030x, 1.030x, 1.030x)"
    measured, verdict = rows[T[2], label]
    assert verdict == "met in 3 of 3 runs" and "on N=10 fixed 1.50x, 1.50x, 1.50x" in measured
    assert rows[T[4], label][0].startswith("each form's us per launch over cuda.core's, runs 1, 2 and 3: "
                                           "`kernel[grid, block, 0, s]` bound +0.50 us, +0.50 us, +0.50 us")
    assert rows[T[3], "gray_scott bench"] == ("not measured", "not measured")


def test_a_missing_or_foreign_run_is_not_measured(three_runs):
    stem = f"{SLUG}-quick"
    other = json.loads((three_runs / f"{stem}-run1.json").read_text())
    other["runs"]["group"] = "another invocation"
    (three_runs / f"{stem}-run1.json").write_text(json.dumps(other))
    (three_runs / f"{stem}-run2.json").unlink()
    found, names = consecutive_runs.load(three_runs, f"{stem}.json")
    assert names == [f"{stem}-run{i}.json" for i in (1, 2, 3)] and found[:2] == [None, None] and found[2]["runs"]["index"] == 3
    text = targets.write(three_runs, SLUG).read_text()
    assert f"- quick run 2 of 3: `{stem}-run2.json` not found" in text
    rows = {target: cells for (target, run_label), cells in table(text, "## Issue 19").items()
            if run_label.startswith("quick run, 3 runs")}
    assert rows[T[2]] == ("replay ahead by (`jax_call`s' time over replay's), runs 1, 2 and 3: "
                          + "; ".join(f"{k} N={n} {i} –, –, 1.50x" for k in ("off", "on", "defaults")
                                      for n in ("10", "100") for i in ("fixed", "rotating")),
                          "met in run 3; not measured in runs 1 and 2")
    assert consecutive_runs.load(three_runs, "nowhere.json") == (None, "nowhere.json")


def test_a_single_run_is_judged_alone_and_never_joins_an_old_group(three_runs, monkeypatch):
    monkeypatch.setattr(run, "run_worker", lambda setting, cfg, tmp, timeout_s: quick_records(1.07)[setting.key])
    assert run.main(["--quick", "--out", str(three_runs), "--no-plot", "--settings", "nojax,off,on,defaults"]) == 0
    single = json.loads((three_runs / f"{SLUG}-quick.json").read_text())
    assert "runs" not in single and (three_runs / f"{SLUG}-quick-run1.json").exists()  # left over, not judged
    assert consecutive_runs.load(three_runs, f"{SLUG}-quick.json") == (single, f"{SLUG}-quick.json")
    rows = table((three_runs / f"{SLUG}-targets.md").read_text(), "## Issue 19")
    assert rows[T[0], "quick run at r123456, 3 rounds of 25 ms samples"][1] == \
        "missed at on jit_loop N=100 (1.070x); met at the other 5"
    assert consecutive_runs.main(["--out", str(three_runs), "--stem", f"{SLUG}-quick"]) == 1  # no group to put side by side


def test_a_group_of_full_runs_judges_issue_8_on_the_last():
    first, last = synthetic_quick(), synthetic_quick()
    last["git"] = "last123"
    text = targets.markdown({"full": [first, None, last]}, {"full": ["a-run1.json", "a-run2.json", "a-run3.json"]})
    assert "- full run: [`a-run3.json`](a-run3.json), `python benchmarks/run.py --quick`, " in text
    assert "- full run 2 of 3: `a-run2.json` not found" in text and "commit last123" in text


@pytest.mark.parametrize("argv, error", [(["--runs", "0"], "--runs must be >= 1"),
                                         (["--scale", "--runs", "2"], "--scale is one run")])
def test_bad_runs_arguments_are_refused(argv, error, capsys):
    with pytest.raises(SystemExit):
        run.parse_args(argv)
    assert error in capsys.readouterr().err


def test_places_missed_are_grouped_by_the_runs_that_missed_them():
    def quick(on_jit_loop, defaults_changing):
        results = synthetic_quick()
        for key, mode, value in (("on", "jit_loop", on_jit_loop), ("defaults", "jit_changing", defaults_changing)):
            results["processes"][key]["modes"][mode]["by_n"]["100"]["ratio"] = value
        return results

    group = [quick(1.01, 1.06), quick(1.07, 1.08), None, quick(1.02, 1.04)]
    rows = {(t, r[:9]): (m, v) for t, r, m, v in targets_over_runs.rows({"quick": group}, {"quick": list("abcd")})}
    measured, verdict = rows[T[0], "quick run"]
    assert "on jit_loop N=100 1.010x, 1.070x, –, 1.020x" in measured and measured.startswith("ratio to the floor, runs 1, 2, 3 and 4")
    assert verdict == ("missed in run 2 at on jit_loop N=100 (1.070x); missed in runs 1 and 2 at defaults "
                       "jit_changing N=100 (1.060x, 1.080x); met in run 4; not measured in run 3")
    run_label = next(r for t, r, _, _ in targets_over_runs.rows({"quick": group}, {"quick": list("abcd")}) if t == T[0])
    assert run_label.endswith("run 2 [`b`](b) at q123456, run 3 [`c`](c) not found, run 4 [`d`](d) at q123456")


def test_a_place_one_run_lacks_is_never_called_met():
    full, partial = synthetic_quick(), synthetic_quick()
    del partial["processes"]["off"]["modes"]["mixed_changing"]["by_n"]["100"]  # that mode failed at N=100 in run 2
    rows = {(t, r[:9]): (m, v) for t, r, m, v in targets_over_runs.rows({"quick": [full, partial, full]})}
    measured, verdict = rows[T[2], "quick run"]
    assert "off N=100 rotating 1.50x, –, 1.50x" in measured
    assert verdict == ("missed in runs 1, 2 and 3 at on N=10 fixed (0.67x, 0.67x, 0.67x); "
                       "not measured in run 2 at off N=100 rotating")
    for r in (full, partial):  # no miss left but the gap
        r["processes"]["on"]["modes"]["mixed"]["by_n"]["10"]["stats"]["median"] = 2.0
    rows = {(t, r[:9]): (m, v) for t, r, m, v in targets_over_runs.rows({"quick": [full, partial, full]})}
    assert rows[T[2], "quick run"][1] == "met in runs 1 and 3; not measured in run 2 at off N=100 rotating"


# A worker that records its groups as it goes (vs_idiomatic.py's), then hangs or fails: the driver keeps them.
PARTIAL_WORKER = """
import json, sys, time
path = sys.argv[sys.argv.index("--json") + 1]
json.dump({"setting": "on", "partial": True, "groups": {"gray_scott/64": {"modes": {}}}}, open(path, "w"))
print("measured gray_scott/64", flush=True)
if sys.argv[1] == "hang":
    time.sleep(60)
sys.exit(3)
"""


@pytest.mark.parametrize("how, why", [("hang", "timed out after 2 s"), ("fail", "exit code 3")])
def test_a_stopped_worker_keeps_the_groups_it_recorded(tmp_path, how, why):
    record = run.run_worker(config.SETTINGS["on"], None, tmp_path, 2.0, [sys.executable, "-c", PARTIAL_WORKER, how])
    assert record["failed"] == f"{why}; the groups measured before are kept", record
    assert list(record["groups"]) == ["gray_scott/64"] and "measured gray_scott/64" in record["output_tail"]


def test_a_stopped_worker_without_a_record_is_a_failure(tmp_path):
    record = run.run_worker(config.SETTINGS["off"], None, tmp_path, 2.0,
                            [sys.executable, "-c", "import time; time.sleep(60)"])
    assert record["failed"] == "timed out after 2 s" and "groups" not in record
