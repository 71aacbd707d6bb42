"""ShardedGraph on the CPU: device lookup, argument errors and lifetime, with no device needed.

The graphs here are specs (``internals.spec_sharded``), never captured; shard_map
and pmap lowering over several devices is in test_sharded_lowering.py, and the
replays on two GPUs in test_sharded_gpu.py.

Tests internals (listed in tests/README.md): ``internals.spec_sharded``,
``_jax_interop.sharded.cuda_ordinal``, ``device_ordinals``, ``_replay_boundary.varying_axes``, ``result_shapes``;
sharded specs on a CPU.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from jaxgraph._jax_interop import replay_boundary as _replay_boundary
from jaxgraph._jax_interop.sharded import cuda_ordinal, device_ordinals
from support.internals import ShardedGraph, spec_replayable, spec_sharded

HAS_GPU = jaxgraph.device_count() > 0


def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def make_sharded(devices=(0, 1), graph_id=5):
    return spec_sharded(spec_replayable((f32(64),), (f32(64),), graph_id), devices)


def gpu(ordinal, process=0):
    """A stand-in for a JAX GPU device: what cuda_ordinal reads."""
    return types.SimpleNamespace(platform="gpu", local_hardware_id=ordinal, process_index=process)


# ---------------------------------------------------------------------------
# Which device: JAX devices to CUDA ordinals
# ---------------------------------------------------------------------------


def test_cuda_ordinal_of_ints_and_jax_gpu_devices():
    assert cuda_ordinal(3) == 3 and cuda_ordinal(np.int64(1)) == 1
    assert cuda_ordinal(gpu(2)) == 2  # local_hardware_id: the ordinal XLA hands the FFI call
    assert cuda_ordinal(types.SimpleNamespace(platform="cuda", local_hardware_id=0, process_index=0)) == 0


@pytest.mark.parametrize("device, exc, match", [
    (True, TypeError, "CUDA ordinal or a JAX device, got True"),
    ("cuda:0", TypeError, "got str"),
    (-1, ValueError, "ordinal is >= 0, got -1"),
    (types.SimpleNamespace(platform="cpu", local_hardware_id=0, process_index=0), ValueError,
     "is a cpu device: jaxgraph graphs live on CUDA GPUs"),
    (gpu(1, process=3), ValueError, "belongs to process 3, this is process 0"),
    (types.SimpleNamespace(platform="gpu", local_hardware_id=None, process_index=0), ValueError,
     "no local_hardware_id"),
])
def test_cuda_ordinal_errors(device, exc, match):
    with pytest.raises(exc, match=match):
        cuda_ordinal(device)


def test_device_ordinals_of_sequences_single_devices_and_meshes():
    assert device_ordinals([gpu(1), 0]) == (1, 0)  # capture order is the caller's
    assert device_ordinals(gpu(2)) == (2,) and device_ordinals(4) == (4,)
    assert device_ordinals(range(2)) == (0, 1)
    mesh_like = types.SimpleNamespace(devices=np.array([[gpu(0), gpu(1)], [gpu(2), gpu(3)]]), axis_names=("a", "b"))
    assert device_ordinals(mesh_like) == (0, 1, 2, 3)


@pytest.mark.parametrize("devices, exc, match", [
    ([], ValueError, "devices is empty"),
    ([0, gpu(0), 1], ValueError, r"device\(s\) 0 given more than once"),
    (2.5, TypeError, "devices must be a Mesh, a device or a sequence of devices, got float"),
])
def test_device_ordinals_errors(devices, exc, match):
    with pytest.raises(exc, match=match):
        device_ordinals(devices)


def test_check_devices_names_the_devices_without_a_graph():
    sg = make_sharded(devices=(0, 1))
    assert sg.check_devices([gpu(1), gpu(0)]) == (1, 0)
    with pytest.raises(ValueError, match=r"no graph for devices 2, 3: this ShardedGraph was captured on "
                                         r"device\(s\) 0, 1; capture it on every device"):
        sg.check_devices([gpu(0), gpu(1), gpu(2), gpu(3)])
    with pytest.raises(ValueError, match="no graph for device 5: this ShardedGraph has device"):
        sg.graph(5)
    with pytest.raises(ValueError, match="no graph for device 2"):
        sg.inputs(gpu(2))


def test_introspection_and_repr():
    sg = make_sharded(devices=(1, 0), graph_id=9)
    assert sg.devices == (1, 0) and sg.graph_id == 9 and sg.alive
    assert sg.in_shapes == (f32(64),) and sg.out_shapes == (f32(64),)
    assert isinstance(sg.replayable, jaxgraph.Replayable) and sg.outputs(0) == ()
    assert repr(sg) == "<jaxgraph.ShardedGraph (float32[64]) -> (float32[64]) on devices 1, 0 graph=9 alive>"


# ---------------------------------------------------------------------------
# Errors that need no device
# ---------------------------------------------------------------------------


def test_sharded_graph_is_built_by_its_factory():
    with pytest.raises(RuntimeError, match=r"jaxgraph.capture_per_device\(\.\.\.\)"):
        jaxgraph.ShardedGraph()
    with pytest.raises(ValueError, match="at least one device"):
        ShardedGraph._create(make_sharded().replayable, {})


def test_capture_per_device_argument_errors_come_before_any_device_work():
    shapes = [f32(8)]
    with pytest.raises(TypeError, match="fn must be callable .* got int"):
        jaxgraph.capture_per_device(3, shapes, devices=[0])
    with pytest.raises(TypeError, match=r"in_shapes must be a list of jax.ShapeDtypeStruct .* got ShapeDtypeStruct"):
        jaxgraph.capture_per_device(lambda x: x, f32(8), devices=[0])
    with pytest.raises(TypeError, match=r"in_shapes\[1\] must have a shape and a dtype .* got int"):
        jaxgraph.capture_per_device(lambda x: x, [f32(8), 3], devices=[0])
    with pytest.raises(TypeError, match="backward must be callable"):
        jaxgraph.capture_per_device(lambda x: x, shapes, devices=[0], backward="no")
    with pytest.raises(ValueError, match="bind must be one of 'auto', 'copy', got 'never'"):
        jaxgraph.capture_per_device(lambda x: x, shapes, devices=[0], bind="never")
    with pytest.raises(ValueError, match="capture_error_mode must be one of"):
        jaxgraph.capture_per_device(lambda x: x, shapes, devices=[0], capture_error_mode="loose")
    with pytest.raises(ValueError, match=r"device\(s\) 1 given more than once"):
        jaxgraph.capture_per_device(lambda x: x, shapes, devices=[1, 1])


@pytest.mark.skipif(HAS_GPU, reason="on a GPU machine the capture would run")
def test_capture_per_device_without_cuda_is_one_clear_error():
    with pytest.raises(jaxgraph.CudaUnavailableError, match="no CUDA"):
        jaxgraph.capture_per_device(lambda x: x, [f32(8)])


def test_close_is_idempotent_and_calls_afterwards_raise():
    sg = make_sharded()
    sg.close()
    sg.close()
    assert not sg.alive and "closed" in repr(sg)
    for call in (lambda: sg(jnp.zeros(64)), lambda: sg.replay(), lambda: sg.check_devices([0])):
        with pytest.raises(RuntimeError, match="was closed; capture again with jaxgraph.capture_per_device"):
            call()
    with pytest.raises(RuntimeError, match="closed"):
        jax.eval_shape(sg.replayable, f32(64))  # the replayable went with it


def test_eager_call_on_an_array_of_another_platform_is_refused():
    sg = make_sharded()
    with pytest.raises(ValueError, match=r"argument 0 is on \S+, a cpu device: a ShardedGraph replays on CUDA"):
        sg(jax.device_put(jnp.zeros(64, jnp.float32), jax.devices("cpu")[0]))


def test_shapes_are_checked_at_trace_time_as_for_a_replayable():
    sg = make_sharded()
    with pytest.raises(ValueError, match=r"replayable input 0: expected shape \(64,\)"):
        jax.eval_shape(sg, f32(128))  # e.g. the global array instead of one shard
    out = jax.eval_shape(sg, f32(64))
    assert (out.shape, out.dtype) == ((64,), jnp.float32)


def test_outside_shard_map_the_results_are_plain_shapes():
    assert _replay_boundary.varying_axes((jnp.zeros(3), np.zeros(2), 1.0)) == frozenset()
    outs = (f32(4), jax.ShapeDtypeStruct((2,), jnp.int32))
    assert _replay_boundary.result_shapes(outs, frozenset()) == list(outs)
