"""Replay in jit after a long warm-up: per-call counters and times in each XLA setting (one process each).

    python benchmarks/probes/settle_check.py

The lead's diagnostic for issue 19, run on the H100 at 17:35 UTC on 2026-11-23
(commit 4224a42) as it stands here: for the N = 100 and 1000 chains
(benchmarks/harness/workload.py), a jitted replayable on one fixed input and on 8
rotating inputs, 200 warm-up calls then phases of 1000-2000 calls, each phase's
host time per call over ``g.replay()``'s and the replay counters per call; then
3 replays between XLA ops. It showed that after warm-up XLA does not call the
handler again under command buffers (1.00x the floor), so the slow ``--quick``
figures of earlier runs came from timing the first calls. Prints plain text.
"""
import os
import subprocess
import sys
import time

import numpy as np

SETTINGS = {
    "off": "--xla_gpu_enable_command_buffer=",
    "on": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
    "defaults": None,
}


def child(setting):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import jax
    import jax.numpy as jnp

    import jaxgraph
    from benchmarks.harness.workload import SOURCE, Chain, check_result, random_input
    from jaxgraph import diagnostics

    print("jax", jax.__version__, "XLA_FLAGS", os.environ.get("XLA_FLAGS"), flush=True)
    k = jaxgraph.Kernel(SOURCE, "add_one")
    rng = np.random.default_rng()
    for n in (100, 1000):
        ch = Chain(k, n)
        step = jaxgraph.replayable(ch.graph, inputs=[ch.x_s], outputs=[ch.y_s])
        print(f"N={n} bindings={step.bindings} paths={step.replay_paths}", flush=True)
        for _ in range(50):
            ch.graph.replay()
        jaxgraph.synchronize()
        t = time.perf_counter()
        for _ in range(500):
            ch.graph.replay()
        jaxgraph.synchronize()
        floor = (time.perf_counter() - t) / 500
        print(f"  floor g.replay {floor*1e6:.1f} us/call ({floor*1e6/n:.3f} us/kernel)", flush=True)
        for label, f, count in (("fixed", jax.jit(step), 1), ("rotating", jax.jit(lambda x: step(x)), 8)):
            hosts = [random_input(rng) for _ in range(count)]
            xs = [jnp.asarray(h) for h in hosts]
            for h, x in zip(hosts, xs):
                check_result(f(x), h, n)
            addrs = []
            out = None
            for i in range(8):
                out = f(xs[i % count])
                addrs.append(out.unsafe_buffer_pointer() % 10**7)
            jax.block_until_ready(out)
            print(f"  {label}: output addresses mod 1e7 {addrs}", flush=True)
            for phase, calls in (("warm0-200", 200), ("200-1200", 1000), ("1200-3200", 2000), ("3200-5200", 2000)):
                c0 = diagnostics.counters()
                jax.block_until_ready(xs)
                jaxgraph.synchronize()
                t = time.perf_counter()
                for i in range(calls):
                    out = f(xs[i % count])
                jax.block_until_ready(out)
                dt = (time.perf_counter() - t) / calls
                c1 = diagnostics.counters()
                d = {key: round((c1[key] - c0[key]) / calls, 3) for key in c1 if key != "handler_ns"}
                hns = (c1["handler_ns"] - c0["handler_ns"]) / max(1, c1["handler_calls"] - c0["handler_calls"])
                print(f"  {label} {phase}: {dt*1e6:.1f} us/call = {dt/floor:.2f}x floor; per call {d}; "
                      f"handler {hns/1e3:.1f} us/handler call", flush=True)

        def mixed(x):
            for _ in range(3):
                x = step(x) * 1.0 + 0.0
                x = jnp.sin(x) * 0 + x
            return x

        fm = jax.jit(mixed)
        x = jnp.asarray(random_input(rng))
        for _ in range(100):
            out = fm(x)
        jax.block_until_ready(out)
        c0 = diagnostics.counters()
        t = time.perf_counter()
        for _ in range(1000):
            out = fm(x)
        jax.block_until_ready(out)
        dt = (time.perf_counter() - t) / 1000
        c1 = diagnostics.counters()
        d = {key: round((c1[key] - c0[key]) / 1000, 3) for key in c1 if key != "handler_ns"}
        print(f"  mixed(3 replays + XLA ops) fixed: {dt*1e6:.1f} us/call; per call {d}", flush=True)
        ch.graph.reset()


def main():
    if len(sys.argv) > 1:
        return child(sys.argv[1])
    for key, flags in SETTINGS.items():
        env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
        env.pop("XLA_FLAGS", None)
        if flags:
            env["XLA_FLAGS"] = flags
        print(f"===== setting {key}", flush=True)
        subprocess.run([sys.executable, __file__, key], env=env, timeout=150)
    # Does this XLA know the command-buffer update-mode / VA-remapping flags?
    for flag in ("--xla_gpu_command_buffer_update_mode=FULL_UPDATE_FREE",
                 "--xla_gpu_enable_command_buffer_va_remapping=true"):
        env = dict(os.environ, XLA_FLAGS=flag, XLA_PYTHON_CLIENT_PREALLOCATE="false")
        r = subprocess.run([sys.executable, "-c", "import jax, jax.numpy as jnp; print(jax.jit(lambda x: x+1)(jnp.ones(3)))"],
                           env=env, capture_output=True, text=True, timeout=60)
        print(f"flag {flag}: rc={r.returncode} {(r.stdout + r.stderr)[-300:]}", flush=True)


if __name__ == "__main__":
    main()
