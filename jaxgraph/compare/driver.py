"""The parent's side: one worker process per setting, rounds interleaved across them, timeouts.

All workers start at once (each imports JAX with its own ``XLA_FLAGS``), then
the rounds go round-robin: in round r every setting times every function once,
the settings' order rotated by r, one request at a time, so only one process
runs while another is timed and slow drifts of the machine fall on every
setting alike. A worker that dies or does not answer within the timeout is
stopped and reported for its setting; the others go on. This module never
imports JAX.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .settings import Setting

__all__ = ["Worker", "WorkerGone", "run_workers"]


class WorkerGone(Exception):
    """A worker exited (``kind`` "WorkerExited") or timed out ("Timeout"); the message says what it was doing."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Worker:
    """One worker process and its two pipes."""

    def __init__(self, setting: Setting, spec: str, kwargs: dict, tmp: Path, count_command_buffers: bool,
                 extra_flags: str):
        self.setting = setting
        self.outputs = tmp / f"{setting.name}.pkl"
        self.log_path = tmp / f"{setting.name}.log"
        self.dump_dir = tmp / f"dump-{setting.name}" if count_command_buffers else None
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        flags = " ".join(f for f in (setting.xla_flags, extra_flags,
                                     f"--xla_dump_to={self.dump_dir}" if self.dump_dir else "") if f)
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)
        if setting.xla_flags is not None or flags:
            env["XLA_FLAGS"] = flags  # JAX's defaults plus only the dump: the dump changes no compilation
        env["JAXGRAPH_COMPARE_SETTING"] = setting.name
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # every setting's process shares the device
        env["PYTHONUNBUFFERED"] = "1"
        command = [sys.executable, "-m", "jaxgraph.compare.worker", "--factory", spec, "--kwargs",
                   json.dumps(kwargs), "--requests-fd", str(req_r), "--replies-fd", str(rep_w),
                   "--outputs", str(self.outputs)]
        if self.dump_dir:
            command += ["--dump-dir", str(self.dump_dir)]
        self.xla_flags = env.get("XLA_FLAGS")
        self.started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, pass_fds=(req_r, rep_w),
                                         start_new_session=True)  # its own group: a timeout stops its children too
        os.close(req_r)
        os.close(rep_w)
        self._buffer = b""
        self.gone: str | None = None

    def receive(self, timeout_s: float, what: str, deadline: float | None = None) -> dict:
        """The next reply, or :class:`WorkerGone` after ``timeout_s`` (or at ``deadline``) or when the process ends."""
        deadline = time.monotonic() + timeout_s if deadline is None else deadline
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready = select.select([self._rep_r], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                self.gone = f"no answer within the timeout of {timeout_s:g} s {what}; the worker was stopped"
                self.stop()
                raise WorkerGone("Timeout", self.gone)
            chunk = os.read(self._rep_r, 1 << 16)
            if not chunk:
                self._exited(what)
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def request(self, message: dict, timeout_s: float, what: str) -> dict:
        if self.gone:
            raise WorkerGone("WorkerExited", self.gone)
        try:
            os.write(self._req_w, (json.dumps(message) + "\n").encode())
        except BrokenPipeError:
            self._exited(what)
        return self.receive(timeout_s, what)

    def _exited(self, what: str) -> None:
        code = self.proc.wait()
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        self.gone = f"the worker process {how} {what}; its last output: {self.log_tail(1) or 'none'}"
        raise WorkerGone("WorkerExited", self.gone)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines the worker printed (its own and the user's code's output)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(line for line in text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        """End the worker (and anything it started): quit if it listens, else SIGKILL its group."""
        if self.proc.poll() is None and not self.gone:
            try:
                os.write(self._req_w, b'{"op": "quit"}\n')
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        for fd in (self._req_w, self._rep_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._req_w = self._rep_r = -1


def run_workers(spec: str, kwargs: dict, settings: list[Setting], rounds: int, target_s: float, max_calls: int,
                timeout_s: float, count_command_buffers: bool, extra_flags: str, tmp: Path,
                log: Callable[[str], None]) -> dict[str, Any]:
    """Start, time and stop the workers. Returns the raw record the :class:`~jaxgraph.compare.Result` reads."""
    workers = [Worker(s, spec, kwargs, tmp, count_command_buffers, extra_flags) for s in settings]
    log(f"started {len(workers)} worker processes ({', '.join(s.name for s in settings)}): importing the factory "
        "and compiling")
    procs: dict[str, dict] = {}
    calls: dict[str, int] = {}
    try:
        for w in workers:
            procs[w.setting.name] = rec = {"xla_flags": w.xla_flags, "pid": w.proc.pid, "samples": {}, "errors": {}}
            try:  # the workers start together: each has timeout_s from its start
                reply = w.receive(timeout_s, "while starting (import, factory, compilation, first calls)",
                                  deadline=w.started + timeout_s)
            except WorkerGone as exc:
                rec["failed"] = {"stage": "start", "error": {"type": exc.kind, "message": str(exc),
                                                             "traceback": w.log_tail()}}
                continue
            if reply["op"] == "failed":
                rec["failed"] = {"stage": reply["stage"], "error": reply["error"]}
                w.stop()
                continue
            rec.update({k: reply[k] for k in ("backend", "jax_version", "devices", "cases")})
            rec["outputs_file"] = str(w.outputs)
            log(f"[{w.setting.name}] ready after {time.monotonic() - w.started:.1f} s: "
                + ", ".join(f"{label} " + ("ok" if c["ok"] else f"failed ({c['error']['type']})")
                            for label, c in reply["cases"].items()))
        calls = _calls_per_sample(procs, target_s, max_calls)
        for r in range(rounds):
            order = workers[r % len(workers):] + workers[:r % len(workers)]
            for w in order:
                rec = procs[w.setting.name]
                for label in calls:
                    if not rec.get("cases", {}).get(label, {}).get("ok") or label in rec["errors"] or w.gone:
                        continue
                    try:
                        reply = w.request({"op": "time", "label": label, "calls": calls[label]}, timeout_s,
                                          f"timing {label} (round {r + 1})")
                    except WorkerGone as exc:
                        rec["failed"] = {"stage": f"round {r + 1}", "error": {
                            "type": exc.kind, "message": str(exc), "traceback": w.log_tail()}}
                        break
                    if "error" in reply:
                        rec["errors"][label] = {"stage": f"round {r + 1}", "error": reply["error"]}
                    else:
                        rec["samples"].setdefault(label, []).append(reply["seconds"])
            log(f"round {r + 1}/{rounds} done")
    finally:
        for w in workers:
            w.stop()
            procs[w.setting.name]["log_tail"] = w.log_tail()
    return {"processes": procs, "calls_per_sample": calls}


def _calls_per_sample(procs: dict[str, dict], target_s: float, max_calls: int) -> dict[str, int]:
    """Per function, the same number of calls a sample in every setting: ``target_s`` at the median warm time."""
    warm: dict[str, list[float]] = {}
    for rec in procs.values():
        for label, case in rec.get("cases", {}).items():
            warm.setdefault(label, [])
            if case["ok"]:
                warm[label].append(case["warm_seconds"])
    return {label: max(1, min(max_calls, math.ceil(target_s / max(statistics.median(ts), 1e-9)))) if ts else 1
            for label, ts in warm.items()}
