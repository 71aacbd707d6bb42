"""One worker process: the factory's functions under one XLA setting, timed on request.

The parent (``driver.py``) starts it with the setting's ``XLA_FLAGS`` in its
environment (XLA reads them once, when its backend starts) and talks to it over
two pipes, one JSON object a line; the user's code may print freely to stdout.

1. Start-up: import the factory, call it, and for each case compile it (with
   ``--xla_dump_to`` in the flags, the optimized HLO XLA dumps for it gives the
   command-buffer count), run it once (its results, saved for the agreement
   check) and once more, timed (how many calls a sample needs). Reply ``ready``,
   or ``failed`` when the factory cannot be imported or called.
2. ``{"op": "time", "label": ..., "calls": n}``: one sample, ``n`` calls back to
   back on the same arguments, then ``block_until_ready``; reply the seconds per call.
3. ``{"op": "quit"}``.

    python -m jaxgraph.compare.worker --factory mod:make_case --requests-fd 5 --replies-fd 6 \
        --outputs /tmp/x/on.pkl [--dump-dir /tmp/x/dump-on] [--kwargs '{"n": 10}']
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import sys
import time
import traceback
from typing import Any

from .cases import load_factory, normalize_cases

__all__ = ["StartError", "count_command_buffer_thunks", "count_command_buffers", "main"]

# XLA's command-buffer pass (CommandBufferScheduling) outlines each command buffer into a
# computation named "command_buffer" (made unique: command_buffer.1, ...) that the schedule
# calls; the optimized HLO has one such computation per command buffer.
_COMMAND_BUFFER = re.compile(r"^\s*%?command_buffer[\w.]*\s*\(", re.M)
# The dump's name for it: module_0004.jit_step.cpu_after_optimizations.txt (on a GPU with the
# device in it: ...jit_step.sm_9.0_gpu_after_optimizations.txt).
_DUMPED_MODULE = re.compile(r"^module_\d+\.(?P<rest>.+)_after_optimizations\.txt$")
# Newer XLA (jax 0.11's, seen on an H200) forms command buffers from the thunk sequence instead, after
# the HLO passes: the optimized HLO has none, and the thunks after XLA's thunk passes list each one as
# "000: kCommandBuffer ..." (nested under a while's or conditional's thunk too), in
# module_0004.jit_step.thunk_sequence_after_thunk_passes.txt.
_COMMAND_BUFFER_THUNK = re.compile(r"^\s*\d+:\s*kCommandBuffer\b", re.M)
_DUMPED_THUNKS = re.compile(r"^module_\d+\.(?P<module>.+)\.thunk_sequence_after_thunk_passes\.txt$")


def count_command_buffers(hlo_text: str) -> int:
    """How many command buffers an optimized HLO module holds (its ``command_buffer`` computations)."""
    return len(_COMMAND_BUFFER.findall(hlo_text))


def count_command_buffer_thunks(thunks_text: str) -> int:
    """How many command buffers a dumped thunk sequence holds (its ``kCommandBuffer`` thunks)."""
    return len(_COMMAND_BUFFER_THUNK.findall(thunks_text))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--factory", required=True)
    p.add_argument("--kwargs", default="{}")
    p.add_argument("--requests-fd", type=int, required=True)
    p.add_argument("--replies-fd", type=int, required=True)
    p.add_argument("--outputs", required=True)
    p.add_argument("--dump-dir")
    args = p.parse_args(argv)
    requests = os.fdopen(args.requests_fd, "r", encoding="utf-8")
    replies = os.fdopen(args.replies_fd, "w", encoding="utf-8")

    def reply(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    try:
        cases, info = start(args.factory, json.loads(args.kwargs), args.outputs, args.dump_dir)
    except StartError as exc:  # the factory's own failure, reported for this setting
        reply({"op": "failed", "stage": exc.stage, "error": error_record(exc.__cause__)})
        return 0
    reply({"op": "ready", **info})
    for line in requests:
        request = json.loads(line)
        if request["op"] == "quit":
            break
        if request["op"] == "time":
            label = request["label"]
            try:
                reply({"op": "sample", "label": label, "seconds": sample(cases[label], request["calls"])})
            except Exception as exc:
                reply({"op": "sample", "label": label, "error": error_record(exc)})
    return 0


# ----------------------------------------------------------------------------
# Start-up: the factory, compilation, the first results
# ----------------------------------------------------------------------------


class StartError(Exception):
    """Start-up failed at ``stage`` (``"import"``, ``"factory"`` or ``"backend"``); the cause is chained."""

    def __init__(self, stage: str):
        super().__init__(stage)
        self.stage = stage


def start(spec: str, kwargs: dict, outputs_path: str, dump_dir: str | None) -> tuple[dict, dict]:
    """Import and call the factory; compile, check and warm each case. Returns (callables, reply fields)."""
    try:
        factory = load_factory(spec)
    except (Exception, SystemExit) as exc:
        raise StartError("import") from exc
    import jax

    try:
        cases = normalize_cases(factory(**kwargs), spec.rpartition(":")[2])
    except (Exception, SystemExit) as exc:
        raise StartError("factory") from exc
    try:  # JAX_PLATFORMS naming a platform that is not there fails here
        info: dict[str, Any] = {"backend": jax.default_backend(), "jax_version": jax.__version__,
                                "devices": [_device_name(d) for d in jax.devices()], "pid": os.getpid(),
                                "xla_flags": os.environ.get("XLA_FLAGS"), "cases": {}}
    except Exception as exc:
        raise StartError("backend") from exc
    callables, outputs = {}, {}
    for label, case in cases.items():
        try:
            fn, record, result = prepare(case, dump_dir)
            outputs[label] = host_tree(result)
            callables[label] = (fn, case.args)
            info["cases"][label] = {"ok": True, **record}
        except Exception as exc:
            info["cases"][label] = {"ok": False, "stage": "first call", "error": error_record(exc)}
    with open(outputs_path, "wb") as f:
        pickle.dump(outputs, f, protocol=pickle.HIGHEST_PROTOCOL)
    return callables, info


def prepare(case, dump_dir: str | None) -> tuple[Any, dict, Any]:
    """(the callable to time, its record, its first result): compile, count command buffers, run twice."""
    import jax

    args = case.args
    jitted = case.jit and not _is_jitted(case.fn)
    fn = jax.jit(case.fn) if jitted else case.fn
    before = _listing(dump_dir)
    compiled_text = None
    if hasattr(fn, "lower"):  # jitted: compile explicitly, so the dump and the HLO are this function's
        compiled = fn.lower(*args).compile()
        compiled_text = compiled.as_text()
        result = fn(*args)  # reuses the executable just compiled
    else:
        result = fn(*args)
    jax.block_until_ready(result)
    record = {"jitted_by_tool": jitted, **command_buffers(dump_dir, before, compiled_text)}
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    record["warm_seconds"] = time.perf_counter() - start
    return fn, record, result


def command_buffers(dump_dir: str | None, before: set[str], compiled_text: str | None) -> dict:
    """The command-buffer count from the HLO XLA dumped for this compilation (else its compiled text)."""
    if dump_dir is None:
        return {"command_buffers": None, "command_buffers_from": "not counted"}
    texts, thunks = {}, {}
    module = compiled_text.split(",", 1)[0].split()[-1] if compiled_text else None
    for name in sorted(_listing(dump_dir) - before):
        m, t = _DUMPED_MODULE.match(name), _DUMPED_THUNKS.match(name)
        if m and (module is None or m["rest"].startswith(module + ".")):
            texts[name] = _read(dump_dir, name)
        elif t and (module is None or t["module"] == module):
            thunks[name] = _read(dump_dir, name)
    if thunks:  # where XLA forms command buffers from thunks, the HLO holds none: count the thunks
        return {"command_buffers": sum(count_command_buffer_thunks(t) for t in thunks.values()),
                "command_buffers_from": "XLA dump: " + ", ".join(thunks)}
    if texts:
        return {"command_buffers": sum(count_command_buffers(t) for t in texts.values()),
                "command_buffers_from": "XLA dump: " + ", ".join(texts)}
    if compiled_text is not None:  # compiled before (by the factory): XLA dumped it then
        return {"command_buffers": count_command_buffers(compiled_text),
                "command_buffers_from": "compiled.as_text() (compiled before the tool's dump)"}
    return {"command_buffers": None, "command_buffers_from": "no module compiled at the first call"}


def sample(prepared: tuple, calls: int) -> float:
    """Seconds per call of ``(fn, args)`` over ``calls`` back-to-back calls, all waited for at the end."""
    import jax

    fn, args = prepared
    outs = []
    start = time.perf_counter()
    for _ in range(calls):
        outs.append(fn(*args))
    jax.block_until_ready(outs)
    return (time.perf_counter() - start) / calls


def host_tree(result: Any) -> dict:
    """A result as host data: its tree structure and ``(path, numpy array)`` per leaf."""
    import jax
    import numpy as np

    leaves, treedef = jax.tree_util.tree_flatten_with_path(result)
    host = []
    for path, leaf in leaves:
        value = leaf.numpy() if hasattr(leaf, "numpy") and not isinstance(leaf, jax.Array) else leaf
        host.append(("result" + jax.tree_util.keystr(path), np.asarray(jax.device_get(value))))
    return {"treedef": str(treedef), "leaves": host}


def error_record(exc: BaseException) -> dict:
    """Type, message and traceback of ``exc``, for the parent's table."""
    return {"type": type(exc).__name__, "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))}


def _device_name(device: Any) -> str:
    """``cuda:0 NVIDIA H100 80GB HBM3``; ``cpu:0`` where the kind says nothing more."""
    kind = getattr(device, "device_kind", "")
    return str(device) if not kind or kind == device.platform else f"{device} {kind}"


def _is_jitted(fn: Any) -> bool:
    return hasattr(fn, "lower") and hasattr(fn, "trace") or type(fn).__name__ in ("PjitFunction", "Wrapped")


def _read(dump_dir: str, name: str) -> str:
    with open(os.path.join(dump_dir, name), encoding="utf-8", errors="replace") as f:
        return f.read()


def _listing(dump_dir: str | None) -> set[str]:
    return set(os.listdir(dump_dir)) if dump_dir and os.path.isdir(dump_dir) else set()


if __name__ == "__main__":
    sys.exit(main())
