"""Binding counts every byte a memcpy node touches, its offsets included (ffi/graph_binding.h).

A static buffer that a memcpy node reads or writes is copied, never bound to
XLA's buffer. A 3-D copy names a base address and offsets from it (``dstXInBytes``,
``dstY`` rows of ``dstPitch`` bytes, ``dstZ`` slices of ``dstHeight`` rows, the
same for the source): a copy based at one allocation may write into the middle
of another buffer, which must be copied too. On the CPU: the ranges the native
scan computes, against a byte-by-byte reference on fresh random parameters. On
the GPU: a captured 3-D copy whose offsets land in a static output leaves it
copied, and the jitted replay is exact.

The scan's ranges have no public face: they come from the native replay extension
(``jaxgraph.diagnostics.native_module("replay").memcpy_ranges``); the static output inside a larger
allocation is a ``diagnostics.device_array_at`` view.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgraph  # noqa: E402
from jaxgraph import diagnostics  # noqa: E402
from support.kernel_sources import INC  # noqa: E402

HOST, DEVICE, ARRAY, UNIFIED = 1, 2, 3, 4  # CUmemorytype
FIELDS = ("XInBytes", "Y", "Z", "Pitch", "Height")


def ranges(**fields):
    return diagnostics.native_module("replay").memcpy_ranges(fields)


def touched(base, x, y, z, pitch, height, width, rows, depth):
    """The reference: [first, last + 1) over every byte the side of a 3-D copy touches, one row at a time."""
    row = pitch or width
    slice_rows = height or rows or 1
    starts = [base + x + (y + r) * row + (z + s) * slice_rows * row
              for s in range(depth or 1) for r in range(rows or 1)]
    return (min(starts), max(starts) + width) if width else None


# ---------------------------------------------------------------------------
# CPU: the ranges (internal)
# ---------------------------------------------------------------------------


def test_a_1d_copy_touches_its_width_on_each_side():
    assert ranges(srcMemoryType=DEVICE, srcDevice=0x1000, dstMemoryType=DEVICE, dstDevice=0x9000,
                  WidthInBytes=4096, Height=1, Depth=1) == ((0x1000, 0x2000), (0x9000, 0xA000))
    # Height and depth left 0, pitch 0 (one row): the same.
    assert ranges(srcMemoryType=UNIFIED, srcDevice=0x1000, dstMemoryType=DEVICE, dstDevice=0x9000,
                  WidthInBytes=4096) == ((0x1000, 0x2000), (0x9000, 0xA000))


def test_offsets_move_each_side_s_range():
    p = 1 << 12  # a row's pitch
    got = ranges(srcMemoryType=DEVICE, srcDevice=0x10_0000, srcXInBytes=64, srcPitch=p, srcHeight=8,
                 dstMemoryType=DEVICE, dstDevice=0x80_0000, dstXInBytes=16, dstY=3, dstZ=2, dstPitch=p, dstHeight=4,
                 WidthInBytes=256, Height=2, Depth=3)
    src_begin = 0x10_0000 + 64
    dst_begin = 0x80_0000 + 16 + 3 * p + 2 * 4 * p
    assert got == ((src_begin, src_begin + 2 * 8 * p + 1 * p + 256), (dst_begin, dst_begin + 2 * 4 * p + 1 * p + 256))


def test_ranges_match_every_byte_touched_on_random_copies(rng):
    for _ in range(300):
        width, rows, depth = (int(v) for v in rng.integers([0, 0, 0], [64, 5, 4]))
        fields = {"WidthInBytes": width, "Height": rows, "Depth": depth}
        want = []
        for side, base in (("src", 0x1_0000), ("dst", 0x90_0000)):
            x, y, z = (int(v) for v in rng.integers(0, [128, 6, 4]))
            pitch = int(rng.choice([0, width + x + int(rng.integers(0, 32))]))
            height = int(rng.choice([0, (rows or 1) + y + int(rng.integers(0, 3))]))
            fields.update({f"{side}MemoryType": DEVICE, f"{side}Device": base})
            fields.update(zip((side + f for f in FIELDS), (x, y, z, pitch, height)))
            want.append(touched(base, x, y, z, pitch, height, width, rows, depth))
        assert ranges(**fields) == tuple(want), fields


def test_host_memory_and_arrays_touch_no_buffer():
    common = {"WidthInBytes": 512, "Height": 2, "Depth": 1, "srcDevice": 0x1000, "dstDevice": 0x9000}
    assert ranges(srcMemoryType=HOST, dstMemoryType=ARRAY, **common) == (None, None)
    assert ranges(srcMemoryType=DEVICE, dstMemoryType=HOST, **common) == ((0x1000, 0x1000 + 512 + 512), None)
    assert ranges(srcMemoryType=DEVICE, dstMemoryType=DEVICE, srcDevice=0x1000, dstDevice=0x9000,
                  WidthInBytes=0, Height=4, Depth=4) == (None, None)  # copies nothing


def test_ranges_saturate_instead_of_wrapping():
    top = 2**64 - 1
    (begin, end), _ = ranges(srcMemoryType=DEVICE, srcDevice=top - 16, srcXInBytes=8, srcPitch=2**40,
                             srcHeight=2**30, WidthInBytes=64, Height=2**20, Depth=2**20)
    assert begin == top - 8 and end == top


def test_an_unknown_field_is_refused():
    with pytest.raises(ValueError, match="CUDA_MEMCPY3D has no field 'dstOffset'"):
        ranges(dstOffset=4)


# ---------------------------------------------------------------------------
# GPU: a 3-D copy into the middle of an allocation holding a static output
# ---------------------------------------------------------------------------

N = 4096
ROW = N * 4  # bytes: one static array per row of the slab


@pytest.mark.gpu
def test_a_3d_copy_into_a_static_output_by_offsets_leaves_it_copied(rng):
    from cuda.bindings import driver as cu

    inc = jaxgraph.Kernel(INC, "inc")
    inc.handle  # noqa: B018 - loaded before the capture
    x_s = jaxgraph.empty(N)
    # Four rows of ROW bytes, seen as slices of two rows: the output is row 1 of slice 1.
    slab = jaxgraph.empty(4 * N)
    y_s = diagnostics.device_array_at(slab.ptr + 3 * ROW, (N,), np.float32, device=slab.device, owner=slab.owner)
    copy = cu.CUDA_MEMCPY3D()
    copy.srcMemoryType = copy.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    copy.srcDevice, copy.srcPitch, copy.srcHeight = x_s.ptr, ROW, 1
    copy.dstDevice, copy.dstPitch, copy.dstHeight = slab.ptr, ROW, 2  # based at the slab's start...
    copy.dstY, copy.dstZ = 1, 1                                        # ...offset into y_s
    copy.WidthInBytes, copy.Height, copy.Depth = ROW, 1, 1
    g = jaxgraph.CUDAGraph(keep_graph=True)
    jaxgraph.synchronize()
    with jaxgraph.graph(g):
        stream = jaxgraph.current_stream()
        assert cu.cuMemcpy3DAsync(copy, stream.handle)[0] == cu.CUresult.CUDA_SUCCESS
        inc[(N + 255) // 256, 256](y_s, N)  # y = x + 1
    g.instantiate()
    memcpy = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY
    nodes = [n for n in jaxgraph_nodes(cu, g) if cu.cuGraphNodeGetType(n)[1] == memcpy]
    params = cu.cuGraphMemcpyNodeGetParams(nodes[0])[1]
    assert (int(params.dstDevice), params.dstY, params.dstZ) == (slab.ptr, 1, 1), \
        "the driver folded the offsets into the address: this graph no longer tests offsets"
    for _ in range(2):  # eager replays: the copy and the kernel as captured
        x = rng.standard_normal(N).astype(np.float32)
        x_s.copy_(x)
        y_s.fill_(np.float32(np.nan))
        g.replay()
        np.testing.assert_array_equal(y_s.numpy(), x + np.float32(1.0))
    step = jaxgraph.replayable(g, [x_s], [y_s])
    rows = {(r.kind, r.index): r for r in step.bindings[g.device]}
    assert rows["output", 0].mode == "copied" and "memcpy node writes it" in rows["output", 0].reason, rows
    assert rows["input", 0].mode == "copied" and "memcpy node reads it" in rows["input", 0].reason, rows
    y_s.fill_(np.float32(np.nan))
    f = jax.jit(step)
    for _ in range(3):
        x = rng.standard_normal(N).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), x + np.float32(1.0))


def jaxgraph_nodes(cu, g):
    """The top-level nodes of ``g``'s captured graph (cuda.bindings)."""
    graph = cu.CUgraph(g.raw_cuda_graph())
    _, _, count = cu.cuGraphGetNodes(graph)
    err, nodes, _ = cu.cuGraphGetNodes(graph, count)
    assert err == cu.CUresult.CUDA_SUCCESS
    return nodes
