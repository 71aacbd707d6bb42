"""Launch limits: CUDA's for every GPU, a device's own, named before the driver refuses a launch.

The driver answers a launch over a limit with ``CUDA_ERROR_INVALID_VALUE``
alone. :func:`check_geometry` names the limit and the value instead: against
:data:`CUDA_LIMITS` wherever a grid and a block are first seen (no device
needed: ``kernel[grid, block]``, ``Kernel.jax_call`` at trace time), and
against :func:`device_limits` and the kernel's own most threads per block
once a launch knows its device (``load.KernelLoading``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["CUDA_LIMITS", "LaunchLimits", "check_geometry", "device_limits"]


@dataclass(frozen=True)
class LaunchLimits:
    """How large a launch may be: per block, per block dimension, per grid dimension.

    :data:`CUDA_LIMITS` holds the limits every GPU CUDA 13 supports shares;
    :func:`device_limits` reads a device's own.
    """

    threads_per_block: int
    block: tuple[int, int, int]
    grid: tuple[int, int, int]
    where: str


CUDA_LIMITS = LaunchLimits(1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535), "CUDA's limit for every GPU")


def check_geometry(kernel: str, grid: tuple[int, int, int], block: tuple[int, int, int],
                   limits: LaunchLimits = CUDA_LIMITS, kernel_threads: int | None = None) -> None:
    """Raise ``ValueError`` naming the limit and the value when ``grid``/``block`` exceed ``limits``.

    ``kernel_threads`` is the kernel's own most threads per block
    (``cuFuncGetAttribute``'s ``MAX_THREADS_PER_BLOCK``: registers or
    ``__launch_bounds__`` can make it lower than the device's), when known.
    Checked before the driver sees a launch, which would only say
    ``CUDA_ERROR_INVALID_VALUE``.
    """
    for what, dims in (("grid", grid), ("block", block)):
        if any(d < 1 for d in dims):
            raise ValueError(f"kernel {kernel}: {what} dimensions must be >= 1, got {what} {dims}")
    for what, dims, most in (("block", block, limits.block), ("grid", grid, limits.grid)):
        for axis, d, m in zip("xyz", dims, most):
            if d > m:
                raise ValueError(f"kernel {kernel}: {what} {dims} has {d} along {axis}, over the limit of {m} "
                                 f"({limits.where}: {what} dimensions at most {most})")
    threads = block[0] * block[1] * block[2]
    if threads > limits.threads_per_block:
        raise ValueError(f"kernel {kernel}: block {block} has {threads} threads, over the limit of "
                         f"{limits.threads_per_block} threads per block ({limits.where})")
    if kernel_threads is not None and threads > kernel_threads:
        raise ValueError(f"kernel {kernel}: block {block} has {threads} threads, over the limit of {kernel_threads} "
                         f"threads per block of this kernel on {limits.where} (its registers or __launch_bounds__ "
                         "allow no more: cuFuncGetAttribute MAX_THREADS_PER_BLOCK); use a smaller block")


@functools.lru_cache(maxsize=None)
def device_limits(device: int) -> tuple[LaunchLimits, int]:
    """``device``'s launch limits, and the most shared memory a block may opt into, in bytes.

    Where the driver cannot be asked (no driver: a test's stand-in launch),
    CUDA's limits for every GPU and the 48 KiB every block may use.
    """
    try:
        from cuda.core import Device

        dev = Device(device)
        p = dev.properties
        limits = LaunchLimits(p.max_threads_per_block, (p.max_block_dim_x, p.max_block_dim_y, p.max_block_dim_z),
                              (p.max_grid_dim_x, p.max_grid_dim_y, p.max_grid_dim_z), f"device {device} ({dev.name})")
        return limits, int(p.max_shared_memory_per_block_optin)
    except Exception:  # what the launch itself will report, if it gets that far
        return CUDA_LIMITS, 48 * 1024
