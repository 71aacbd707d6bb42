"""What a comparison found: :class:`Result`, its table (``str(result)``), its JSON and its checks.

Built from the workers' raw records (``driver.py``) and the results they saved;
nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import statistics
from typing import Any

from .agreement import Mismatch, compare_results
from .settings import Setting

__all__ = ["Failure", "Result", "Timing", "build_result"]

NO_GPU = "n/a (no GPU)"


@dataclasses.dataclass(frozen=True)
class Timing:
    """One function under one setting: seconds per call, one sample a round.

    Attributes
    ----------
    samples : tuple of float
        Seconds per call of each round's sample (in round order).
    calls : int
        Back-to-back calls in a sample.
    median, low, high : float
        Median, fastest and slowest sample.
    ratio : float
        ``median`` over the best setting's median for this function (1.0 for the best).
    """

    samples: tuple[float, ...]
    calls: int
    median: float
    low: float
    high: float
    ratio: float


@dataclasses.dataclass(frozen=True)
class Failure:
    """Something that stopped a setting (``label`` None: the whole process) or one function in it.

    Attributes
    ----------
    setting, label : str
        Where: ``label`` is ``None`` when the worker as a whole failed (the
        factory's import or call, a crash, a timeout).
    stage : str
        When: ``"import"``, ``"factory"``, ``"start"``, ``"first call"`` or ``"round N"``.
    type, message, traceback : str
        The exception's type and message, and its traceback (or the worker's last output).
    """

    setting: str
    label: str | None
    stage: str
    type: str
    message: str
    traceback: str = ""

    def summary(self, width: int | None = None) -> str:
        """``"Type: message"`` on one line, cut at ``width`` characters."""
        text = f"{self.type}: {' '.join(self.message.split())}" if self.message else self.type
        return text if width is None or len(text) <= width else text[: width - 3] + "..."


@dataclasses.dataclass
class Result:
    """A comparison of one factory's functions under several XLA settings.

    ``str(result)`` is the table the command line prints; :meth:`to_json` the
    data; :attr:`ok` says whether everything ran and agreed.

    Attributes
    ----------
    factory : str
        The factory, as given (a function: its ``module:name``).
    settings : tuple of Setting
        The settings, in the order given.
    labels : tuple of str
        The functions the factory returned.
    rounds : int
        Interleaved rounds asked for.
    rtol, atol : float
        The agreement tolerance (``np.allclose``).
    backend, devices, jax_version : str, list of str, str
        What the workers ran on (from the first that started).
    xla_flags : dict of str to (str or None)
        The exact ``XLA_FLAGS`` each setting's worker had (the dump flag included).
    timings : dict of str to dict of str to Timing
        ``timings[label][setting]``, for every pair that was timed.
    command_buffers : dict of str to dict of str to (int or None)
        How many command buffers XLA made for the function, from its optimized
        HLO as XLA dumped it (``None``: not known; see :attr:`command_buffers_from`).
    command_buffers_from : dict of str to dict of str to str
        Where each count came from.
    reference : dict of str to str
        Per function, the setting the others are compared with (the first that produced a result).
    compared : dict of str to list of str
        Per function, the settings whose results were compared (the reference first).
    mismatches : dict of str to dict of str to Mismatch
        ``mismatches[label][setting]``: where that setting's result differs from the reference's.
    failures : list of Failure
        Everything that failed, per setting (and function).
    calls_per_sample : dict of str to int
        Back-to-back calls in one sample, per function (the same in every setting).
    pids : dict of str to int
        Each setting's worker process id (all have ended when :func:`~jaxgraph.compare.run` returns).
    compare_functions : bool
        Whether the functions were also compared with each other.
    function_mismatches : dict of str to Mismatch
        With :attr:`compare_functions`: per function, where its result differs from the first
        function's, both under the first setting that ran both.
    function_reference : str or None
        That setting.
    replaced_xla_flags : str or None
        ``XLA_FLAGS`` of the calling process's environment, which every worker went without.
    """

    factory: str
    settings: tuple[Setting, ...]
    labels: tuple[str, ...]
    rounds: int
    rtol: float
    atol: float
    backend: str | None = None
    devices: list[str] = dataclasses.field(default_factory=list)
    jax_version: str | None = None
    xla_flags: dict[str, str | None] = dataclasses.field(default_factory=dict)
    timings: dict[str, dict[str, Timing]] = dataclasses.field(default_factory=dict)
    command_buffers: dict[str, dict[str, int | None]] = dataclasses.field(default_factory=dict)
    command_buffers_from: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    reference: dict[str, str] = dataclasses.field(default_factory=dict)
    compared: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    mismatches: dict[str, dict[str, Mismatch]] = dataclasses.field(default_factory=dict)
    failures: list[Failure] = dataclasses.field(default_factory=list)
    calls_per_sample: dict[str, int] = dataclasses.field(default_factory=dict)
    pids: dict[str, int] = dataclasses.field(default_factory=dict)
    compare_functions: bool = False
    function_mismatches: dict[str, Mismatch] = dataclasses.field(default_factory=dict)
    function_reference: str | None = None
    replaced_xla_flags: str | None = None

    @property
    def ok(self) -> bool:
        """Every function ran under every setting, was timed every round, and the results agree."""
        return (bool(self.labels) and not self.failures and not any(self.mismatches.values())
                and not self.function_mismatches
                and all(len(self.timings.get(lb, {})) == len(self.settings) for lb in self.labels))

    def failure(self, setting: str, label: str | None = None) -> Failure | None:
        """What stopped ``label`` under ``setting`` (a whole-process failure counts), or ``None``."""
        for f in self.failures:
            if f.setting == setting and f.label == label:
                return f
        if label is not None:
            return self.failure(setting, None)
        return None

    def __str__(self) -> str:
        return self.table()

    def table(self, verbose: bool = False) -> str:
        """The report: a table per function, the settings' flags, agreement, failures."""
        from .table import render

        return render(self, verbose)

    def to_dict(self) -> dict[str, Any]:
        """The data as JSON-ready Python objects."""
        d = dataclasses.asdict(self)
        d["settings"] = [dataclasses.asdict(s) for s in self.settings]
        d["mismatches"] = {lb: {s: {**dataclasses.asdict(m), "message": str(m)} for s, m in by.items()}
                           for lb, by in self.mismatches.items()}
        d["function_mismatches"] = {lb: {**dataclasses.asdict(m), "message": str(m)}
                                    for lb, m in self.function_mismatches.items()}
        d["ok"] = self.ok
        return _json_ready(d)

    def to_json(self, indent: int | None = 1) -> str:
        """:meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent)

    def plot(self, path: str) -> None:
        """Write a PNG of the medians and ranges (needs matplotlib; see :func:`jaxgraph.compare.plot.write_png`)."""
        from .plot import write_png

        write_png(self, path)


def build_result(raw: dict, factory: str, settings: list[Setting], rounds: int, rtol: float,
                 atol: float, compare_functions: bool = False) -> Result:
    """The :class:`Result` of the driver's raw record: statistics, agreement, failures."""
    procs = raw["processes"]
    labels: list[str] = []
    for rec in procs.values():
        labels += [lb for lb in rec.get("cases", {}) if lb not in labels]
    res = Result(factory, tuple(settings), tuple(labels), rounds, rtol, atol,
                 calls_per_sample=dict(raw.get("calls_per_sample", {})), compare_functions=compare_functions)
    started = [rec for rec in procs.values() if "backend" in rec]
    if started:
        res.backend, res.devices, res.jax_version = (started[0]["backend"], started[0]["devices"],
                                                     started[0]["jax_version"])
    for s in settings:
        rec = procs.get(s.name, {})
        res.xla_flags[s.name] = rec.get("xla_flags")
        if "pid" in rec:
            res.pids[s.name] = rec["pid"]
        if "failed" in rec:
            err = rec["failed"]["error"]
            res.failures.append(Failure(s.name, None, rec["failed"]["stage"], err["type"], err["message"],
                                        err.get("traceback", "")))
        for label, case in rec.get("cases", {}).items():
            if not case["ok"]:
                err = case["error"]
                res.failures.append(Failure(s.name, label, case["stage"], err["type"], err["message"],
                                            err.get("traceback", "")))
                continue
            res.command_buffers.setdefault(label, {})[s.name] = case.get("command_buffers")
            res.command_buffers_from.setdefault(label, {})[s.name] = case.get("command_buffers_from", "")
        for label, e in rec.get("errors", {}).items():
            res.failures.append(Failure(s.name, label, e["stage"], e["error"]["type"], e["error"]["message"],
                                        e["error"].get("traceback", "")))
    _timings(res, procs)
    _agreement(res, procs)
    return res


def _timings(res: Result, procs: dict) -> None:
    for label in res.labels:
        stats = {}
        for s in res.settings:
            samples = procs.get(s.name, {}).get("samples", {}).get(label)
            if samples:
                stats[s.name] = (tuple(samples), statistics.median(samples), min(samples), max(samples))
        if not stats:
            continue
        best = min(m for _, m, _, _ in stats.values())
        res.timings[label] = {name: Timing(samples, res.calls_per_sample.get(label, 1), m, lo, hi,
                                           m / best if best > 0 else float("nan"))
                              for name, (samples, m, lo, hi) in stats.items()}


def _agreement(res: Result, procs: dict) -> None:
    outputs: dict[str, dict] = {}
    for s in res.settings:
        path = procs.get(s.name, {}).get("outputs_file")
        if path:
            with open(path, "rb") as f:
                outputs[s.name] = pickle.load(f)  # written by our own worker, in our own temp dir
    for label in res.labels:
        have = [s.name for s in res.settings if label in outputs.get(s.name, {})]
        if not have:
            continue
        ref = res.reference[label] = have[0]
        res.compared[label] = have
        res.mismatches[label] = {}
        for name in have[1:]:
            m = compare_results(outputs[name][label], outputs[ref][label], res.rtol, res.atol)
            if m is not None:
                res.mismatches[label][name] = m
    if res.compare_functions and len(res.labels) > 1:
        # The settings are compared above, so one setting that ran every function suffices.
        first = res.labels[0]
        both = [s.name for s in res.settings if first in outputs.get(s.name, {})]
        if both:
            where = res.function_reference = both[0]
            for label in res.labels[1:]:
                if label in outputs[where]:
                    m = compare_results(outputs[where][label], outputs[where][first], res.rtol, res.atol)
                    if m is not None:
                        res.function_mismatches[label] = m


def _json_ready(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_ready(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, float) and x in (float("inf"), float("-inf")):
        return str(x)  # JSON has no infinity
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "item"):  # numpy scalars
        return _json_ready(x.item())
    return repr(x)
