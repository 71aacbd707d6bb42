"""Consecutive harness runs (``run.py --runs K``): their file names, their group, and side by side.

Issue 19 asks for its ratios to hold in three consecutive runs on one
machine. ``python benchmarks/run.py --runs 3`` runs the whole harness three
times back to back (each run its own worker processes) and writes, besides
what one run writes:

- ``<stem>-run1.json`` ... ``<stem>-runK.json`` and ``.md``: each run, as one
  run writes them (``<stem>`` is ``<device>``, ``<device>-quick`` or
  ``<device>-loops``); each carries a ``runs`` record (:func:`record`): its index,
  K, the group (the invocation's start) and the K file names;
- ``<stem>.json``, ``.md`` and ``.png``: the last run again, under the name every
  single-run reader knows (the plot, issue 8's targets, the README's tables);
- ``<stem>-runs.md`` (:func:`markdown`): each of issue 19's harness figures in every
  run side by side, whether it held in each, and each run's file, date, commit and
  wall time.

:func:`load` reads a results file back with its group: the runs its ``runs``
record names that belong to the same invocation (``targets.py`` judges issue
19's harness targets on all of them). With ``--runs 1`` (the default) nothing
changes: one ``<stem>.json``, no ``runs`` record, judged alone. Pure apart
from :func:`load` and :func:`main` (``python benchmarks/reports/consecutive_runs.py`` writes
``<stem>-runs.md`` again from the JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.reports import targets_over_runs, verdicts  # noqa: E402

__all__ = ["file_names", "load", "main", "markdown", "record"]


def file_names(stem: str, of: int) -> list[str]:
    """The JSON file of each run of a group of ``of``: ``<stem>-run1.json`` ...; one run: ``<stem>.json``."""
    return [f"{stem}.json"] if of == 1 else [f"{stem}-run{i}.json" for i in range(1, of + 1)]


def record(index: int, of: int, group: str, stem: str) -> dict:
    """The ``runs`` record of run ``index`` (from 1) of ``of``: which group it belongs to (``group``: the
    first run's start), the files' ``stem`` and every run's JSON file."""
    return {"index": index, "of": of, "group": group, "stem": stem, "files": file_names(stem, of)}


def load(out_dir: Path, name: str) -> tuple[dict | list | None, str | list[str]]:
    """A results file and its name, or its whole group of runs and their names.

    Returns ``(None, name)`` when the file is missing, ``(results, name)`` for a single
    run, and ``(runs, names)`` (lists) when the file is one of a group of several: each
    run ``None`` where its file is missing or was written by another invocation.
    """
    path = out_dir / name
    if not path.exists():
        return None, name
    results = json.loads(path.read_text())
    group = results.get("runs") or {}
    if group.get("of", 1) <= 1 or not group.get("files"):
        return results, name
    found = []
    for file in group["files"]:
        sibling = out_dir / file
        run = json.loads(sibling.read_text()) if sibling.exists() else None
        found.append(run if run and (run.get("runs") or {}).get("group") == group.get("group") else None)
    return found, list(group["files"])


def markdown(runs: list[dict | None], names: list[str]) -> str:
    """``<stem>-runs.md``: the runs (file, date, commit, wall time), then each harness target's figures
    in every run side by side (``targets_over_runs.harness_figures``) and in how many runs each held."""
    first = next((r for r in runs if r), {})
    device = (first.get("device") or {}).get("name", "unknown device")
    kind = "quick runs" if first.get("quick") else "loop runs" if first.get("config", {}).get("loops") else "full runs"
    lines = [f"# {device}: {len(runs)} consecutive {kind} side by side", "",
             f"Generated from the JSON by `{first.get('command', 'python benchmarks/run.py')}` "
             "(again: `python benchmarks/reports/consecutive_runs.py`); every figure is the run's own (ratios to its own processes' "
             "floors), each place judged against issue 19's target in each run.", "",
             "| run | file | date | commit | wall s | failures and errors (the run's markdown) |", "| ---: | --- | --- | --- | ---: | --- |"]
    for i, (r, name) in enumerate(zip(runs, names), 1):
        if r is None:
            lines.append(f"| {i} | `{name}` not found | | | | |")
            continue
        failed = [f"{k} failed ({why})" for k, why in (r.get("failures") or {}).items()]
        failed += [f"{k}: {len(proc['errors'])} error(s)" for k, proc in r.get("processes", {}).items()
                   if proc.get("errors") and k not in r.get("failures", {})]
        failed = ", ".join(failed) or "none"
        lines.append(f"| {i} | [`{name}`]({name}) | {r.get('date', '?')} | {r.get('git') or '?'} | "
                     f"{r.get('wall_s', '?')} | {failed} |")
    figures = [targets_over_runs.harness_figures(r) if r else None for r in runs]
    for target in targets_over_runs.HARNESS_TARGETS:
        per_run = [f[target] if f else None for f in figures]
        places = list(dict.fromkeys(w for f in per_run if f for w in f.how))
        lines += ["", f"## {target}", ""]
        if not places:
            lines.append("Not measured in any run.")
            continue
        label = next(f.label for f in per_run if f)
        lines += [f"{label[0].upper()}{label[1:]}.", "",
                  "| place | " + " | ".join(f"run {i}" for i in range(1, len(runs) + 1)) + " | held in |",
                  "| --- |" + " ---: |" * len(runs) + " --- |"]
        for place in places:
            cells = [f.how.get(place, "–") if f else "–" for f in per_run]
            judged = {i: f.ok[place] for i, f in enumerate(per_run, 1) if f and place in f.ok}
            missed = [i for i, good in judged.items() if not good]
            unmeasured = [i for i in range(1, len(runs) + 1) if i not in judged]
            notes = ([f"missed in {verdicts.runs_words(missed)}"] if missed else []) + (
                [f"not measured in {verdicts.runs_words(unmeasured)}"] if unmeasured else [])
            held = f"{sum(judged.values())} of {len(runs)}" + (f" ({', '.join(notes)})" if notes else "")
            lines.append(f"| {place} | " + " | ".join(cells) + f" | {held} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/reports/consecutive_runs.py", description="<stem>-runs.md again from a group's JSON")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    p.add_argument("--stem", default="nvidia-h100-80gb-hbm3",
                   help="the runs' file-name stem: <device>, <device>-quick or <device>-loops")
    args = p.parse_args(argv)
    runs, names = load(args.out, f"{args.stem}.json")
    if not isinstance(runs, list):
        print(f"{args.out / (args.stem + '.json')} is " + ("missing" if runs is None else "a single run")
              + ": no group of runs to put side by side")
        return 1
    path = args.out / f"{args.stem}-runs.md"
    path.write_text(markdown(runs, names))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
