"""Several GPUs: per-device graphs replayed inside shard_map and pmap, checked against numpy.

Needs two CUDA devices (skipped with "needs 2 CUDA devices" on one). Each
device's graph adds a device-dependent constant (1000 x its ordinal), so a
shard replayed with another device's graph cannot pass. Inputs are fresh
random integers stored as float32 (exact arithmetic, exact comparisons), in new
buffers on every call, and static outputs are poisoned (NaN) before each run.
Command buffers on and off are compared in subprocesses (XLA_FLAGS must be set
before JAX starts).

Reads through ``jaxgraph.diagnostics``: the calls per replay path on each device (``counters``), live
graphs (``native_module``) and pools (``memory_pool``), to check what is freed.
"""

import gc
import os
import textwrap
import weakref

import numpy as np
import pytest

# Leave device memory to jaxgraph's allocations too (set before JAX's backend starts).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jaxgraph  # noqa: E402
from jaxgraph.diagnostics import counters, memory_pool, native_module  # noqa: E402
from support.kernel_sources import ADD, AXPB, INC  # noqa: E402
from support.graph_helpers import driver_call, jax_gpus, launched, path_calls, run_xla_worker  # noqa: E402

pytestmark = pytest.mark.gpu

MiB = 1 << 20
N = 4096

SRC = AXPB + INC + ADD


@pytest.fixture(scope="module")
def gpus():
    """The first two JAX GPU devices (skip with a reason on a machine with one).

    This module runs only where jaxgraph sees a CUDA device, so a JAX without
    a GPU backend there is a broken install: fail, never skip.
    """
    local = jax_gpus()
    if jaxgraph.device_count() < 2 or len(local) < 2:
        pytest.skip(f"needs 2 CUDA devices (this machine has {min(jaxgraph.device_count(), len(local))})")
    return local[:2]


@pytest.fixture(scope="module")
def mesh(gpus):
    return Mesh(np.array(gpus), ("x",))


@pytest.fixture(scope="module")
def k():
    kernels = {name: jaxgraph.Kernel(SRC, name) for name in ("axpb", "inc", "add")}
    for kernel in kernels.values():
        kernel.handle  # noqa: B018 - load before capture
    return kernels


def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def chain(k, n=N, launches=10):
    """Per device: y = 2 x + 1000 * device, then y += 1 (launches - 1) times; y from the graph's pool."""
    def fn(x):
        device = jaxgraph.current_device()
        y = jaxgraph.empty(x.shape)
        k["axpb"][(n + 255) // 256, 256](y, x, 2.0, 1000.0 * device, n)
        for _ in range(launches - 1):
            k["inc"][(n + 255) // 256, 256](y, n)
        return y
    return fn


def chain_ref(x, device, launches=10):
    return np.float32(2) * x + np.float32(1000 * device) + np.float32(launches - 1)


def ints(rng, n):
    """Fresh random integers as float32: every result below is exact."""
    return rng.integers(-1000, 1000, n).astype(np.float32)


def poison_outputs(sg):
    for d in sg.devices:
        for out in sg.outputs(d):
            out.fill_(np.float32(np.nan))
        jaxgraph.synchronize(d)


def check_shards(out, x, launches=10):
    """Every shard of ``out`` equals numpy on its slice of ``x``, with its own device's constant."""
    seen = set()
    for shard in out.addressable_shards:
        device = shard.device.local_hardware_id
        seen.add(device)
        np.testing.assert_array_equal(np.asarray(shard.data), chain_ref(x[shard.index], device, launches),
                                      err_msg=f"shard on device {device}")
    return seen


def free_bytes(device):
    """Free memory on ``device`` once its work has finished (cuMemGetInfo in its context)."""
    jaxgraph.synchronize(device)  # also makes the device's primary context current on this thread
    return int(driver_call("cuMemGetInfo")[0])


def live_graphs():
    gc.collect()
    return native_module("replay").live_graphs()


# ---------------------------------------------------------------------------
# Replay under shard_map and pmap
# ---------------------------------------------------------------------------


def test_shard_map_replays_each_devices_own_graph_on_its_shard(k, gpus, mesh, rng):
    sg = jaxgraph.capture_per_device(chain(k), [f32(N)], devices=gpus)
    assert sg.devices == tuple(d.local_hardware_id for d in gpus)
    f = sg.shard_map(mesh, P("x"), P("x"))
    sharding = NamedSharding(mesh, P("x"))
    for _ in range(4):  # fresh inputs in new buffers: each device rebinds its own graph
        x = ints(rng, 2 * N)
        poison_outputs(sg)
        out = f(jax.device_put(x, sharding))
        assert out.shape == (2 * N,)
        assert check_shards(out, x) == set(sg.devices)


def test_pmap_replays_each_devices_own_graph_on_its_row(k, gpus, rng):
    sg = jaxgraph.capture_per_device(chain(k, launches=3), [f32(N)], devices=gpus)
    f = jax.pmap(sg, devices=gpus)
    for _ in range(3):
        x = ints(rng, 2 * N).reshape(2, N)
        poison_outputs(sg)
        out = np.asarray(f(x))
        for row, device in enumerate(gpus):
            np.testing.assert_array_equal(out[row], chain_ref(x[row], device.local_hardware_id, 3),
                                          err_msg=f"row {row} on {device}")


def test_replay_between_xla_ops_and_a_collective(k, gpus, mesh, rng):
    sg = jaxgraph.capture_per_device(chain(k), [f32(N)], devices=gpus)

    def step(x, w):
        y = sg(x + w)                       # w is replicated: the sum varies over x as x does
        return y * 2.0, jax.lax.psum(jnp.sum(y), "x")

    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("x"), P()), out_specs=(P("x"), P())))
    for _ in range(3):
        x, w = ints(rng, 2 * N), ints(rng, N)
        doubled, total = f(jax.device_put(x, NamedSharding(mesh, P("x"))), w)
        halves = [chain_ref(x[i * N:(i + 1) * N] + w, d.local_hardware_id) for i, d in enumerate(gpus)]
        np.testing.assert_array_equal(np.asarray(doubled), 2 * np.concatenate(halves))
        np.testing.assert_allclose(float(total), sum(h.sum(dtype=np.float64) for h in halves), rtol=1e-6)


def test_default_devices_are_the_local_gpus_jax_uses(k, rng):
    local = jax_gpus()
    sg = jaxgraph.capture_per_device(chain(k, launches=2), [f32(N)])
    assert sg.devices == tuple(d.local_hardware_id for d in local)
    for d in local:  # eager: each array replays on the device it lives on
        x = ints(rng, N)
        out = sg(jax.device_put(x, d))
        np.testing.assert_array_equal(np.asarray(out), chain_ref(x, d.local_hardware_id, 2))


# ---------------------------------------------------------------------------
# Zero-copy binding per device
# ---------------------------------------------------------------------------


def test_each_device_binds_xla_buffers_without_copies(k, gpus, mesh, rng):
    sg = jaxgraph.capture_per_device(chain(k), [f32(N)], devices=gpus)
    for d in sg.devices:
        assert [(b.kind, b.mode) for b in sg.bindings[d]] == [("input", "bound"), ("output", "bound")], sg.bindings
    for d in sg.devices:  # a bound buffer is never touched: the poison stays
        sg.inputs(d)[0].fill_(np.float32(np.nan))
    poison_outputs(sg)
    f = sg.shard_map(mesh, P("x"), P("x"))
    before = counters()
    calls = 5
    for _ in range(calls):
        x = ints(rng, 2 * N)
        check_shards(f(jax.device_put(x, NamedSharding(mesh, P("x")))), x)
    after = counters()
    assert after["copy"] == before["copy"]
    # JAX's defaults leave a lone custom call out of command buffers: launched on both devices, every call.
    assert path_calls(before, after) == launched(2 * calls), (before, after)
    for d in sg.devices:
        assert np.isnan(sg.inputs(d)[0].numpy()).all() and np.isnan(sg.outputs(d)[0].numpy()).all()


# ---------------------------------------------------------------------------
# Errors: a device without a graph, arrays on the wrong device
# ---------------------------------------------------------------------------


def test_a_device_without_a_graph_is_a_clear_error(k, gpus, mesh, rng):
    d0, d1 = (d.local_hardware_id for d in gpus)
    sg = jaxgraph.capture_per_device(chain(k, launches=2), [f32(N)], devices=[gpus[0]])
    with pytest.raises(ValueError, match=rf"no graph for device {d1}: this ShardedGraph was captured on "
                                         rf"device\(s\) {d0}"):
        sg.shard_map(mesh, P("x"), P("x"))
    # Unchecked, the call reaches device 1's handler, which refuses (no crash, no wrong launch).
    f = jax.jit(jax.shard_map(sg, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    x = ints(rng, 2 * N)
    with pytest.raises(Exception, match=rf"was not captured for device {d1} \(it has graphs for devices {d0}\)"):
        jax.block_until_ready(f(jax.device_put(x, NamedSharding(mesh, P("x")))))
    # Eagerly, an array on device 1 is refused before anything runs ...
    with pytest.raises(ValueError, match=rf"argument 0 is on .* \(CUDA device {d1}\), which has no graph"):
        sg(jax.device_put(x[:N], gpus[1]))
    # ... and device 0 still works.
    np.testing.assert_array_equal(np.asarray(sg(jax.device_put(x[:N], gpus[0]))), chain_ref(x[:N], d0, 2))


def test_outputs_on_another_device_are_refused_and_nothing_leaks(k, gpus):
    d0, d1 = (d.local_hardware_id for d in gpus)
    jaxgraph.set_device(d0)
    stray = jaxgraph.zeros(N)  # on device 0, returned as device 1's output too

    def returns_stray(x):
        y = jaxgraph.empty(N)
        k["axpb"][N // 256, 256](y, x, 1.0, 0.0, N)
        return stray

    def writes_stray(x):
        k["axpb"][N // 256, 256](stray, x, 1.0, 0.0, N)
        return stray

    live = live_graphs()
    with pytest.raises(ValueError, match=rf"capture_per_device, device {d1}: outputs\[0\] is on device {d0}, "
                                         rf"the graph on device {d1}"):
        jaxgraph.capture_per_device(returns_stray, [f32(N)], devices=gpus)
    assert live_graphs() == live  # device 0's graph was retired with the failed capture
    assert jaxgraph.current_device() == d0
    # A launch writing the stray array on device 1 is refused at the launch, before any output check.
    with pytest.raises(ValueError, match=rf"capture_per_device, device {d1}: kernel axpb: argument 'y' "
                                         rf"\(float\*\) is on device {d0}, but the launch runs on device {d1}"):
        jaxgraph.capture_per_device(writes_stray, [f32(N)], devices=gpus)
    assert live_graphs() == live
    assert jaxgraph.current_device() == d0


def test_a_capture_that_launches_nothing_names_the_device(gpus):
    with pytest.raises(RuntimeError, match=f"fn launched nothing on device {gpus[0].local_hardware_id}"):
        jaxgraph.capture_per_device(lambda x: jaxgraph.empty(x.shape), [f32(N)], devices=gpus)


# ---------------------------------------------------------------------------
# Memory and lifetime per device
# ---------------------------------------------------------------------------


def test_destroying_the_sharded_graph_frees_every_devices_memory(k, gpus, rng):
    m = 8 * MiB  # float32 elements: 32 MiB per array, far above allocator noise
    blocks = m // 256

    def fn(x):
        tmp = jaxgraph.empty(x.shape)  # the graph's pool on this device
        y = jaxgraph.empty(x.shape)
        k["axpb"][blocks, 256](tmp, x, 2.0, 1.0, m)
        k["add"][blocks, 256](y, tmp, x, m)
        return y

    ordinals = [d.local_hardware_id for d in gpus]
    live = live_graphs()
    base = {d: free_bytes(d) for d in ordinals}
    sg = jaxgraph.capture_per_device(fn, [f32(m)], devices=gpus)
    assert live_graphs() == live + 2
    for d in ordinals:  # static input, pool temporary and output on each device: 96 MiB
        assert base[d] - free_bytes(d) >= 80 * MiB, (d, base[d] - free_bytes(d))
    for d in ordinals:  # replayed from the host, each device's graph computes on its own arrays
        x = rng.integers(-1000, 1000, m).astype(np.float32)
        sg.inputs(d)[0].copy_(x)
        sg.outputs(d)[0].fill_(np.float32(np.nan))
        sg.replay(d)
        np.testing.assert_array_equal(sg.outputs(d)[0].numpy(), 3 * x + 1)
    del sg
    assert live_graphs() == live
    for d in ordinals:
        assert free_bytes(d) >= base[d] - 8 * MiB, (d, base[d] - free_bytes(d))


def test_pools_go_with_the_last_reference_after_jit(k, gpus, mesh, rng):
    sg = jaxgraph.capture_per_device(chain(k), [f32(N)], devices=gpus)
    pools = [weakref.ref(memory_pool(sg.graph(d).pool())) for d in sg.devices]
    assert len({p().device for p in pools}) == 2  # one pool per device
    f = sg.shard_map(mesh, P("x"), P("x"))
    x = ints(rng, 2 * N)
    check_shards(f(jax.device_put(x, NamedSharding(mesh, P("x")))), x)
    jax.clear_caches()  # earlier tests' compiled functions (and their graphs) go first
    live = live_graphs()
    del f, sg
    jax.clear_caches()
    assert live_graphs() == live - 2
    assert all(p() is None for p in pools)


def test_close_retires_every_device_at_once(k, gpus, mesh, rng):
    sg = jaxgraph.capture_per_device(chain(k, launches=2), [f32(N)], devices=gpus)
    f = jax.jit(jax.shard_map(sg, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    x = jax.device_put(ints(rng, 2 * N), NamedSharding(mesh, P("x")))
    jax.block_until_ready(f(x))
    live = live_graphs()
    sg.close()
    assert not sg.alive and live_graphs() == live - 2
    with pytest.raises(RuntimeError, match="was closed"):
        sg(x)
    # The compiled function reaches the handler, which refuses (a lone replay is not
    # recorded into a command buffer under JAX's default flags).
    with pytest.raises(Exception, match="jaxgraph_replay: graph .* was reset or destroyed"):
        jax.block_until_ready(f(x))


# ---------------------------------------------------------------------------
# XLA command buffers on and off, in fresh processes
# ---------------------------------------------------------------------------

WORKER = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jaxgraph

    src, seed, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    n = 4096
    axpb, inc = (jaxgraph.Kernel(open(src).read(), name) for name in ("axpb", "inc"))
    gpus = jax.local_devices(backend="gpu")[:2]
    mesh = Mesh(np.array(gpus), ("x",))

    def fn(x):  # y = 2 x + 1000 * device + 99 on each device
        y = jaxgraph.empty(x.shape)
        axpb[16, 256](y, x, 2.0, 1000.0 * jaxgraph.current_device(), n)
        for _ in range(99):
            inc[16, 256](y, n)
        return y

    sg = jaxgraph.capture_per_device(fn, [jax.ShapeDtypeStruct((n,), jnp.float32)], devices=gpus)

    def step(x, z):
        h = sg(x * 0.5 + 1.0)             # fusion -> replay
        return h * z + 3.0                # -> fusion

    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
    split = NamedSharding(mesh, P("x"))
    rng = np.random.default_rng(seed)
    results = []
    for _ in range(4):  # fresh input buffers each call
        x, z = rng.standard_normal(2 * n).astype(np.float32), rng.standard_normal(2 * n).astype(np.float32)
        results.append(np.asarray(f(jax.device_put(x, split), jax.device_put(z, split))))
    # The replay bound straight to the parameters, rotating over inputs: XLA
    # re-records each device's command buffer with each new address.
    direct = jax.jit(jax.shard_map(sg, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    inputs = [rng.integers(-1000, 1000, 2 * n).astype(np.float32) for _ in range(3)]
    placed = [jax.device_put(x, split) for x in inputs]
    offsets = np.repeat(1000.0 * np.array([d.local_hardware_id for d in gpus], np.float32), n)
    for i in range(6):
        got, want = np.asarray(direct(placed[i % 3])), 2 * inputs[i % 3] + offsets + 99
        if not np.array_equal(got, want):
            raise SystemExit(f"direct replay {i} wrong: got {got[n - 2:n + 2]}, want {want[n - 2:n + 2]}")
    np.save(out_path, np.stack(results))
    print("REPORT " + json.dumps({"calls": counters(), "devices": [d.local_hardware_id for d in gpus]}))
''')

def run_worker(tmp_path, mode, seed):
    return run_xla_worker(WORKER, SRC, tmp_path, mode, seed)


def test_command_buffers_on_and_off_agree_on_every_device(gpus, tmp_path, rng):
    seed = int(rng.integers(2**31))
    off, off_report = run_worker(tmp_path, "off", seed)
    on, on_report = run_worker(tmp_path, "on", seed)
    offsets = np.repeat(1000.0 * np.array(off_report["devices"], np.float32), N)
    data = np.random.default_rng(seed)
    for i in range(4):
        x, z = data.standard_normal(2 * N).astype(np.float32), data.standard_normal(2 * N).astype(np.float32)
        h = np.float32(2) * (x * np.float32(0.5) + np.float32(1)) + offsets
        for _ in range(99):  # the graph's float32 additions, one by one
            h = h + np.float32(1)
        for got in (off, on):
            np.testing.assert_allclose(got[i], h * z + 3, rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(on, off)
    # Off: both devices launch their graph on every one of the 10 calls; nothing is spliced.
    assert path_calls({}, off_report["calls"]) == launched(2 * 10), off_report
    # On: each device's XLA command buffer recorded its own graph node by node, never whole.
    on_paths = path_calls({}, on_report["calls"])
    assert on_paths["splice_nodes"] >= 2 and on_paths["splice_whole"] == on_paths["uncaptured_launch"] == 0, on_report
