"""What crosses the native replay boundary, typed: binding modes, replay paths, counters.

``ffi/replay.cc`` reports how each static buffer meets XLA's (a
:class:`BindingMode` code with the reason text beside it) and which ways a
graph's calls can run (:class:`ReplayPath` codes), and counts the calls of
each path. Python never parses the reason text: it is for people.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from .._cuda.native import native

__all__ = ["BindingMode", "BufferBinding", "CapturePolicy", "ReplayPath", "binding_from_row", "counters",
           "paths_from_codes", "set_capture_policy"]


class BindingMode(str, enum.Enum):
    """How one static buffer of a replayable meets XLA's buffer (``Replayable.bindings``).

    A ``str`` enum: ``BindingMode.BOUND == "bound"``.
    """

    BOUND = "bound"
    """The graph's kernel arguments are pointed at XLA's buffer: no copy."""
    COPIED = "copied"
    """Copied into the static input before the replay, or out of the static output after it."""
    UNUSED = "unused"
    """No node jaxgraph can read refers to it; copied in case the graph reaches it through
    device memory (``drop_unreferenced`` leaves such inputs out of the call)."""
    COPIED_BY_COST = "copied_by_cost"
    """Could be bound, but copying costs less: many kernel arguments point at it (state updated
    in place by every kernel) and either the graph keeps one executable (a large graph: decided
    at registration) or XLA's address for it kept changing (decided after some calls). The
    ``reason`` gives the figures."""

    def __str__(self) -> str:
        return self.value


class ReplayPath(str, enum.Enum):
    """How a call of a :class:`~jaxgraph.Replayable` replays its graph inside ``jax.jit``.

    Each path has its own counter in the native extension, named by its value
    (``jaxgraph._replay.counters()["splice_nodes"]``). ``Replayable.replay_paths``
    says which paths a replayable's calls can take.
    """

    LAUNCH = "launch"
    """``cudaGraphLaunch`` on XLA's stream (XLA is not recording a command buffer)."""
    SPLICE_NODES = "splice_nodes"
    """XLA records a command buffer: the graph's nodes, bound to XLA's buffers, are added to it one by one."""
    SPLICE_WHOLE = "splice_whole"
    """XLA records a command buffer and the nodes cannot be added one by one: the static template
    goes in as one child-graph node, every buffer copied."""
    UNCAPTURED_LAUNCH = "uncaptured_launch"
    """A graph with conditional nodes (IF, WHILE, SWITCH), which CUDA can neither clone nor nest:
    launched on XLA's stream through ``jaxgraph_replay_uncaptured``, a target XLA keeps out of its
    command buffers (it splits them around the call)."""
    HOST_CALLBACK = "host_callback"
    """``via="callback"``: replayed from the host through ``jax.pure_callback`` (no native counter)."""

    def __str__(self) -> str:
        return self.value


class CapturePolicy(str, enum.Enum):
    """How a replay goes into XLA's command buffer when XLA records it (``ffi/capture_policy.h``).

    XLA records the call again when its buffers move to addresses it holds
    no recording for, and updates its executable in place: a bound buffer's
    kernel arguments are rewritten there, a copied one changes one memcpy
    node, which costs a copy on every call. ``BIND`` is the default (where
    XLA's addresses recur, as in a jitted loop, nothing is re-recorded and a
    copy would cost every call for nothing); ``AUTO`` suits buffers that cycle
    through more addresses than XLA keeps recordings for. The others exist to
    compare the ways (``benchmarks/capture_policies.py``).
    """

    AUTO = "auto"
    """By cost (``ffi/capture_policy.h``): a bound buffer held by many kernel arguments and small
    enough to copy cheaply is copied, the rest bound."""
    BIND = "bind"
    """Every bound buffer bound in the spliced nodes (no copies)."""
    COPY = "copy"
    """Every bound buffer copied around the spliced nodes, which keep the static arrays."""
    WHOLE = "whole"
    """The static template spliced as one child-graph node, every buffer copied."""

    def __str__(self) -> str:
        return self.value


class BufferBinding(NamedTuple):
    """How one static buffer meets XLA's buffer in a jitted replay.

    ``mode`` is a :class:`BindingMode`; ``sites`` counts the kernel arguments
    that point at it (rewritten when XLA's address of a bound buffer changes);
    ``reason`` says why a buffer is copied or unused, for people (never parsed).
    """

    kind: str
    index: int
    mode: BindingMode
    sites: int
    reason: str

    def __str__(self) -> str:
        what = f"{self.kind} {self.index} {self.mode.value}"
        if self.mode is BindingMode.BOUND:
            return f"{what} ({self.sites} site{'s' if self.sites != 1 else ''})"
        return f"{what} ({self.reason})" if self.reason else what


def counters() -> dict[str, int]:
    """The native replay counters: calls per :class:`ReplayPath` (by value), ``instantiate``
    (executables made), ``rebind`` (kernel arguments rewritten in place in executables), ``copy``,
    ``to_copy`` (bound buffers switched to copying by their cost), ``evict`` (calls whose addresses
    no executable held, with no room for another: one was replaced, afresh or rewritten in place),
    ``node_copy`` (buffers copied by copy nodes of the executable, not counted in ``copy``),
    ``ring_wait`` (launches that waited for the device to free an entry of those nodes' address ring),
    ``refresh`` (executables rewritten in place, made afresh when their addresses recurred; each
    also counts in ``instantiate``), ``handler_calls``, ``handler_ns``, and the parts of
    ``handler_ns`` spent inside ``cudaGraphLaunch`` on the launch path (``launch_ns``), inside
    ``cudaMemcpyAsync`` (``copy_ns``) and choosing, making or rewriting the executable to launch
    (``prepare_ns``)."""
    return dict(native("replay").counters())


def set_capture_policy(policy: CapturePolicy | str) -> CapturePolicy:
    """Set the :class:`CapturePolicy` of graphs XLA records for the first time from now on; return
    the previous one.

    Process-wide, for tests and benchmarks. A graph keeps the policy of its
    first recording: XLA can update a recorded call only from a recording of
    the same shape, so a replayable made before the change keeps its way.
    """
    policy = CapturePolicy(policy)  # ValueError names the bad value
    previous = native("replay").set_capture_policy(native("replay").codes()["capture"][policy.value])
    return _codes()["capture"][int(previous)]


def binding_from_row(row: tuple) -> BufferBinding:
    """A :class:`BufferBinding` from the native ``(kind, index, mode code, sites, reason)``."""
    kind, index, mode, sites, reason = row
    return BufferBinding(kind, int(index), _codes()["binding"][int(mode)], int(sites), reason)


def paths_from_codes(codes: list) -> tuple[ReplayPath, ...]:
    """The :class:`ReplayPath` of each native path code."""
    return tuple(_codes()["path"][int(c)] for c in codes)


def _codes() -> dict:
    """Native code -> enum member, built once from the extension's own table (never hard-coded)."""
    global _CODE_TABLE
    if _CODE_TABLE is None:
        table = native("replay").codes()
        _CODE_TABLE = {"binding": {code: BindingMode(name) for name, code in table["binding"].items()},
                       "path": {code: ReplayPath(name) for name, code in table["path"].items()},
                       "capture": {code: CapturePolicy(name) for name, code in table["capture"].items()}}
    return _CODE_TABLE


_CODE_TABLE: dict | None = None
