"""jaxgraph.diagnostics, the door tests and benchmarks use into the internals: what each entry returns,
the errors it raises, and that settings and stand-ins are put back.

The replay handler's entries (counters, capture policy, describe_graph) are tested where the replays
are (jax_interop/); here the entries for what jaxgraph holds, the loop settings and the stand-ins for
a machine without a GPU. CPU tests first, then the GPU ones.
"""

import gc
import weakref

import numpy as np
import pytest

import jaxgraph
from jaxgraph import diagnostics
from support.kernel_sources import ADD_ONE

N = 4096


@pytest.fixture(scope="module")
def add_one(tmp_path_factory):
    return jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path_factory.mktemp("cubins"))


# ---------------------------------------------------------------------------
# On a CPU
# ---------------------------------------------------------------------------


def test_everything_listed_is_documented_and_importable():
    for name in diagnostics.__all__:
        obj = getattr(diagnostics, name)
        assert (obj.__doc__ or "").strip(), name


def test_native_module_names_the_three_extensions():
    with pytest.raises(ValueError, match="'replay', 'launch' and 'device_loop'"):
        diagnostics.native_module("replay_knobs")


def test_memory_pool_refuses_what_is_no_pool_token():
    with pytest.raises(TypeError, match="got int"):
        diagnostics.memory_pool(3)
    missing = (0, 10**9)
    assert missing[1] not in diagnostics.live_pool_ids()
    with pytest.raises(ValueError, match=r"pool \(0, 1000000000\) no longer exists"):
        diagnostics.memory_pool(missing)


def test_graph_template_needs_a_captured_graph():
    with pytest.raises(TypeError, match="got str"):
        diagnostics.graph_template("g")
    for graph in (jaxgraph.CUDAGraph(), jaxgraph.CUDAGraph(keep_graph=True)):
        with pytest.raises(RuntimeError, match="holds no captured graph"):
            diagnostics.graph_template(graph)


def test_no_capture_is_underway_outside_one():
    assert diagnostics.captures_underway() is False


def test_kernel_id_follows_the_code(add_one, tmp_path):
    again = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    other = jaxgraph.Kernel(ADD_ONE.replace("1.0f", "2.0f"), "add_one", arch="sm_90", cache_dir=tmp_path)
    kid = diagnostics.kernel_id(add_one)
    assert isinstance(kid, int) and kid > 0
    assert diagnostics.kernel_id(again) == kid != diagnostics.kernel_id(other)


def test_describe_loop_refuses_what_is_no_loop():
    with pytest.raises(TypeError, match="expects a jaxgraph.GraphedLoop, got CUDAGraph"):
        diagnostics.describe_loop(jaxgraph.CUDAGraph())


def test_loop_settings_apply_inside_the_block_and_are_put_back():
    with diagnostics.loop_settings() as before:
        pass
    assert isinstance(before, diagnostics.LoopSettings)
    flipped = dict(fused_copy_bytes=before.fused_copy_bytes + 512, pdl_checks={"twin", "in_place"} - before.pdl_checks,
                   pdl_watch=not before.pdl_watch, retarget_gradients=not before.retarget_gradients)
    with diagnostics.loop_settings(**flipped) as inside:
        with diagnostics.loop_settings() as seen:
            assert seen == inside
        assert inside == before._replace(**{**flipped, "pdl_checks": frozenset(flipped["pdl_checks"])})
        with diagnostics.loop_settings(pdl_watch=before.pdl_watch) as one:   # one setting; the others kept
            assert one == inside._replace(pdl_watch=before.pdl_watch)
    with pytest.raises(KeyError):
        with diagnostics.loop_settings(fused_copy_bytes=0):
            raise KeyError("an error inside the block")
    with diagnostics.loop_settings() as after:
        assert after == before


@pytest.mark.parametrize("kwargs, error, match", [
    ({"fused_copy_bytes": -1}, ValueError, "fused_copy_bytes must be an int >= 0, got -1"),
    ({"fused_copy_bytes": True}, ValueError, "fused_copy_bytes must be an int >= 0, got True"),
    ({"pdl_checks": {"fused", "swap"}}, ValueError, r"\['swap'\] are not exact-stop layouts; they are "
                                                     r"\['fused', 'in_place', 'twin'\]"),
    ({"pdl_checks": "fused"}, TypeError, "a collection of layouts, got the str 'fused'"),
    ({"pdl_watch": 1}, TypeError, "pdl_watch must be a bool, got int"),
    ({"retarget_gradients": "yes"}, TypeError, "retarget_gradients must be a bool, got str"),
])
def test_loop_settings_errors_name_the_value(kwargs, error, match):
    with diagnostics.loop_settings() as before:
        pass
    with pytest.raises(error, match=match):
        with diagnostics.loop_settings(**kwargs):
            pass
    with diagnostics.loop_settings() as after:
        assert after == before  # nothing applied


def test_device_array_at_is_the_address_as_given():
    owner = object()
    a = diagnostics.device_array_at(0x7000_0100, (3, 5), np.float64, device=1, owner=owner)
    assert (a.ptr, a.shape, a.dtype, a.device, a.owner, a.nbytes) == (0x7000_0100, (3, 5), np.dtype(np.float64), 1,
                                                                       owner, 120)
    b = diagnostics.device_array_at(0x7000_0000, np.int64(16))
    assert (b.shape, b.dtype, b.device, b.owner) == ((16,), np.dtype(np.float32), 0, None)
    assert b.reshape(4, 4).ptr == 0x7000_0000


def test_stream_at_makes_no_driver_call():
    s = diagnostics.stream_at(0x1234, device=2)
    assert (int(s), s.device, s.is_legacy_default) == (0x1234, 2, False)


def test_launches_without_driver_do_the_host_work_and_are_put_back(add_one):
    s = diagnostics.stream_at(0x1234)
    x = diagnostics.device_array_at(0x7000_0000, N)
    y = diagnostics.device_array_at(0x7000_4000, N)
    if not jaxgraph.device_count():  # here a launch outside the block needs the driver, and says so
        with pytest.raises(jaxgraph.CudaUnavailableError):
            add_one[N // 256, 256, 0, s](y, x, N)
    with diagnostics.launches_without_driver(add_one):
        add_one[N // 256, 256, 0, s](y, x, N)
        add_one.launch(y, x, np.int32(N), grid=N // 256, block=256, stream=s)
        with pytest.raises(TypeError):  # the argument checks still run
            add_one[N // 256, 256, 0, s](y, 1.5, N)
        with pytest.raises(ValueError):
            add_one[N // 256, 2048, 0, s](y, x, N)  # over the device's 1024 threads per block
    if not jaxgraph.device_count():
        with pytest.raises(jaxgraph.CudaUnavailableError):
            add_one[N // 256, 256, 0, s](y, x, N)  # the configuration kept inside is prepared again


# ---------------------------------------------------------------------------
# On the GPU
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_captures_pools_and_template_of_a_real_capture(rng):
    kernel = jaxgraph.Kernel(ADD_ONE, "add_one")
    data = rng.standard_normal(N).astype(np.float32)
    x, y = jaxgraph.asarray(data), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph(keep_graph=True)
    gc.collect()
    pools_before = diagnostics.live_pool_ids()
    with jaxgraph.graph(g):
        assert diagnostics.captures_underway()
        tmp = jaxgraph.empty(N)
        kernel[N // 256, 256](tmp, x, N)
        kernel[N // 256, 256](y, tmp, N)
    assert not diagnostics.captures_underway()
    pool = diagnostics.memory_pool(g.pool())
    assert isinstance(pool, jaxgraph.MemPool) and pool.reserved_bytes >= N * 4
    assert pool.id in diagnostics.live_pool_ids() and pool.id not in pools_before
    assert diagnostics.graph_template(g) == int(g.raw_cuda_graph()) != 0
    y.fill_(np.nan)
    g.replay()
    np.testing.assert_array_equal(y.numpy(), data + 2.0)
    pool_ref, pool_id = weakref.ref(pool), pool.id
    del pool, tmp
    g.reset()
    with pytest.raises(RuntimeError, match="holds no captured graph"):
        diagnostics.graph_template(g)
    del g
    gc.collect()
    assert pool_ref() is None and pool_id not in diagnostics.live_pool_ids()


@pytest.mark.gpu
def test_describe_loop_says_what_was_built(rng):
    kernel = jaxgraph.Kernel(ADD_ONE, "add_one")
    x, y = jaxgraph.zeros(N), jaxgraph.zeros(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        kernel[N // 256, 256](y, x, N)
    loop = jaxgraph.graphed_loop(g, 10, feed={0: 0}, inputs=[x], outputs=[y])
    info = diagnostics.describe_loop(loop)
    assert isinstance(info.programmatic_check, bool) and info.gradient == "not built"
    data = rng.standard_normal(N).astype(np.float32)
    x.copy_(data)
    loop.replay()
    np.testing.assert_allclose(y.numpy(), data + 10.0, rtol=1e-6)
