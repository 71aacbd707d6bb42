"""Several devices on the CPU: what a ShardedGraph lowers to inside shard_map and pmap, and its typing.

JAX reads ``--xla_force_host_platform_device_count`` once, when its CPU backend
starts, so the scenarios run in one fresh process with four CPU devices and
report back as JSON; each test checks one scenario. The replays are lowered
for CUDA (``lower(lowering_platforms=("cuda",))``), which needs no GPU; the
graphs are specs only (``internals.spec_sharded``), never captured.

Tests internals (listed in tests/README.md): ``internals.spec_sharded``; shard_map and pmap
lowering over four CPU devices.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCENARIOS = textwrap.dedent(r'''
    import json, re, traceback
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from support.internals import spec_replayable, spec_sharded

    N = 4096
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)

    def sharded(graph_id, n_in=1, devices=(0, 1)):
        return spec_sharded(spec_replayable((f32(N),) * n_in, (f32(N),), graph_id), devices)

    def lower(f, *args):
        return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    def replays(text):
        return [l.strip() for l in text.splitlines() if "stablehlo.custom_call @jaxgraph_replay(" in l]

    def placed(mesh, spec, shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    def axes(x):
        """The mesh axes x varies over, read from its type (jax's spelling of it changed over versions)."""
        aval = jax.typeof(x)
        mat = getattr(aval, "manual_axis_type", None)  # jax >= 0.10; before it, aval.vma
        varying = getattr(mat, "varying", None) if mat is not None else getattr(aval, "vma", None)
        return sorted(varying or ())

    def error(fn):
        try:
            fn()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    devices = jax.devices()
    mesh = jax.make_mesh((2,), ("x",), devices=devices[:2])
    cases = {}

    def case(fn):
        cases[fn.__name__] = fn
        return fn

    @case
    def shard_map_lowering():
        sg = sharded(7)
        f = jax.shard_map(lambda x: sg(x * 2.0) - 1.0, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
        text = lower(f, placed(mesh, P("x"), (2 * N,)))
        body = text[text.index("@jaxgraph_replay") - 2000:text.index("@jaxgraph_replay") + 2000]
        return {"replays": replays(text), "main": re.search(r"func.func public @main\((.*?)\)", text).group(1),
                "partitions": re.search(r"mhlo.num_partitions = (\d+)", text).group(1),
                "order": [body.index("stablehlo.multiply") < body.index("@jaxgraph_replay"),
                          body.index("@jaxgraph_replay") < body.index("stablehlo.subtract")]}

    @case
    def pmap_lowering():
        sg = sharded(8)
        text = lower(jax.pmap(sg, devices=devices[:2]), f32(2, N))
        return {"replays": replays(text), "main": re.search(r"func.func public @main\((.*?)\)", text).group(1)}

    @case
    def results_vary_like_operands():
        sg = sharded(9)
        seen = {}

        def body(x):
            y = sg(x)
            seen["in"], seen["out"] = axes(x), axes(y)
            return y, jax.lax.psum(y, "x")

        text = lower(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P())),
                     placed(mesh, P("x"), (2 * N,)))
        replicated = error(lambda: lower(jax.shard_map(sg, mesh=mesh, in_specs=P("x"), out_specs=P()),
                                         placed(mesh, P("x"), (2 * N,))))
        return {**seen, "all_reduce": "all_reduce" in text, "replicated_out_specs": replicated}

    @case
    def two_axes():
        grid = jax.make_mesh((2, 2), ("a", "b"), devices=devices[:4])
        sg = sharded(10, n_in=2, devices=(0, 1, 2, 3))
        seen = {}

        def body(x, w):
            y = sg(x, w)
            seen["out"] = axes(y)
            return y

        x, w = placed(grid, P("a"), (2 * N,)), placed(grid, P(), (N,))
        text = lower(jax.shard_map(body, mesh=grid, in_specs=(P("a"), P()), out_specs=P("a")), x, w)
        out = seen["out"]
        both = placed(grid, P(("a", "b")), (4 * N,))
        varies_over_b = error(lambda: lower(jax.shard_map(body, mesh=grid, in_specs=(P(("a", "b")), P()),
                                                          out_specs=P("a")), both, w))
        return {"replays": replays(text), "out": out, "both": seen["out"], "varies_over_b": varies_over_b}

    @case
    def check_vma_off():
        sg = sharded(11)
        f = jax.shard_map(sg, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
        return {"replays": replays(lower(f, placed(mesh, P("x"), (2 * N,))))}

    @case
    def vmap_inside_shard_map():
        sg = sharded(12)
        f = jax.shard_map(jax.vmap(sg), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
        text = lower(f, placed(mesh, P("x"), (6, N)))
        return {"replays": replays(text), "while": "stablehlo.while" in text}

    @case
    def run_on_cpu_devices():
        sg = sharded(13)
        f = jax.jit(jax.shard_map(sg, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
        x = jax.device_put(np.arange(2 * N, dtype=np.float32), NamedSharding(mesh, P("x")))
        return {"error": error(lambda: jax.block_until_ready(f(x)))}

    @case
    def mesh_devices_are_checked():
        sg = sharded(14)
        return {"check": error(lambda: sg.check_devices(mesh)),
                "shard_map": error(lambda: sg.shard_map(mesh, P("x"), P("x"))),
                "eager": error(lambda: sg(jnp.zeros(N, jnp.float32)))}

    results = {}
    for name, fn in cases.items():
        try:
            results[name] = fn()
        except Exception:
            results[name] = {"crashed": traceback.format_exc()}
    print("RESULTS " + json.dumps(results))
''')


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.path.dirname(os.path.dirname(__file__)), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SCENARIOS], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"scenarios failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    (line,) = [l for l in proc.stdout.splitlines() if l.startswith("RESULTS ")]
    return json.loads(line[len("RESULTS "):])


def scenario(results, name):
    result = results[name]
    assert "crashed" not in result, result.get("crashed")
    return result


def test_one_replay_per_shard_program_on_the_shard_shape(results):
    r = scenario(results, "shard_map_lowering")
    (line,) = r["replays"]                      # one call in the program every device runs
    assert "(tensor<4096xf32>) -> tensor<4096xf32>" in line   # a shard, not the global array
    assert "tensor<8192xf32>" in r["main"]      # the global operand outside shard_map
    assert "graph = 7 : i64" in line and "call = " in line
    assert r["partitions"] == "2"
    assert r["order"] == [True, True]           # the XLA ops around it stay in order, per shard


def test_pmap_lowers_the_same_call_on_the_per_device_slice(results):
    r = scenario(results, "pmap_lowering")
    (line,) = r["replays"]
    assert "(tensor<4096xf32>) -> tensor<4096xf32>" in line and "graph = 8 : i64" in line
    assert "tensor<2x4096xf32>" in r["main"]


def test_results_vary_over_the_mesh_axes_of_their_operands(results):
    r = scenario(results, "results_vary_like_operands")
    assert r["in"] == ["x"] and r["out"] == ["x"]
    assert r["all_reduce"]  # psum of per-device results is a real reduction, not a multiply
    # Declaring the per-device results replicated is refused by shard_map's check.
    assert r["replicated_out_specs"] and "replicat" in r["replicated_out_specs"]


def test_results_vary_only_over_the_axes_the_operands_vary_over(results):
    r = scenario(results, "two_axes")
    (line,) = r["replays"]
    assert "(tensor<4096xf32>, tensor<4096xf32>) -> tensor<4096xf32>" in line
    assert r["out"] == ["a"]  # w is replicated over both axes, x split over a only
    assert r["both"] == ["a", "b"]
    assert r["varies_over_b"] and "b" in r["varies_over_b"]  # x split over a and b: out_specs must say b


def test_shard_map_without_vma_checks_and_vmap_inside_it(results):
    (line,) = scenario(results, "check_vma_off")["replays"]
    assert "(tensor<4096xf32>) -> tensor<4096xf32>" in line
    r = scenario(results, "vmap_inside_shard_map")
    assert r["while"] and len(r["replays"]) == 1  # 3 rows per shard, replayed in sequence
    assert "(tensor<4096xf32>) -> tensor<4096xf32>" in r["replays"][0]


def test_running_on_cpu_devices_is_a_clear_error(results):
    r = scenario(results, "run_on_cpu_devices")
    assert r["error"] and "runs on JAX's CUDA backend" in r["error"], r


def test_cpu_devices_are_refused_before_anything_runs(results):
    r = scenario(results, "mesh_devices_are_checked")
    for key in ("check", "shard_map"):
        assert r[key].startswith("ValueError") and "is a cpu device" in r[key], r[key]
    assert r["eager"].startswith("ValueError") and "a cpu device" in r["eager"], r["eager"]
