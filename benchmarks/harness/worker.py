"""One benchmark process: every mode of one setting, at every N, written to a JSON file.

The driver (``run.py``) starts one worker per setting with ``XLA_FLAGS`` set
in its environment, because XLA reads the flags once, when its backend starts::

    python -m benchmarks.harness.worker --setting on --json /tmp/on.json --config '{"ns": [1, 100], ...}'

Each worker measures the raw ``cuGraphLaunch`` floor next to its own modes,
at each N, in interleaved rounds, so its ratios come from one process.
Progress goes to stdout as ``[setting] N=... repeat r/R`` lines.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
import time
import traceback
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.harness import config, extras, graph_modes, loop_modes, stats, timing  # noqa: E402
from benchmarks.harness.workload import SOURCE, Chain  # noqa: E402

ENV_KEYS = ("XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE", "JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", required=True, choices=sorted(config.SETTINGS))
    parser.add_argument("--json", required=True, help="where to write this process's results")
    parser.add_argument("--config", required=True, help="RunConfig as JSON")
    args = parser.parse_args(argv)
    cfg = config.RunConfig.from_json(json.loads(args.config))
    proc = {"setting": args.setting, "xla_flags": os.environ.get("XLA_FLAGS"),
            "env": {k: os.environ.get(k) for k in ENV_KEYS}, "pid": os.getpid(),
            "modes": {}, "scalars": {}, "errors": []}
    start = time.perf_counter()
    try:
        proc["device"] = device_info()
        run_setting(config.SETTINGS[args.setting], cfg, proc)
    except Exception as exc:  # still write what was measured
        traceback.print_exc()
        proc["errors"].append(f"process: {type(exc).__name__}: {exc}")
    proc["wall_s"] = round(time.perf_counter() - start, 2)
    with open(args.json, "w") as f:
        json.dump(stats.json_ready(proc), f, indent=1)
    return 1 if proc["errors"] else 0


def run_setting(setting: config.Setting, cfg: config.RunConfig, proc: dict) -> None:
    """Measure every N, then (no-JAX process) the N-independent figures."""
    import jaxgraph

    log = functools.partial(_log, setting.key)
    rng = np.random.default_rng()  # unseeded: every run checks new inputs
    if setting.uses_jax:
        proc["jax"] = _start_jax()
        log(f"JAX {proc['jax']['version']} on {proc['jax']['devices']}; XLA_FLAGS={proc['xla_flags']!r}")
    kernel = jaxgraph.Kernel(SOURCE, "add_one")
    stream = jaxgraph.Stream()
    counters = _replay_counters(log) if setting.uses_jax else None
    if setting.uses_jax and cfg.capture_policy is not None:
        from jaxgraph import diagnostics

        diagnostics.set_capture_policy(cfg.capture_policy)
        proc["capture_policy"] = cfg.capture_policy
    previous = None  # (N, setup seconds) of the last jax_calls built, for its compile budget
    for n in cfg.ns:
        chain = Chain(kernel, n)
        if setting.uses_jax:
            factories, step = _jax_factories(chain, kernel, stream, rng, cfg, previous)
            proc.setdefault("replay_bindings", {})[str(n)] = _describe_bindings(step)
        else:
            factories, step = _nojax_factories(chain, stream, rng), None
        if cfg.loops:
            from benchmarks.harness import jax_modes

            factories += (loop_modes.jax_factories(chain, jax_modes.kernel_step(kernel), rng) if setting.uses_jax
                          else loop_modes.nojax_factories(kernel, chain, stream, rng))
        factories = [(key, factory) for key, factory in factories if cfg.runs(key)]
        records = timing.measure_group(f"[{setting.key}] N={n}", factories, cfg.repeats,
                                        cfg.target_ms / 1e3, cfg.max_calls, log, counters)
        _record(proc, n, records)
        setup = records.get("jax_calls", {}).get("setup_s")
        previous = (n, setup) if setup is not None else previous
        del factories, step, records
        gc.collect()  # jitted functions and replayables of this N go before its graph
        chain.close()
    if not setting.uses_jax and not cfg.loops:
        factories = [("capture_1000", functools.partial(extras.capture, kernel, rng))]
        factories += extras.eager_factories(kernel, stream, rng)
        factories = [(key, factory) for key, factory in factories if cfg.runs(key)]
        records = timing.measure_group(f"[{setting.key}] capture+eager", factories, cfg.repeats,
                                        cfg.target_ms / 1e3, cfg.max_calls, log) if factories else {}
        for key, record in records.items():
            proc["scalars"][key] = record
            if "error" in record:
                proc["errors"].append(f"{key}: {record['error']}")
    jaxgraph.synchronize()


def device_info() -> dict:
    """Name, ordinal, compute capability and CUDA driver API version of the current device."""
    import jaxgraph
    from cuda.bindings import driver as cu

    if jaxgraph.device_count() == 0:  # also initialises the driver for the calls below
        raise RuntimeError("no CUDA device: the benchmark needs a GPU")
    ordinal = jaxgraph.current_device()
    dev = _checked(cu.cuDeviceGet(ordinal))
    name = _checked(cu.cuDeviceGetName(256, dev))
    name = name.split(b"\0")[0].decode() if isinstance(name, bytes) else str(name)
    attr = cu.CUdevice_attribute
    major = _checked(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = _checked(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    version = _checked(cu.cuDriverGetVersion())
    return {"name": name, "ordinal": ordinal, "compute_capability": f"{major}.{minor}",
            "cuda_driver_api": f"{version // 1000}.{version % 1000 // 10}"}


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _nojax_factories(chain: Chain, stream: Any, rng: np.random.Generator) -> list:
    n = chain.n
    return [("raw", functools.partial(graph_modes.raw, chain, stream, rng)),
            ("replay", functools.partial(graph_modes.replay, chain, stream, rng)),
            ("torch_cupy", functools.partial(graph_modes.torch_cupy, n, rng)),
            ("torch_add", functools.partial(graph_modes.torch_add, n, rng))]


def _jax_factories(chain: Chain, kernel: Any, stream: Any, rng: np.random.Generator, cfg: config.RunConfig,
                   previous: tuple | None) -> tuple[list, Any]:
    import jaxgraph

    from benchmarks.harness import jax_modes

    n = chain.n
    try:
        step = jaxgraph.replayable(chain.graph, inputs=[chain.x_s], outputs=[chain.y_s])
    except Exception as exc:  # the jit modes then fail with this reason; raw, jax_calls, trivial_jit still run
        traceback.print_exc()
        step = functools.partial(_unavailable, f"jaxgraph.replayable failed: {type(exc).__name__}: {exc}")
    skip = stats.jax_calls_skip_reason(n, previous, cfg.jax_calls_budget_s)
    one_kernel = jax_modes.kernel_step(kernel)
    setups: dict[str, float] = {}  # setup seconds of this N's jax_calls, once built: mixed_calls' budget

    def jax_calls() -> Any:
        start = time.perf_counter()
        mode = jax_modes.jax_calls(one_kernel, n, rng, skip)
        setups["jax_calls"] = time.perf_counter() - start
        return mode

    def mixed_calls(changing: bool) -> Any:
        # R * N calls: estimated from this N's jax_calls when it was built, else from the last N's.
        base = (n, setups["jax_calls"]) if "jax_calls" in setups else previous
        why = stats.jax_calls_skip_reason(n * config.MIXED_REPLAYS, base, cfg.jax_calls_budget_s)
        return jax_modes.mixed_calls(one_kernel, n, rng, changing, why)

    factories = [("raw", functools.partial(graph_modes.raw, chain, stream, rng)),
                 ("jit_loop", functools.partial(jax_modes.jit_loop, step, n, rng)),
                 ("jit_changing", functools.partial(jax_modes.jit_changing, step, n, rng)),
                 ("jit_fori", functools.partial(jax_modes.jit_fori, step, n, rng)),
                 ("jit_unrolled", functools.partial(jax_modes.jit_unrolled, step, n, rng)),
                 ("jax_calls", jax_calls),
                 ("trivial_jit", functools.partial(jax_modes.trivial_jit, rng)),
                 ("mixed", functools.partial(jax_modes.mixed, step, n, rng)),
                 ("mixed_changing", functools.partial(jax_modes.mixed, step, n, rng, True)),
                 ("mixed_calls", functools.partial(mixed_calls, False)),
                 ("mixed_calls_changing", functools.partial(mixed_calls, True))]
    return factories, step


def _replay_counters(log: Any) -> Any:
    """The replay handler's counters as a callable (``jaxgraph.diagnostics.counters``), or ``None``
    where the native extension cannot say (the modes are then timed without them)."""
    try:
        from jaxgraph import diagnostics

        diagnostics.counters()
    except Exception as exc:
        log(f"no replay counters: {type(exc).__name__}: {exc}")
        return None
    return diagnostics.counters


def _unavailable(why: str, *args: Any) -> Any:
    """Stands in for a replayable that could not be made: every use raises ``why``."""
    raise RuntimeError(why)


def _describe_bindings(step: Any) -> str | None:
    """How the replay passes XLA's buffers (bound into the graph or copied), where jaxgraph says so."""
    try:
        bindings = getattr(step, "bindings", None)  # newer jaxgraph only; informational
    except Exception as exc:
        return f"unavailable: {exc}"
    return None if bindings is None else repr(bindings)


def _record(proc: dict, n: int, records: dict) -> None:
    """File one N's records under their modes; lift unit and clock to the mode."""
    for key, record in records.items():
        mode = proc["modes"].setdefault(key, {"by_n": {}})
        for field in ("unit", "clock"):
            if field in record:
                mode[field] = record.pop(field)
        mode["by_n"][str(n)] = record
        if "error" in record:
            proc["errors"].append(f"{key} N={n}: {record['error']}")


def _start_jax() -> dict:
    """Start JAX's backend; refuse to measure jit modes on anything but the GPU."""
    import jax

    devices = jax.devices()
    if devices[0].platform != "gpu":
        raise RuntimeError(f"JAX runs on {devices[0].platform}, not a GPU ({devices}); the jit modes need "
                           "jax with CUDA (check JAX_PLATFORMS and the jax-cuda plugin)")
    return {"version": jax.__version__, "devices": [str(d) for d in devices]}


def _checked(result: tuple) -> Any:
    """The value of a ``cuda.bindings`` call that returned ``(CUresult, value)``; raise on failure."""
    from cuda.bindings import driver as cu

    if result[0] != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver call failed: {result[0]}")
    return result[1]


def _log(setting: str, message: str) -> None:
    if not message.startswith("["):
        message = f"[{setting}] {message}"
    print(message, flush=True)


if __name__ == "__main__":
    sys.exit(main())
