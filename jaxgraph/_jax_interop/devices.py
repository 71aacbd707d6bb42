"""Which CUDA device a JAX device (or a mesh of them) is: the ordinals graphs are captured on.

A JAX GPU device's CUDA ordinal is its ``local_hardware_id``, the ordinal XLA
hands an FFI call on that device (right under ``CUDA_VISIBLE_DEVICES`` too);
under ``jax.distributed`` a mesh stands for this process's devices of it.
``_jax_interop/sharded.py`` captures one graph per ordinal.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._cuda import driver as _driver
from . import processes as _processes

__all__ = ["CUDA_PLATFORMS", "cuda_ordinal", "device_names", "device_ordinals"]

CUDA_PLATFORMS = ("gpu", "cuda")  # what jax.Device.platform says for a CUDA GPU


def cuda_ordinal(device: Any) -> int:
    """The CUDA ordinal of ``device``: an int ordinal, or a local JAX GPU device.

    A JAX device's ordinal is its ``local_hardware_id``: the ordinal XLA
    hands the FFI call on that device, and the one ``jaxgraph`` allocates on.

    Raises
    ------
    TypeError
        Neither an int nor a JAX device.
    ValueError
        A negative ordinal, a device that is not a CUDA GPU, or a device of another process.
    """
    if isinstance(device, (bool, np.bool_)):
        raise TypeError(f"a device must be a CUDA ordinal or a JAX device, got {device!r}")
    if isinstance(device, (int, np.integer)):
        if device < 0:
            raise ValueError(f"a CUDA device ordinal is >= 0, got {device}")
        return int(device)
    platform = getattr(device, "platform", None)
    if platform is None:
        raise TypeError(f"a device must be a CUDA ordinal or a JAX device, got {type(device).__name__}")
    if platform not in CUDA_PLATFORMS:
        raise ValueError(f"{device} is a {platform} device: jaxgraph graphs live on CUDA GPUs (JAX with CUDA)")
    process = getattr(device, "process_index", 0)
    here = _processes.process_index()
    if process != here:
        raise ValueError(f"{device} belongs to process {process}, this is process {here}: each process captures "
                         "graphs for its own devices (jax.local_devices())")
    ordinal = getattr(device, "local_hardware_id", None)
    if ordinal is None:
        raise ValueError(f"{device} has no local_hardware_id, so its CUDA ordinal is unknown")
    return int(ordinal)


def device_ordinals(devices: Any = None) -> tuple[int, ...]:
    """CUDA ordinals of ``devices`` (a Mesh, a device or a sequence of them); see :func:`capture_per_device`.

    A mesh or a sequence stands for its devices of this process (a global
    mesh, or ``jax.devices()``, under ``jax.distributed`` also holds the
    other processes'): :func:`processes.local_devices` is the one rule.
    Raises ``ValueError`` for no devices, none of this process's, or a
    device given twice.
    """
    if devices is None:
        return _default_devices()
    local, spans = _processes.local_devices(devices)
    if spans and not local:
        other = next(d for d in _processes.device_list(devices) if hasattr(d, "process_index"))
        raise ValueError(f"none of the devices given is this process's: {other} belongs to process "
                         f"{other.process_index}, this is process {_processes.process_index()}; each process "
                         "captures graphs for its own devices (jax.local_devices())")
    ordinals = tuple(cuda_ordinal(d) for d in local)
    if not ordinals:
        raise ValueError("devices is empty: name at least one device")
    repeated = sorted({d for d in ordinals if ordinals.count(d) > 1})
    if repeated:
        raise ValueError(f"device(s) {device_names(repeated)} given more than once: each device gets one graph")
    return ordinals


def _default_devices() -> tuple[int, ...]:
    """JAX's local GPUs, or every CUDA device when JAX has no GPU backend."""
    import jax

    try:
        gpus = jax.local_devices(backend="gpu")
    except RuntimeError:  # no GPU backend in this JAX
        gpus = []
    if gpus:
        return tuple(cuda_ordinal(d) for d in gpus)
    count = _driver.device_count()
    if count == 0:
        raise _driver.CudaUnavailableError("no CUDA device: capture_per_device needs at least one GPU")
    return tuple(range(count))


def device_names(devices: Sequence[int]) -> str:
    """``"0, 1"`` for messages (``"none"`` when empty)."""
    return ", ".join(str(d) for d in devices) or "none"
