"""Scaling over processes: one process per GPU under ``jax.distributed``, 1 process vs N.

    python benchmarks/scaling_processes.py                         # 1 process, then one per GPU here
    python benchmarks/scaling_processes.py --processes 2 --share-gpu --quick   # one GPU: proves it runs, no figure
    python benchmarks/scaling_processes.py --cpu --quick           # JAX on the CPU (gloo): the whole path, no GPU
    srun python benchmarks/scaling_processes.py --worker           # on a cluster: see "Several hosts" in README.md

The workload is per process (weak scaling), as in benchmarks/scaling_gpus.py: a
chain of ``--kernels`` dependent ``add_one`` kernels over ``--elements``
float32, captured on each process's GPU with ``jaxgraph.capture_per_device``.
A step is one call of a jitted ``shard_map`` over the global mesh (one GPU per
process): ``replay`` replays each process's graph on its shard; ``psum`` adds
a ``psum`` across processes (NCCL) of ``min(y - x)`` over the shard. With ``--cpu`` a
pure-JAX loop stands in for the graph. Every process checks its shard against
numpy (``x + kernels`` exactly, fresh random integers) and the psum against
the sum of every shard before timing.

Timing: each sample is ``--steps`` steps ending in ``block_until_ready``,
started together on every process (a barrier of JAX's distributed runtime);
a round's step time is the slowest process's. Throughput on N processes over
one is ``N * t_1 / t_N`` (target >= 1.9x on 2 GPUs). The 1-process and
N-process groups run one after the other (a group is one set of processes),
so slow drift between them is not cancelled as interleaved rounds would.
With ``--share-gpu`` the N processes time-share one GPU, so the ratio says
nothing about scaling; the report says so instead of giving one.

Writes ``<device>-scaling-processes[-shared-gpu|-cpu][-quick].json`` and
``.md`` into ``--out`` and prints the markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

if __package__ in (None, ""):  # run as a file: import the harness as the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import process_launcher, provenance, stats  # noqa: E402
from benchmarks.reports.run_report import fmt  # noqa: E402
from benchmarks.harness.workload import BLOCK, SOURCE, check_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.9  # throughput on 2 GPUs over 1 (issue 18)
MODES = {"replay": "`jit(shard_map(sg))`: each process replays its graph on its shard",
         "psum": "the same, then a `psum` across processes of a reduction of the shard"}

__all__ = ["MODES", "TARGET", "main", "markdown", "parse_args", "scaling", "step_times", "worker"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/scaling_processes.py", description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=None, help="N (default: the GPUs here; 2 with --cpu)")
    p.add_argument("--share-gpu", action="store_true", help="the N processes share GPU 0 (proves it runs; no figure)")
    p.add_argument("--cpu", action="store_true", help="JAX on the CPU, a pure-JAX step, gloo collectives")
    p.add_argument("--worker", action="store_true", help="be one process of a group (a launcher started it)")
    p.add_argument("--quick", action="store_true", help="smoke run: 3 rounds of 20 steps")
    p.add_argument("--elements", type=int, default=None, help="float32 per process (default 4Mi; 64Ki with --cpu)")
    p.add_argument("--kernels", type=int, default=None, help="kernels per graph (default 100; 10 with --cpu)")
    p.add_argument("--steps", type=int, default=None, help="steps per sample (default 100, quick 20)")
    p.add_argument("--repeats", type=int, default=None, help="rounds (default 9, quick 3)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for each group of processes")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="results directory")
    args = p.parse_args(argv)
    defaults = {"elements": 1 << 16 if args.cpu else 1 << 22, "kernels": 10 if args.cpu else 100,
                "steps": 20 if args.quick else 100, "repeats": 3 if args.quick else 9}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.processes is not None and args.processes < 2:
        p.error(f"--processes must be >= 2 (scaling compares 1 process with several), got {args.processes}")
    if args.cpu and args.share_gpu:
        p.error("--cpu and --share-gpu exclude each other")
    return args


# ----------------------------------------------------------------------------
# One process of a group
# ----------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> dict:
    """Join the group, build and check both modes, time them; return this process's record."""
    rank, world = process_launcher.initialize()
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    n, kernels = args.elements, args.kernels
    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    record: dict[str, Any] = {"rank": rank, "world": world, "devices": [str(d) for d in jax.local_devices()]}
    if args.cpu:
        def graph(x):  # the stand-in: the same result as the chain of kernels
            return jax.lax.fori_loop(0, kernels, lambda i, v: v + 1.0, x)
    else:
        graph = _capture(n, kernels)
        graph.check_devices(mesh)  # every process has its graph, same id and shapes
        record["bindings"] = [str(b) for rows in graph.bindings.values() for b in rows]
        record["device"] = _device_name()

    def with_psum(x):
        y = graph(x)
        return y, jax.lax.psum(jnp.min(y - x), "x")  # = kernels * processes, exactly, when every shard is done

    bodies = {"replay": lambda x: (graph(x), jnp.zeros((), x.dtype)), "psum": with_psum}
    client = _client()
    seed = int(client.blocking_key_value_get("scaling/seed", 60_000)) if rank else _publish_seed(client)
    record["modes"] = {}
    for key, body in bodies.items():
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P())))
        x = np.random.default_rng(seed).integers(-1000, 1000, n * world).astype(np.float32)
        placed = jax.make_array_from_process_local_data(sharding, x[rank * n:(rank + 1) * n])
        y, total = f(placed)
        (shard,) = y.addressable_shards
        check = check_result(shard.data, x[rank * n:(rank + 1) * n], kernels)
        if key == "psum" and float(total) != float(kernels * world):
            raise AssertionError(f"psum across processes: got {float(total)}, expected {kernels * world}")
        samples = []
        for r in range(args.repeats):
            client.wait_at_barrier(f"scaling/{key}/{r}", 120_000)  # every process starts the sample together
            start = time.perf_counter()
            out = None
            for _ in range(args.steps):
                out = f(placed)
            jax.block_until_ready(out)
            samples.append((time.perf_counter() - start) / args.steps * 1e6)
        record["modes"][key] = {"samples": samples, "check": check}
    if not args.cpu:
        graph.close()
    return record


def _capture(n: int, kernels: int) -> Any:
    import jax

    import jaxgraph

    launch_ = jaxgraph.Kernel(SOURCE, "add_one")[(n + BLOCK - 1) // BLOCK, BLOCK]

    def chain(x):  # y = x + 1, then y = y + 1 (kernels - 1 times); y from the graph's pool
        y = jaxgraph.empty(x.shape)
        launch_(y, x, n)
        for _ in range(kernels - 1):
            launch_(y, y, n)
        return y

    return jaxgraph.capture_per_device(chain, [jax.ShapeDtypeStruct((n,), np.float32)])


def _client() -> Any:
    from jax._src import distributed  # the key-value store and barriers of jax.distributed

    return distributed.global_state.client


def _publish_seed(client: Any) -> int:
    """Process 0 draws the input's seed (fresh every run) and tells the others."""
    seed = int(np.random.default_rng().integers(1 << 30))
    client.key_value_set("scaling/seed", str(seed))
    return seed


def _device_name() -> str:
    from benchmarks.harness.worker import device_info

    return device_info()["name"]


# ----------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------


def step_times(records: Sequence[dict], mode: str) -> list[float]:
    """Per round, the slowest process's us per step (a step ends when every process is done)."""
    rounds = zip(*(r["modes"][mode]["samples"] for r in records))
    return [max(values) for values in rounds]


def scaling(groups: dict[int, list[dict]], n: int, figure: bool) -> dict:
    """Per mode: step times of 1 and ``n`` processes, and ``n * t_1 / t_n`` when ``figure``.

    No ratio without one GPU per process (a shared GPU, or the CPU): it would not be a scaling figure.
    """
    out = {}
    for mode in MODES:
        one, many = step_times(groups[1], mode), step_times(groups[n], mode)
        t1, tn = statistics.median(one), statistics.median(many)
        entry = {"step_us_1": stats.summarize(one), f"step_us_{n}": stats.summarize(many)}
        if figure:
            entry.update(ratio=n * t1 / tn, ratio_min=n * min(one) / max(many), ratio_max=n * max(one) / min(many))
            if n == 2:
                entry.update(target=TARGET, met=entry["ratio"] >= TARGET)
        out[mode] = entry
    return out


def markdown(results: dict) -> str:
    n, cfg, shared, cpu = results["n"], results["config"], results["shared_gpu"], results["cpu"]
    figure = not (shared or cpu)
    where = "JAX on the CPU (gloo)" if cpu else results.get("device") or "unknown device"
    lines = [f"# jaxgraph scaling over processes (jax.distributed): {where}", "",
             " · ".join(str(v) for v in (results["date"], f"{cfg['repeats']} rounds of {cfg['steps']} steps",
                                          f"git {results.get('git') or '?'}") if v), ""]
    if shared:
        lines += [f"**{n} processes shared ONE GPU: this run proves the multi-process path works; it is not a "
                  "scaling figure (that needs one GPU per process).**", ""]
    if cpu:
        lines += ["**JAX on the CPU, a pure-JAX loop standing in for the graph: this run checks the launcher, the "
                  "barriers, the checks and this report; it is no GPU figure.**", ""]
    work = (f"a pure-JAX loop adding 1 {cfg['kernels']} times" if cpu
            else f"a chain of {cfg['kernels']} `add_one` kernels, one graph per process's GPU")
    lines += [f"Per process: {work}, over {cfg['elements']} float32. 1 process, then {n} (one group after the "
              "other). Median over rounds of the slowest process's wall time per step; min-max over rounds.", "",
              f"| mode | what | 1 process, us per step | {n} processes, us per step |"
              + (f" throughput {n} / 1 |" if figure else ""), "| --- | --- | ---: | ---: |" + (" ---: |" if figure else "")]
    for mode, r in results["scaling"].items():
        one, many = r["step_us_1"], r[f"step_us_{n}"]
        row = (f"| `{mode}` | {MODES[mode]} | {fmt(one['median'])} ({fmt(one['min'])}-{fmt(one['max'])}) | "
               f"{fmt(many['median'])} ({fmt(many['min'])}-{fmt(many['max'])}) |")
        if figure:
            row += f" **{r['ratio']:.2f}x** ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) |"
        lines.append(row)
    lines.append("")
    for mode, r in results["scaling"].items():
        if "target" in r:
            lines.append(f"- `{mode}`: target >= {r['target']}x on 2 GPUs: {'met' if r['met'] else 'NOT met'}")
    for key in ("checks", "bindings"):
        if results.get(key):
            lines.append(f"- {key}: {results[key]}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        _client().wait_at_barrier("scaling/end", 120_000)  # process 0 hosts the coordinator: leave together
        return 0
    if not args.cpu and _gpu_count() == 0:
        raise SystemExit("no CUDA GPU here: scaling over processes needs one per process (--cpu runs the path "
                         "with JAX on the CPU)")
    n = args.processes or (2 if args.cpu or args.share_gpu else _gpu_count())
    if not args.cpu and not args.share_gpu and _gpu_count() < n:
        raise SystemExit(f"scaling over processes needs {n} GPUs (one per process); found {_gpu_count()}. "
                         "--share-gpu runs the processes on one GPU to check that it works (no figure)")
    platform = "cpu" if args.cpu else "gpu"
    start = time.perf_counter()
    command = [str(Path(__file__).resolve()), "--worker", *argv]
    groups = {}
    for world in (1, n):
        results = process_launcher.launch(command, world, timeout_s=args.timeout, platform=platform,
                                share_gpu=args.share_gpu and world > 1, cwd=str(ROOT))
        text = process_launcher.report(results)
        if any(r.returncode != 0 for r in results):
            print(text)
            raise SystemExit(f"the group of {world} process(es) failed (outputs above)")
        groups[world] = [_result(r, text) for r in results]
    results = {**_meta(argv, args), "n": n, "shared_gpu": args.share_gpu, "cpu": args.cpu,
               "device": groups[1][0].get("device"), "groups": {str(k): v for k, v in groups.items()},
               "scaling": scaling(groups, n, figure=not (args.share_gpu or args.cpu)),
               "checks": groups[n][0]["modes"]["psum"]["check"] + f" on each of {n} processes; the psum is exact",
               "bindings": "; ".join(groups[n][0].get("bindings", [])),
               "wall_s": round(time.perf_counter() - start, 1)}
    paths = _write(results, args)
    print(f"wrote {', '.join(map(str, paths))}\n\n{markdown(results)}")
    return 0


def _result(r: process_launcher.ProcessResult, text: str) -> dict:
    lines = [line for line in r.output.splitlines() if line.startswith("RESULT ")]
    if len(lines) != 1:
        raise SystemExit(f"process {r.rank} printed no result:\n{text}")
    return json.loads(lines[0][len("RESULT "):])


def _gpu_count() -> int:
    import jaxgraph

    return jaxgraph.device_count()


def _meta(argv: list, args: argparse.Namespace) -> dict:
    return {"schema": 1, "benchmark": "scaling_processes",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", "benchmarks/scaling_processes.py", *argv]), "quick": args.quick,
            "config": {k: getattr(args, k) for k in ("elements", "kernels", "steps", "repeats")},
            "env": {k: os.environ.get(k) for k in ("XLA_FLAGS", "CUDA_VISIBLE_DEVICES")},
            "git": provenance.git_commit()}


def _write(results: dict, args: argparse.Namespace) -> list[Path]:
    args.out.mkdir(parents=True, exist_ok=True)
    name = "cpu" if args.cpu else stats.device_slug(results.get("device") or "")
    stem = (name + "-scaling-processes" + ("-shared-gpu" if args.share_gpu else "")
            + ("-quick" if args.quick else ""))
    json_path, md_path = args.out / f"{stem}.json", args.out / f"{stem}.md"
    json_path.write_text(json.dumps(stats.json_ready(results), indent=1) + "\n")
    md_path.write_text(markdown(results))
    return [json_path, md_path]


if __name__ == "__main__":
    sys.exit(main())
