"""examples/gray_scott.py on the CPU: its kernels compile for sm_90, its tilings are valid, bad ones are named.

The kernels' results against numpy need the GPU (tests/examples/test_examples_gpu.py).
"""

import numpy as np
import pytest

import jaxgraph
from conftest import example

gs = example("gray_scott")


@pytest.mark.parametrize("tile, per_launch, threads, warps, name", [
    (16, 1, 16, None, "fused"), (16, 5, 16, None, "blocked"), (32, 5, 16, None, "blocked"), (16, 10, 32, None, "blocked"),
    (6, 5, 16, 8, "columns"), (12, 10, 16, 8, "columns"), (22, 5, 16, 8, "columns"), (22, 5, 16, 4, "columns"), (6, 3, 16, 32, "columns"),
    (16, 4, 16, 2, "columns")])
def test_kernels_compile_for_sm90(tile, per_launch, threads, warps, name):
    k = jaxgraph.Kernel(gs.kernel_source(tile, per_launch, threads, warps), name, arch="sm_90")
    assert k.arch == "sm_90" and len(k.cubin) > 1000
    params = "float* u_out, float* v_out, float* partial, unsigned int* arrived, float* masses, int* count, "
    assert f"{name}({params}" in repr(k)  # the arguments CudaGrayScott.step passes, in its order


@pytest.mark.parametrize("nx", [1, 7, 48, 64, 100, 128, 129, 256, 512, 513, 1024, 4096])
@pytest.mark.parametrize("substeps", [1, 3, 5, 10, 17])
def test_default_blocking_is_a_tiling_the_kernels_accept(nx, substeps):
    per_launch, tile, threads, warps = gs.default_blocking(nx, substeps)
    assert 1 <= per_launch <= min(substeps, 10)
    gs.check_tiling(substeps, per_launch, tile, threads, warps)  # what CudaGrayScott checks first
    assert (warps is None) == (per_launch == 1)  # one substep a launch: the fused kernel alone


@pytest.mark.parametrize("threads", [8, 16, 32])
def test_the_python_pitch_is_the_kernels(threads):
    # blocked_shared_bytes sizes the kernel's shared tile: the CUDA macro P must be the pitch it assumes
    for width in (1, 12, 17, 26, 36, 42):  # (wider tiles outgrow 48 KiB at some thread counts)
        pitch = (gs.blocked_shared_bytes(width, 0, threads) - 1024) // (16 * width)
        source = gs.kernel_source(width, 0, threads) + f"static_assert(P == {pitch}, \"pitch\");\n"
        jaxgraph.Kernel(source, "fused", arch="sm_90").cubin  # NVRTC fails the assertion if they differ
    bad = gs.kernel_source(26, 0, threads) + "static_assert(P == 25, \"pitch\");\n"
    with pytest.raises(Exception, match="pitch"):
        jaxgraph.Kernel(bad, "fused", arch="sm_90").cubin


def test_the_shared_tile_pitch_puts_a_warps_rows_on_disjoint_banks():
    for threads in (8, 16):
        for width in range(1, 60):
            pitch = (gs.blocked_shared_bytes(width, 0, threads) - 1024) // (16 * width)  # four tiles of width rows
            assert width <= pitch < width + 2 * threads
            rows = 32 // threads  # the rows one warp reads, `threads` points each
            starts = sorted(r * pitch % 32 for r in range(rows))
            assert starts == [threads * r for r in range(rows)], (threads, width, pitch)  # no two share a bank


@pytest.mark.parametrize("args, match", [
    ((40, 5, 1, 6, 16, 8), "warps selects the columns kernel, which runs several substeps a launch: per_launch must "
                           "be > 1, got 1"),
    ((40, 5, 5, 6, 16, 0), r"warps must be in \[1, 32\] \(a block of 32 x warps threads\), got 0"),
    ((40, 5, 5, 6, 16, 33), r"warps must be in \[1, 32\] .* got 33"),
    ((40, 5, 5, 23, 16, 8), r"the columns kernel needs tile \+ 2 per_launch <= 32 \(a lane per column\), got tile 23 "
                            r"\+ 2 x 5 = 33"),
    ((40, 10, 10, 32, 16, None), "tile 32 with a halo of 10 on 16 x 16 threads needs 67584 bytes of shared memory, "
                                 "over 48 KiB"),
    ((40, 5, 6, 16, 16, None), r"per_launch must be in \[1, substeps=5\], got 6"),
    ((40, 5, 5, 16, 12, None), "threads .* must be 8, 16 or 32, got 12"),
])
def test_a_bad_tiling_is_named_before_anything_compiles(args, match):
    nx, substeps, per_launch, tile, threads, warps = args
    with pytest.raises(ValueError, match=match):
        gs.CudaGrayScott(nx, substeps, per_launch, 6, tile, threads, warps)


def test_options_pick_the_kernel():
    a = gs.parse_args([])
    assert (a.grid, a.per_launch, a.tile, a.threads, a.warps) == (256, 5, 22, 16, 8)  # the columns kernel
    a = gs.parse_args(["--grid", "1024"])
    assert (a.per_launch, a.tile, a.warps) == (5, 22, 4)
    a = gs.parse_args(["--quick"])
    assert (a.grid, a.substeps, a.per_launch, a.tile, a.warps) == (48, 3, 3, 12, 8)
    a = gs.parse_args(["--grid", "64"])
    assert (a.per_launch, a.tile, a.warps) == (10, 12, 8)
    a = gs.parse_args(["--tile", "32"])  # a region of 42 is too wide for a lane per column: shared-memory tiles
    assert (a.tile, a.threads, a.warps) == (32, 16, None)
    a = gs.parse_args(["--threads", "8"])
    assert (a.threads, a.warps) == (8, None)
    a = gs.parse_args(["--warps", "4", "--tile", "16"])
    assert (a.tile, a.warps) == (16, 4)
    a = gs.parse_args(["--per-launch", "1", "--warps", "4"])  # the fused kernel alone: no columns kernel
    assert (a.per_launch, a.warps) == (1, None)
    a = gs.parse_args(["--substeps", "1"])
    assert (a.per_launch, a.warps) == (1, None)
    for bad in (["--threads", "8", "--warps", "4"],
                ["--grid", "64", "--tile", "32"],  # halo 10: 67584 bytes of shared memory
                ["--warps", "4", "--tile", "32"],  # a region 42 wide for 32 lanes
                ["--per-launch", "11"]):
        with pytest.raises(SystemExit):  # argparse's error, before anything runs
            gs.parse_args(bad)


def test_a_halo_as_wide_as_the_substeps_keeps_the_tile_exact():
    """The argument the `columns` kernel rests on, in numpy (not the kernel: the GPU tests run that): a region
    of W = tile + 2 halo around each tile, every point updated each substep with neighbours from inside the
    region only (the outer ring goes wrong, one point a substep), and the tile, halo points inside, still
    matches the reference after `halo` substeps."""
    rng = np.random.default_rng()
    nx, tile, halo = 20, 6, 3
    u0, v0 = gs.initial_state(nx, rng)
    want = gs.reference(u0, v0, 1, halo)
    f = np.float32
    w = tile + 2 * halo
    got_u, got_v = np.full((nx, nx), np.nan, np.float32), np.full((nx, nx), np.nan, np.float32)
    for by in range(-(-nx // tile)):
        for bx in range(-(-nx // tile)):
            rows = (by * tile - halo + np.arange(w)) % nx
            cols = (bx * tile - halo + np.arange(w)) % nx
            u, v = u0[np.ix_(rows, cols)].copy(), v0[np.ix_(rows, cols)].copy()
            for _ in range(halo):
                # neighbours inside the region; at its edge the point's own value (a lane's shuffle past the end)
                def shift(a, dy, dx):
                    p = np.pad(a, 1, mode="edge")
                    return p[1 + dy:1 + dy + w, 1 + dx:1 + dx + w]
                lu = shift(u, 0, -1) + shift(u, 0, 1) + shift(u, -1, 0) + shift(u, 1, 0) - f(4) * u
                lv = shift(v, 0, -1) + shift(v, 0, 1) + shift(v, -1, 0) + shift(v, 1, 0) - f(4) * v
                uvv = u * v * v
                u, v = (u + f(gs.DT) * (f(gs.DU) * lu - uvv + f(gs.FEED) * (f(1) - u)),
                        v + f(gs.DT) * (f(gs.DV) * lv + uvv - f(gs.FEED + gs.KILL) * v))
            ys, xs = by * tile + np.arange(tile), bx * tile + np.arange(tile)
            keep_y, keep_x = ys < nx, xs < nx
            got_u[np.ix_(ys[keep_y], xs[keep_x])] = u[halo:halo + tile, halo:halo + tile][np.ix_(keep_y, keep_x)]
            got_v[np.ix_(ys[keep_y], xs[keep_x])] = v[halo:halo + tile, halo:halo + tile][np.ix_(keep_y, keep_x)]
    np.testing.assert_allclose(got_u, want[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(got_v, want[1], rtol=0, atol=1e-5)
