"""Compare your own JAX code under XLA's command-buffer settings: ``python -m jaxgraph.compare``.

XLA can record a jitted program's kernels into CUDA graphs ("command buffers");
which ones it records depends on ``XLA_FLAGS``, read once per process. This
tool runs *your* functions under each setting, each in its own process, checks
that every setting computes the same results, times them in interleaved rounds
and prints one table::

    python -m jaxgraph.compare mymodule:make_case --rounds 5
    python -m jaxgraph.compare path/to/file.py:make_case --json out.json --plot out.png

or from Python::

    import jaxgraph.compare
    result = jaxgraph.compare.run("path/to/file.py:make_case", rounds=5)
    print(result)                # the table
    result.timings["step"]["on"].median, result.ok, result.to_json()

The factory (``make_case`` above) takes no arguments (or the keyword arguments
you pass) and returns ``(fn, args)``, a :class:`Case`, or a dict
``{label: (fn, args) or Case}`` of several functions to compare side by side.
Each ``fn`` is wrapped in ``jax.jit`` unless it already is one. The settings
(:data:`SETTINGS`): ``off`` (command buffers off), ``on`` (``FUSION,CUSTOM_CALL``,
``xla_gpu_graph_min_graph_size=1``), ``defaults`` (``XLA_FLAGS`` unset) and
``while`` (``on`` plus ``WHILE,CONDITIONAL``); add your own as ``NAME=FLAGS``.

This package is a tool on top of jaxgraph, not part of its layered core: the
parent process never imports JAX (XLA's flags must be set before it starts).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from .agreement import Mismatch
from .cases import SETTING_ENV, Case, current_setting, factory_spec
from .report import Failure, Result, Timing
from .settings import DEFAULT_SETTINGS, SETTINGS, Setting, parse_setting

__all__ = ["Case", "DEFAULT_SETTINGS", "Failure", "Mismatch", "Result", "SETTINGS", "SETTING_ENV", "Setting",
           "Timing", "current_setting", "run"]


def run(factory: str | Callable[..., Any], settings: Sequence[str | Setting] | None = None, *, rounds: int = 5,
        target_ms: float = 20.0, max_calls: int = 10_000, timeout_s: float = 300.0, rtol: float = 1e-5,
        atol: float = 1e-8, compare_functions: bool = False, factory_kwargs: dict[str, Any] | None = None,
        extra_xla_flags: str = "", count_command_buffers: bool = True,
        progress: Callable[[str], None] | None = None) -> Result:
    """Run ``factory``'s functions under each XLA setting, each in its own process; check and time them.

    Parameters
    ----------
    factory : str or callable
        ``"module:function"`` or ``"path/to/file.py:function"`` (or the function
        itself, when it is defined at the top level of a module or script). Each
        worker imports it and calls ``factory(**factory_kwargs)``; it returns
        ``(fn, args)``, a :class:`Case` or a dict ``{label: (fn, args) or Case}``.
    settings : sequence of str or Setting, optional
        Names from :data:`SETTINGS`, ``"NAME=FLAGS"`` strings or :class:`Setting`
        objects. Default: all four of :data:`DEFAULT_SETTINGS`.
    rounds : int
        Interleaved rounds: in each, every setting times every function once
        (the settings' order rotates from round to round).
    target_ms : float
        About how long one sample takes: the calls a sample makes (the same in
        every setting) are this over the median warm call time, at least 1.
    max_calls : int
        At most this many calls a sample.
    timeout_s : float
        Per worker: the longest its start-up (import, factory, compilation, the
        first calls) or one sample may take. A worker past it is stopped and
        reported as timed out; the other settings go on.
    rtol, atol : float
        Results agree when ``np.allclose(x, reference, rtol, atol)`` for every
        floating output (integers and bools: exactly equal).
    compare_functions : bool
        Also compare the functions with each other: each one's result against
        the first function's (for several ways of writing one computation).
    factory_kwargs : dict, optional
        Keyword arguments for the factory (JSON-serializable: they cross to the workers).
    extra_xla_flags : str
        Flags appended to every setting's ``XLA_FLAGS`` (``defaults`` then gets only these).
        ``XLA_FLAGS`` already in your environment are *replaced* in every worker
        (the table says so): pass any you need here.
    count_command_buffers : bool
        Add ``--xla_dump_to`` to each worker's flags and count the command
        buffers in the optimized HLO XLA dumps (only a dump; it changes no compilation).
    progress : callable, optional
        Called with one line per step (workers ready, rounds done); default: silent.

    Returns
    -------
    Result
        ``str(result)`` is the table; the data are its attributes.

    Raises
    ------
    ValueError, TypeError
        A malformed factory name, an unknown setting, two settings with one
        name, or a bad number. Failures of your code are never raised: they are
        in ``result.failures`` and in the table.
    """
    from .driver import run_workers
    from .report import build_result

    spec = factory_spec(factory)
    chosen = [parse_setting(s) for s in (DEFAULT_SETTINGS if settings is None else settings)]
    if not chosen:
        raise ValueError("settings is empty: give at least one")
    names = [s.name for s in chosen]
    if len(set(names)) != len(names):
        raise ValueError(f"two settings share a name: {names}")
    for name, value, low in (("rounds", rounds, 1), ("max_calls", max_calls, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    for name, value in (("target_ms", target_ms), ("timeout_s", timeout_s)):
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    kwargs = dict(factory_kwargs or {})
    try:
        json.dumps(kwargs)
    except TypeError as exc:
        raise TypeError(f"factory_kwargs must be JSON-serializable (they cross to the worker processes): {exc}") \
            from None
    log = progress or (lambda line: None)
    with tempfile.TemporaryDirectory(prefix="jaxgraph-compare-") as tmp:
        raw = run_workers(spec, kwargs, chosen, rounds, target_ms / 1e3, max_calls, timeout_s,
                          count_command_buffers, extra_xla_flags, Path(tmp), log)
        shown = factory if isinstance(factory, str) else spec
        result = build_result(raw, shown, chosen, rounds, rtol, atol, compare_functions)
    result.replaced_xla_flags = os.environ.get("XLA_FLAGS")
    return result
