"""jax.grad through a device loop against jax.grad of the idiomatic jnp program: time per gradient, memory.

    python benchmarks/grad_loop.py                       # 256 and 512 grids, 1000 steps, 4 settings, 3 rounds
    python benchmarks/grad_loop.py --quick               # 64 grid, 50 steps, 2 settings, 2 rounds (a smoke run)
    python benchmarks/grad_loop.py --out DIR             # also write DIR/<device>-grad-loop.{json,md}

The model is ``examples/inverse_diffusion.py``'s (explicit diffusion with a
diffusivity field on a periodic grid); the loss is ``mean((u_R - u_obs)^2)``
and each variant computes its gradient with respect to the initial state and
the diffusivity field (``jax.value_and_grad``, jitted):

- ``jnp``: the model in ``jax.numpy`` (``jnp.roll`` stencil) in ``lax.scan``,
  differentiated by JAX (XLA stores every step's state);
- ``jnp_checkpoint``: the same with ``jax.checkpoint`` on the step (the
  body recomputed in the backward);
- ``jax_call``: the example's two kernels through ``Kernel.jax_call``, a
  ``jax.custom_vjp`` per step (the backward kernel as its VJP) in ``lax.scan``;
- ``jaxgraph``: the same kernels captured as a graphed step with
  ``backward=``, in ``jaxgraph.graphed_loop``: one checkpointed forward loop
  and one backward loop on the device (``checkpoint_every`` about sqrt(R)),
  the full segments retargeted (clones of the step and its backward pointed
  at the ring slots, no state copies between steps: jaxgraph's default);
- ``jaxgraph_copies``: the same with ``jaxgraph.diagnostics.loop_settings(retarget_gradients=False)`` (the state
  copied between steps, what runs where a step cannot be cloned); the report
  says which way ran (``mode``).

Results written before 2026-11-28 10:30 UTC name these two ``jaxgraph_retarget`` and ``jaxgraph``.

Each XLA setting (``defaults``; ``off``: command buffers off; ``on``:
``FUSION,CUSTOM_CALL`` with min graph size 1; ``while``: ``on`` with
``WHILE,CONDITIONAL``) runs in its own process; the
processes of all variants and settings are started in interleaved rounds. In
a process, a variant is compiled, checked against the ``jnp`` gradient
(computed in the same process), warmed up and timed ``--reps`` times (wall
time of a call to ``block_until_ready``); the process reports the median.
The report gives, per variant, its best setting's median over the rounds
with the range, and memory: XLA's temporary buffers of the compiled
gradient (``memory_analysis``), the peak the XLA allocator saw, and what
jaxgraph's loop holds outside XLA (``GraphedLoop.checkpoint_memory``).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from jaxgraph.compare.settings import SETTINGS as XLA_SETTINGS

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = {name: s.xla_flags for name, s in XLA_SETTINGS.items()}  # off, on, defaults, while (jaxgraph.compare's)
VARIANTS = ("jnp", "jnp_checkpoint", "jax_call", "jaxgraph", "jaxgraph_copies")


# ----------------------------------------------------------------------------
# Worker: one variant under one XLA setting
# ----------------------------------------------------------------------------


def _example():
    import importlib.util

    spec = importlib.util.spec_from_file_location("inverse_diffusion", ROOT / "examples" / "inverse_diffusion.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gradient_fn(variant, ex, n, steps):
    import jax
    import jax.numpy as jnp
    import numpy as np

    held, loop = 0, None
    if variant in ("jnp", "jnp_checkpoint"):
        def body(u, kappa):
            return u + kappa * ex.laplacian(u)

        if variant == "jnp_checkpoint":
            body = jax.checkpoint(body)

        def run(u0, kappa):
            u, _ = jax.lax.scan(lambda u, _: (body(u, kappa), None), u0, None, length=steps)
            return u
    elif variant == "jax_call":
        ks = ex.kernels(np.float32)
        grid, block = ((n + ex.TILE - 1) // ex.TILE,) * 2, (ex.TILE, ex.TILE)
        sds = jax.ShapeDtypeStruct((n, n), jnp.float32)

        @jax.custom_vjp
        def step(u, kappa):
            return ks["diffuse"].jax_call(sds, u, kappa, n, grid=grid, block=block)

        def step_fwd(u, kappa):
            return step(u, kappa), (u, kappa)

        def step_bwd(res, ct):
            u, kappa = res
            return tuple(ks["diffuse_bwd"].jax_call(sds, sds, u, kappa, ct, n, grid=grid, block=block))

        step.defvjp(step_fwd, step_bwd)

        def run(u0, kappa):
            u, _ = jax.lax.scan(lambda u, _: (step(u, kappa), None), u0, None, length=steps)
            return u
    else:  # "jaxgraph" and "jaxgraph_copies": the worker holds its loop setting (worker())
        loop = ex.make_loop(n, steps)
        held = loop.checkpoint_memory()["device_bytes"]

        def run(u0, kappa):
            return loop(u0, kappa)

    def loss(u0, kappa, u_obs):
        return jnp.mean((run(u0, kappa) - u_obs) ** 2)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), held, loop


def worker(variant, grids, steps, reps):
    import contextlib

    settings = contextlib.nullcontext()
    if variant.startswith("jaxgraph"):  # the gradient is built, with the setting, where fn is first traced
        from jaxgraph import diagnostics

        settings = diagnostics.loop_settings(retarget_gradients=variant == "jaxgraph")
    with settings:
        out = _measure(variant, grids, steps, reps)
    print("RESULT " + json.dumps(out), flush=True)


def _measure(variant, grids, steps, reps):
    import jax
    import jax.numpy as jnp
    import numpy as np

    ex = _example()
    rng = np.random.default_rng(1234)
    out = {"variant": variant, "device": jax.devices()[0].device_kind, "grids": {}}
    for n in grids:
        kappa_true, u0, kappa = ex.problem(n, rng)
        u0, kappa = jnp.asarray(u0), jnp.asarray(kappa)
        u_obs = ex.diffuse_reference(u0, jnp.asarray(kappa_true), steps)
        ref_fn, _, _ = _gradient_fn("jnp", ex, n, steps)
        _, (ref_gu, ref_gk) = ref_fn(u0, kappa, u_obs)
        fn, held, loop = _gradient_fn(variant, ex, n, steps)
        compiled = fn.lower(u0, kappa, u_obs).compile()
        mem = compiled.memory_analysis()
        temp = int(getattr(mem, "temp_size_in_bytes", -1)) if mem is not None else -1
        value, (gu, gk) = fn(u0, kappa, u_obs)
        err = max(float(jnp.max(jnp.abs(gu - ref_gu)) / jnp.max(jnp.abs(ref_gu))),
                  float(jnp.max(jnp.abs(gk - ref_gk)) / jnp.max(jnp.abs(ref_gk))))
        for _ in range(2):
            jax.block_until_ready(fn(u0, kappa, u_obs))
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(u0, kappa, u_obs))
            times.append(time.perf_counter() - t0)
        stats = jax.devices()[0].memory_stats() or {}
        out["grids"][str(n)] = {"median_ms": statistics.median(times) * 1e3, "samples_ms": [t * 1e3 for t in times],
                                "xla_temp_bytes": temp, "xla_peak_bytes": int(stats.get("peak_bytes_in_use", -1)),
                                "jaxgraph_held_bytes": held, "max_rel_err_vs_jnp": err, "loss": float(value),
                                "mode": _gradient_mode(loop)}
    return out


def _gradient_mode(loop):
    """How the jaxgraph variants' gradient ran its full segments (LoopGradient's mode); "" for the others."""
    if loop is None:
        return ""
    from jaxgraph import diagnostics

    return diagnostics.describe_loop(loop).gradient


# ----------------------------------------------------------------------------
# Driver: processes in interleaved rounds, then the report
# ----------------------------------------------------------------------------


def run_process(variant, setting, args):
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    if SETTINGS[setting]:
        env["XLA_FLAGS"] = SETTINGS[setting]
    cmd = [sys.executable, __file__, "--worker", variant, "--grids", args.grids, "--steps", str(args.steps),
           "--reps", str(args.reps)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"variant": variant, "error": (p.stdout + p.stderr)[-2000:]}


def report(records, args):
    grids = args.grids.split(",")
    device = next((r["device"] for r in records if "device" in r), "unknown")
    lines = [f"# jax.grad through a device loop vs jax.grad of the jnp program ({device})", "",
             f"`python benchmarks/grad_loop.py {' '.join(sys.argv[1:])}`; {args.steps} steps of "
             f"`examples/inverse_diffusion.py`'s model, gradient w.r.t. the initial state and the diffusivity "
             f"field; {args.rounds} interleaved rounds, {args.reps} timed calls a process; ms per gradient: the "
             "median over rounds of each process's median, [min-max of the rounds]; each variant at its best "
             "setting (lowest median), the others listed.", ""]
    summary = {}
    for n in grids:
        lines += [f"## {n} x {n}", "",
                  "| variant | best setting | ms per gradient | all settings (median ms) | XLA temp | XLA peak "
                  "| jaxgraph loop holds | max rel. err vs jnp |", "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
        for v in VARIANTS:
            per = {}
            for r in records:
                if r.get("variant") == v and "grids" in r and n in r["grids"]:
                    per.setdefault(r["setting"], []).append(r["grids"][n])
            if not per:
                errs = [r.get("error", "") for r in records if r.get("variant") == v and "error" in r]
                lines.append(f"| {v} | failed | | | | | | {errs[0][-200:].replace('|', '/').replace(chr(10), ' ') if errs else ''} |")
                continue
            meds = {s: statistics.median(g["median_ms"] for g in gs) for s, gs in per.items()}
            best = min(meds, key=meds.get)
            rounds = [g["median_ms"] for g in per[best]]
            g0 = per[best][-1]
            summary.setdefault(n, {})[v] = {"setting": best, "median_ms": meds[best], "min_ms": min(rounds),
                                            "max_ms": max(rounds), "xla_temp_bytes": g0["xla_temp_bytes"],
                                            "xla_peak_bytes": g0["xla_peak_bytes"],
                                            "jaxgraph_held_bytes": g0["jaxgraph_held_bytes"]}
            alls = ", ".join(f"{s} {m:.2f}" for s, m in sorted(meds.items()))
            if g0.get("mode"):
                alls += f" ({g0['mode']})"
            lines.append(f"| {v} | {best} | {meds[best]:.2f} [{min(rounds):.2f}-{max(rounds):.2f}] | {alls} | "
                         f"{_mb(g0['xla_temp_bytes'])} | {_mb(g0['xla_peak_bytes'])} | {_mb(g0['jaxgraph_held_bytes'])} "
                         f"| {max(g['max_rel_err_vs_jnp'] for gs in per.values() for g in gs):.1e} |")
        s = summary.get(n, {})
        for mine in ("jaxgraph", "jaxgraph_copies"):
            if mine not in s:
                continue
            for base in ("jnp", "jnp_checkpoint", "jax_call"):
                if base in s:
                    lines.append(f"\n{mine} vs {base} (each at its best): "
                                 f"{s[base]['median_ms'] / s[mine]['median_ms']:.2f}x")
        lines.append("")
    return "\n".join(lines), summary


def _mb(b):
    return "-" if b is None or b < 0 else f"{b / 2**20:.1f} MB"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", nargs=1, metavar="VARIANT", help=argparse.SUPPRESS)
    p.add_argument("--grids", default="256,512")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--settings", default="defaults,off,on,while")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None, help="folder for <device>-grad-loop.{json,md}")
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker[0], [int(g) for g in args.grids.split(",")], args.steps, args.reps)
        return 0
    if args.quick:
        args.grids, args.steps, args.rounds, args.settings = "64", 50, 2, "defaults,off"
    import jaxgraph

    if jaxgraph.device_count() == 0:
        print("a CUDA GPU is needed to time the gradients: none found")
        return 0
    records = []
    for r in range(args.rounds):
        for setting in args.settings.split(","):
            for v in args.variants.split(","):
                rec = run_process(v, setting, args)
                rec.update(setting=setting, round=r)
                records.append(rec)
                print(json.dumps({k: rec[k] for k in ("variant", "setting", "round")}),
                      {n: round(g["median_ms"], 3) for n, g in rec.get("grids", {}).items()} or rec.get("error"),
                      flush=True)
    text, summary = report(records, args)
    print(text)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = records[0].get("device", "gpu").lower().replace(" ", "-") + "-grad-loop"
        (out / f"{stem}.json").write_text(json.dumps({"argv": sys.argv[1:], "records": records,
                                                      "summary": summary}, indent=1))
        (out / f"{stem}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
