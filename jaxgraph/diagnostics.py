"""What jaxgraph's internals show, for tests, benchmarks and troubleshooting.

The everyday API is ``jaxgraph.*``. This module is the one documented door
to what the layers below keep to themselves but a benchmark, a test or a
user chasing a slow or failing replay needs to read or set::

    from jaxgraph import diagnostics

    before = diagnostics.counters()
    f(x).block_until_ready()                     # a jitted function that replays graphs
    after = diagnostics.counters()
    print({k: after[k] - before[k] for k in after if after[k] != before[k]})

The replay handler (``ffi/replay/``):

- :func:`counters`: the native replay handler's counters (calls per replay
  path, executables made, buffers copied, time inside the handler).
- :func:`set_capture_policy` and :class:`CapturePolicy`: how replays go into
  XLA's command buffers, process-wide (benchmarks compare the policies).
- :func:`describe_graph` / :func:`describe_bindings`: what the native table
  holds for a graph id (its replay paths, how each static buffer meets XLA's).
- :func:`native_module`: one of the three native extensions (``"replay"``,
  ``"launch"``, ``"device_loop"``), loaded on first use, for handles and
  counts they report (e.g. ``native_module("launch").live_kernels()``).

What jaxgraph holds, and what it chose:

- :func:`captures_underway`: whether any capture jaxgraph began is still open.
- :func:`live_pool_ids` and :func:`memory_pool`: the graph memory pools alive,
  and the :class:`~jaxgraph.MemPool` behind a pool token.
- :func:`graph_template`: the captured graph jaxgraph keeps to replay inside
  ``jax.jit``.
- :func:`kernel_id`: the id naming a kernel in the native launch table.
- :func:`argument_checks`: a kernel's argument checks, without a launch
  (device addresses and checked scalars of the arguments).
- :func:`describe_loop`: how a graphed loop was laid out (:class:`LoopInfo`).

Settings (process-wide, for tests and benchmarks that compare the ways):

- :func:`loop_settings`: how graphed loops and their gradients are built
  (:class:`LoopSettings`).

Stand-ins, to run jaxgraph's host code where a GPU is missing:

- :func:`device_array_at`, :func:`stream_at`: an array over an address as
  given, a stream over a made-up handle.
- :func:`launches_without_driver`: a kernel's launches doing all their host
  work and stopping before the driver.

Nothing here is needed to use jaxgraph, and none of it changes what a
program computes (the settings choose among layouts that compute the same);
names may grow between releases, but existing ones keep their meaning.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np

from . import _name_the_public_module
from ._cuda import stand_ins as _stand_ins
from ._cuda.array import DeviceArray
from ._cuda.capture_registry import any_underway as _any_underway
from ._cuda.memory import MemPool
from ._cuda.memory import live_pool_ids as _live_pool_ids
from ._cuda.memory import pool_from_token as _pool_from_token
from ._cuda.native import native as _native
from ._cuda.stream import Stream
from ._graphs import loop_build as _loop_build
from ._graphs.capture_contexts import Graph
from ._graphs.cuda_graph import CUDAGraph
from ._jax_interop import loop_grad as _loop_grad
from ._jax_interop.graphed_loops import GraphedLoop
from ._jax_interop.graphed_loops import loop_choices as _loop_choices
from ._jax_interop.kernel_call import kernel_id as _kernel_id
from ._jax_interop.replay_boundary import (BindingMode, BufferBinding, CapturePolicy, GraphInfo, ReplayPath, counters,
                                           describe_bindings, describe_graph, set_capture_policy)
from ._jax_interop.replay_contract import check_graph_type as _check_graph_type
from ._jax_interop.replay_contract import source_of as _source_of
from ._kernels.eager_launch import reference_checks as _reference_checks
from ._kernels.eager_launch import stopped_before_driver as _stopped_before_driver
from ._kernels.kernel import Kernel

__all__ = [
    "BindingMode",
    "BufferBinding",
    "CapturePolicy",
    "GraphInfo",
    "LoopInfo",
    "LoopSettings",
    "ReplayPath",
    "argument_checks",
    "captures_underway",
    "counters",
    "describe_bindings",
    "describe_graph",
    "describe_loop",
    "device_array_at",
    "graph_template",
    "kernel_id",
    "launches_without_driver",
    "live_pool_ids",
    "loop_settings",
    "memory_pool",
    "native_module",
    "set_capture_policy",
    "stream_at",
]


# ----------------------------------------------------------------------------
# The replay handler (counters, set_capture_policy, describe_* come from the JAX layer)
# ----------------------------------------------------------------------------


def native_module(name: str) -> ModuleType:
    """The native extension ``jaxgraph._<name>`` (``"replay"``, ``"launch"`` or ``"device_loop"``).

    Raises
    ------
    ValueError
        For any other name (the message lists the three).
    """
    if name not in ("replay", "launch", "device_loop"):
        raise ValueError(f"native_module: no extension {name!r}; the extensions are 'replay', 'launch' and "
                         "'device_loop'")
    return _native(name)


# ----------------------------------------------------------------------------
# What jaxgraph holds, and what it chose
# ----------------------------------------------------------------------------


def captures_underway() -> bool:
    """Whether any stream capture that jaxgraph began (``graph()``, ``capture_begin``) is still open.

    For tests that an error, an abandoned capture or a failed ``capture_end``
    left no stream capturing. Makes no driver call.
    """
    return _any_underway()


def live_pool_ids() -> frozenset[int]:
    """The ids (:attr:`jaxgraph.MemPool.id`) of the graph memory pools alive now.

    A pool lives while any graph, array or token using it does: take the set
    before and after a test's work to see that no pool was left behind
    (``len(after) <= len(before)``), or that one went (``pool_id not in after``).
    """
    return _live_pool_ids()


def memory_pool(token: Any) -> MemPool:
    """The :class:`~jaxgraph.MemPool` a pool token names (``graph.pool()``, ``graph_pool_handle()``).

    For its :attr:`~jaxgraph.MemPool.reserved_bytes` and
    :attr:`~jaxgraph.MemPool.free_bytes`, or a weak reference to see when the
    pool goes.

    Raises
    ------
    TypeError
        ``token`` is not a pool token.
    ValueError
        The pool it names no longer exists.
    """
    return _pool_from_token(token)


def graph_template(graph: CUDAGraph | Graph) -> int:
    """The address (a ``CUgraph``) of the captured graph jaxgraph keeps for ``graph``.

    Replays inside ``jax.jit`` splice copies of it into XLA's graphs; it is
    kept even with ``keep_graph=False`` (when :meth:`~jaxgraph.CUDAGraph.raw_cuda_graph`
    refuses) and goes at :meth:`~jaxgraph.CUDAGraph.reset`. Read it (for
    example with ``cuda.bindings.driver.cuGraphGetNodes``); never destroy it.

    Raises
    ------
    TypeError
        ``graph`` is not a :class:`~jaxgraph.CUDAGraph` or :class:`~jaxgraph.Graph`.
    RuntimeError
        ``graph`` holds no captured graph (never captured, or reset).
    """
    _check_graph_type(graph)
    return _source_of(graph).template


def kernel_id(kernel: Kernel) -> int:
    """The id naming ``kernel``'s code in the native launch table (``Kernel.jax_call``'s ``kernel`` attribute).

    Derived from the kernel's code, so equal for Kernels of the same code and
    in every process. Where a CUDA device exists, this also loads the kernel
    and enters it into the table, as tracing a ``jax_call`` does.
    """
    return _kernel_id(kernel)


def argument_checks(kernel: Kernel) -> Callable[[tuple], tuple[list, tuple]]:
    """``kernel``'s argument checks, as a function ``checks(args) -> (values, operands)`` that launches nothing.

    ``values`` holds one value per parameter: a pointer's is its array's
    device address, a scalar's the Python number checked against the
    parameter's type and range. ``operands`` is ``args`` with foreign arrays
    (jax.Array, CuPy, torch) wrapped as :class:`~jaxgraph.DeviceArray`. The
    checks are the reference ones that ``kernel[grid, block](*args)`` falls
    back to, with the same errors (``TypeError``, ``ValueError`` naming the
    parameter). For benchmarks that hand jaxgraph's checked values to another
    launcher (taken once, the function costs only the checks per call), and
    tests of the checks.
    """
    return _reference_checks(kernel)


class LoopInfo(NamedTuple):
    """What was chosen for a graphed loop where it was built (:func:`describe_loop`).

    Attributes
    ----------
    programmatic_check : bool
        Its one-kernel step is the kernel's own node and the exact stop's check
        (or the speculative stop's watch) is launched through a programmatic
        edge after it (sm_90 and newer; :func:`loop_settings` chooses where).
    gradient : str
        How its gradient runs the full segments: ``"copies"`` (state copied
        between steps), ``"retargeted"`` (retargeted clones of the step),
        ``"copies: <why not retargeted>"``, or ``"not built"`` before the
        loop's first gradient.
    """

    programmatic_check: bool
    gradient: str


def describe_loop(loop: GraphedLoop) -> LoopInfo:
    """How ``loop`` (a :class:`~jaxgraph.GraphedLoop`) was laid out, beyond its public attributes.

    Raises
    ------
    TypeError
        ``loop`` is not a :class:`~jaxgraph.GraphedLoop`.
    """
    if not isinstance(loop, GraphedLoop):
        raise TypeError(f"describe_loop expects a jaxgraph.GraphedLoop, got {type(loop).__name__}")
    return LoopInfo(*_loop_choices(loop))


# ----------------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------------

_EXACT_STOP_KINDS = frozenset({"fused", "twin", "in_place"})


class LoopSettings(NamedTuple):
    """How graphed loops and their gradients are built from now on (:func:`loop_settings`).

    Attributes
    ----------
    fused_copy_bytes : int
        The largest fed pair (bytes) an exact stop's check kernel copies itself
        (``"fused"``); larger pairs get a swapped twin of the step behind an IF.
    pdl_checks : frozenset of str
        The exact-stop layouts (``"fused"``, ``"twin"``, ``"in_place"``) whose
        one-kernel step is its kernel's node with the check launched through a
        programmatic edge (sm_90 and newer).
    pdl_watch : bool
        Whether the speculative stop does the same for its watch kernel.
    retarget_gradients : bool
        Whether loop gradients run their full segments as retargeted clones of
        the step instead of copying the state between steps.
    """

    fused_copy_bytes: int
    pdl_checks: frozenset
    pdl_watch: bool
    retarget_gradients: bool


@contextlib.contextmanager
def loop_settings(*, fused_copy_bytes: int | None = None, pdl_checks: Iterable[str] | None = None,
                  pdl_watch: bool | None = None, retarget_gradients: bool | None = None) -> Iterator[LoopSettings]:
    """Build graphed loops (and their gradients) another way inside the block; restored on exit.

    Process-wide, for tests of each layout and benchmarks that compare them.
    A setting left ``None`` keeps its value. The block yields the
    :class:`LoopSettings` in force inside it. Loops built inside keep their
    layout after the block (it is chosen when a loop, or its gradient, is
    built); every layout computes the same results::

        with diagnostics.loop_settings(pdl_watch=False):
            loop = jaxgraph.graphed_loop(g, 100, until=flag, preserve=[counter])

    Parameters
    ----------
    fused_copy_bytes : int, optional
        See :class:`LoopSettings` (0: never fused).
    pdl_checks : iterable of str, optional
        Exact-stop layouts among ``"fused"``, ``"twin"``, ``"in_place"``.
    pdl_watch, retarget_gradients : bool, optional

    Raises
    ------
    TypeError
        A setting of the wrong type (``pdl_checks`` given as one str).
    ValueError
        A negative ``fused_copy_bytes``, or a layout ``pdl_checks`` does not
        know (the message lists them).
    """
    if fused_copy_bytes is not None and (isinstance(fused_copy_bytes, bool) or not isinstance(fused_copy_bytes, int)
                                         or fused_copy_bytes < 0):
        raise ValueError(f"loop_settings: fused_copy_bytes must be an int >= 0, got {fused_copy_bytes!r}")
    if pdl_checks is not None:
        if isinstance(pdl_checks, str):
            raise TypeError(f"loop_settings: pdl_checks must be a collection of layouts, got the str {pdl_checks!r}")
        pdl_checks = frozenset(pdl_checks)
        if not pdl_checks <= _EXACT_STOP_KINDS:
            raise ValueError(f"loop_settings: pdl_checks {sorted(pdl_checks - _EXACT_STOP_KINDS)} are not "
                             f"exact-stop layouts; they are {sorted(_EXACT_STOP_KINDS)}")
    for name, value in (("pdl_watch", pdl_watch), ("retarget_gradients", retarget_gradients)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"loop_settings: {name} must be a bool, got {type(value).__name__}")
    previous = _current_loop_settings()
    wanted = previous._replace(**{k: v for k, v in (("fused_copy_bytes", fused_copy_bytes),
                                                    ("pdl_checks", pdl_checks), ("pdl_watch", pdl_watch),
                                                    ("retarget_gradients", retarget_gradients)) if v is not None})
    _apply_loop_settings(wanted)
    try:
        yield wanted
    finally:
        _apply_loop_settings(previous)


def _current_loop_settings() -> LoopSettings:
    """The settings in force, read from the modules that use them."""
    return LoopSettings(_loop_build.FUSED_COPY_BYTES, frozenset(_loop_build.PDL_CHECKS), bool(_loop_build.PDL_WATCH),
                        bool(_loop_grad.RETARGET))


def _apply_loop_settings(settings: LoopSettings) -> None:
    """Put ``settings`` where the loop builder and the gradient read them."""
    _loop_build.FUSED_COPY_BYTES = settings.fused_copy_bytes
    _loop_build.PDL_CHECKS = settings.pdl_checks
    _loop_build.PDL_WATCH = settings.pdl_watch
    _loop_grad.RETARGET = settings.retarget_gradients


# ----------------------------------------------------------------------------
# Stand-ins for a machine without a GPU
# ----------------------------------------------------------------------------


def device_array_at(address: int, shape: int | tuple[int, ...], dtype: Any = np.float32, *, device: int = 0,
                    owner: Any = None) -> DeviceArray:
    """A :class:`~jaxgraph.DeviceArray` over ``address`` as given: nothing is allocated, checked or freed.

    For views the public API does not make (an array inside another one's
    allocation, memory only a graph still holds: pass what keeps it alive as
    ``owner``), and, at made-up addresses, for host-side tests and benchmarks
    of argument checks and packing on a machine without a GPU (nothing must
    read or write it then).

    .. caution:: The array is only as valid as ``address``: jaxgraph trusts it.

    Parameters
    ----------
    address : int
        Device address of the first element.
    shape : int or tuple of int
    dtype : numpy dtype, optional
    device : int, optional
        The CUDA ordinal the memory is on.
    owner : object, optional
        Kept alive as long as the array (:attr:`~jaxgraph.DeviceArray.owner`).
    """
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    return _stand_ins.device_array_at(int(address), shape, np.dtype(dtype), int(device), owner)


def stream_at(handle: int, *, device: int = 0) -> Stream:
    """A :class:`~jaxgraph.Stream` over ``handle``, made without the driver (which may be missing).

    For host-side tests and benchmarks: launches on it reach the driver only
    where the driver is there and ``handle`` is a real stream; jaxgraph never
    destroys it. (:meth:`Stream.from_handle <jaxgraph.Stream.from_handle>` wraps
    a real stream, making its device's context current.)
    """
    return _stand_ins.stream_at(int(handle), int(device))


@contextlib.contextmanager
def launches_without_driver(kernel: Kernel, *, device: int = 0) -> Iterator[None]:
    """Inside the block, launches of ``kernel`` do all of jaxgraph's host work and stop before the driver.

    For measuring what jaxgraph itself costs per launch (argument checks and
    packing, the launch configuration, the stream and context lookups) on a
    machine without a GPU: ``kernel`` counts as loaded (compile it for an
    explicit ``arch=``), its native launch returns success without a driver
    call, and ``device``'s primary context is taken to be the thread's current
    one as the native lookup reads it with no driver (address 0). Use
    :func:`stream_at` and :func:`device_array_at` for streams and arrays.
    Everything is put back on exit; launchers made inside the block must not
    be used after it.
    """
    with _stand_ins.primary_context_assumed(int(device), 0), _stopped_before_driver(kernel):
        yield


_name_the_public_module(globals(), __name__)  # jaxgraph.diagnostics.CapturePolicy, as users import it
