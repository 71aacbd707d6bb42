"""Branches and loops inside a capture: :func:`if_then`, :func:`if_else`, :func:`while_loop`, :func:`switch`.

Inside ``with jaxgraph.graph(g):`` these open a *region*, a CUDA conditional
node whose body (or bodies) the work inside is captured into. The predicate
is a one-element device array that the graph's own kernels may write; the
device reads it each time the node is reached, never the host::

    with jaxgraph.graph(g):
        with jaxgraph.while_loop(remaining):        # while remaining[0] != 0
            step[blocks, 256](x, n)
            count_down[1, 1](remaining)            # the body updates the predicate
        with jaxgraph.if_then(flag):
            fix_up[blocks, 256](x, n)
        with jaxgraph.if_else(flag) as branch:
            with branch.then:
                a[blocks, 256](x, n)
            with branch.otherwise:
                b[blocks, 256](x, n)
        with jaxgraph.switch(index, 3) as cases:
            with cases[0]: ...
            with cases[2]: ...                     # a case left out does nothing

The same regions have PyTorch's names on :class:`~jaxgraph.CUDAGraph`
(:class:`ConditionalMethods`): ``begin_capture_to_if_node(pred)`` ...
``end_capture_to_conditional_node()``.

While a region is open, its body stream is the current stream: launch on
the current stream (the default) so work lands in the body. Regions nest as
deep as CUDA allows. ``other_graph.replay()`` inside a capture (and inside a
region) embeds ``other_graph`` as a child-graph node: that is how a captured
step is repeated K times inside a WHILE body.

Memory: a body may allocate (``jaxgraph.empty`` ...): the block comes from
the graph's pool, as everywhere in a capture (no memory nodes, which CUDA
forbids in a body), stays valid for every trip, and a block freed while a
region is open is not handed to another allocation of the capture until the
outermost region has closed.

Mechanism and driver calls: ``_graphs/conditional_nodes.py`` (nodes, bodies), ``_graphs/conditional_predicates.py``
(predicates and the kernel that sets them), ``_graphs/embed.py`` (``replay()`` during a capture).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from .._cuda import capture_registry as _captures
from . import conditional_nodes as _conditional
from .conditional_nodes import Region
from .conditional_predicates import KINDS, check_predicate
from .handles import require_capturing
from .._cuda.stream import current_stream

__all__ = ["ConditionalMethods", "IfElse", "Switch", "if_else", "if_then", "switch", "while_loop"]


# ----------------------------------------------------------------------------
# PyTorch's names on CUDAGraph
# ----------------------------------------------------------------------------


class ConditionalMethods:
    """Conditional-node capture methods of :class:`~jaxgraph.CUDAGraph` (PyTorch main's names).

    Each ``begin_capture_to_*`` call opens a region on the current stream,
    which must capture into this graph (into the innermost open region, if
    any); the work queued on the current stream afterwards is captured into the
    region's body until :meth:`end_capture_to_conditional_node`.

    .. warning:: This API is in beta and may change in future releases.
    """

    _handles: Any

    def begin_capture_to_if_node(self, pred: Any) -> None:
        """Capture what follows into an IF node: it runs at each replay where ``pred[0] != 0``.

        Parameters
        ----------
        pred : device array
            One element, bool or int32 (:class:`~jaxgraph.DeviceArray`, a GPU
            ``jax.Array``, CuPy or torch), read on the device when the node is reached.

        Raises
        ------
        TypeError, ValueError
            ``pred`` is not a one-element bool/int32 device array (before any driver call).
        RuntimeError
            No capture underway, the current stream does not capture into
            this graph's innermost level, or the driver lacks CUDA 12.4.
        """
        self._open_region("if", pred, "begin_capture_to_if_node")

    def begin_capture_to_if_else_node(self, pred: Any) -> None:
        """Capture what follows into the THEN body of an IF/ELSE node (``pred[0] != 0``).

        Call :meth:`begin_capture_to_next_conditional_body` to move to the
        ELSE body. Needs CUDA 12.8. See :meth:`begin_capture_to_if_node`.
        """
        self._open_region("if_else", pred, "begin_capture_to_if_else_node", 2)

    def begin_capture_to_while_node(self, pred: Any) -> None:
        """Capture what follows into the body of a WHILE node: it runs while ``pred[0] != 0``.

        The predicate is read when the node is reached and again after every
        trip, so the body's kernels must write it to stop the loop.
        See :meth:`begin_capture_to_if_node`.
        """
        self._open_region("while", pred, "begin_capture_to_while_node")

    def begin_capture_to_switch_node(self, index: Any, num_cases: int) -> None:
        """Capture what follows into case 0 of a SWITCH node of ``num_cases`` cases.

        Case ``index[0]`` runs (none when it is out of range); move to the next
        case with :meth:`begin_capture_to_next_conditional_body`. ``index`` is a
        one-element int32 device array. Needs CUDA 12.8.
        """
        num_cases = _check_cases(num_cases, "begin_capture_to_switch_node")
        self._open_region("switch", index, "begin_capture_to_switch_node", num_cases)

    def begin_capture_to_next_conditional_body(self) -> None:
        """End the body being captured and capture what follows into the node's next one
        (the ELSE of an IF/ELSE node, the next case of a SWITCH node)."""
        what = "begin_capture_to_next_conditional_body"
        _conditional.next_body(self._innermost(what), what)

    def end_capture_to_conditional_node(self) -> None:
        """Close the innermost open region: work on the current stream goes after the node again."""
        what = "end_capture_to_conditional_node"
        _conditional.end(self._innermost(what), what)

    # -- internals --------------------------------------------------------------

    def _open_region(self, kind: str, pred: Any, what: str, bodies: int = 1) -> None:
        pred = check_predicate(pred, f"{what}: {'index' if kind == 'switch' else 'pred'}", KINDS[kind].predicate)
        require_capturing(self._handles.state, what)
        _conditional.begin(self._handles.capture, kind, pred, what, bodies)

    def _innermost(self, what: str) -> Region:
        require_capturing(self._handles.state, what)
        regions = self._handles.capture.regions
        if not regions:
            raise RuntimeError(f"{what}: no conditional region is open in this capture; open one with "
                               "begin_capture_to_if_node() (or if_else, while, switch) first")
        return regions[-1]


# ----------------------------------------------------------------------------
# Context managers
# ----------------------------------------------------------------------------


class _Region:
    """Shared by the context managers: open on entry, close on exit, discard on an exception."""

    _kind = ""
    _name = ""

    def __init__(self, pred: Any, bodies: int = 1):
        what = f"jaxgraph.{self._name}: {'index' if self._kind == 'switch' else 'pred'}"
        self._pred = check_predicate(pred, what, KINDS[self._kind].predicate)
        self._bodies = bodies
        self._region: Region | None = None

    def __enter__(self) -> Any:
        if self._region is not None:
            raise RuntimeError(f"jaxgraph.{self._name}: this region was entered already; make a new one")
        # No capture anywhere: say so without touching the driver.
        stream = current_stream() if _captures.any_underway() else "the legacy default stream"
        capture = _captures.capture_on(stream) if _captures.any_underway() else None
        if capture is None:
            raise RuntimeError(f"jaxgraph.{self._name}: no jaxgraph capture is underway on the current stream "
                               f"({stream!r}); use it inside `with jaxgraph.graph(g):`")
        self._region = _conditional.begin(capture, self._kind, self._pred, f"jaxgraph.{self._name}", self._bodies)
        return self._entered()

    def _entered(self) -> Any:
        return self._region

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        region = self._region
        if region is None or region.closed:
            return
        if exc_type is None:
            _conditional.end(region, f"leaving jaxgraph.{self._name}")
        else:
            region.discard(f"{exc_type.__name__} raised inside {region.describe()}")
        # Returning None lets the body's exception propagate.


class if_then(_Region):
    """Context manager: the work inside runs at each replay where ``pred[0] != 0``.

    Yields the open region. Needs CUDA 12.4. If the body raises, the region
    and its capture are discarded when the capture ends (``graph()`` does that
    as the exception passes).

    Parameters
    ----------
    pred : DeviceArray
        One element, bool or int32, read on the device when the region is reached.
    """

    _kind, _name = "if", "if_then"

    def __init__(self, pred: Any):
        super().__init__(pred)


class while_loop(_Region):
    """Context manager: the work inside runs again and again while ``pred[0] != 0``.

    ``pred`` (one bool or int32 element on the device) is read when the loop
    is reached and after every trip, so the body must update it: e.g. count
    an int32 down, or set a bool flag when a residual is small. Needs CUDA 12.4.
    """

    _kind, _name = "while", "while_loop"

    def __init__(self, pred: Any):
        super().__init__(pred)


class IfElse:
    """What ``with jaxgraph.if_else(pred) as branch`` yields: ``branch.then`` and ``branch.otherwise``.

    Enter ``then`` first (if at all), then ``otherwise``; work outside both
    but inside the ``if_else`` block goes to the branch captured at that moment
    (THEN until ``otherwise`` is entered).

    Attributes
    ----------
    then : context manager
        Entering it captures the work that runs where ``pred[0] != 0``.
    otherwise : context manager
        Entering it captures the work that runs at the other replays.
    """

    def __init__(self, region: Region):
        self._region = region
        self.then = _Branch(region, 0, "then")
        self.otherwise = _Branch(region, 1, "otherwise")


class Switch:
    """What ``with jaxgraph.switch(index, n) as cases`` yields: ``cases[i]`` (or ``cases.case(i)``) contexts.

    Enter cases in increasing order; a case never entered does nothing.
    """

    def __init__(self, region: Region):
        self._region = region

    def __len__(self) -> int:
        return len(self._region.bodies)

    def case(self, i: int) -> AbstractContextManager[None]:
        """The context capturing case ``i``."""
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self):
            raise IndexError(f"jaxgraph.switch: case {i!r} is out of range for {len(self)} cases")
        return _Branch(self._region, i, f"case {i}")

    __getitem__ = case


class _Branch:
    """One body of an IF/ELSE or SWITCH region, as a context: entering moves the capture there."""

    def __init__(self, region: Region, index: int, name: str):
        self._region, self._index, self._name = region, index, name

    def __enter__(self) -> None:
        region = self._region
        what = f"{self._name} of {region.describe()}"
        if region.closed:
            raise RuntimeError(f"{what}: the region is closed; enter branches inside its `with` block")
        if region.body > self._index:
            raise RuntimeError(f"{what}: body {region.body} is captured already; enter the branches in "
                               "order (then before otherwise, cases in increasing order), each once")
        while region.body < self._index:
            _conditional.next_body(region, what)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        return None  # the region closes (or is discarded) when its own block ends


class if_else(_Region):
    """Context manager for an IF/ELSE region; yields an :class:`IfElse` with ``then``/``otherwise`` contexts.

    ``then`` runs at replays where ``pred[0] != 0`` (bool or int32, on the
    device), ``otherwise`` at the others. Needs CUDA 12.8.
    """

    _kind, _name = "if_else", "if_else"

    def __init__(self, pred: Any):
        super().__init__(pred, 2)

    def _entered(self) -> IfElse:
        return IfElse(self._region)


class switch(_Region):
    """Context manager for a SWITCH region of ``num_cases`` cases; yields a :class:`Switch`.

    Case ``index[0]`` runs (``index``: one int32 on the device); an index out
    of ``range(num_cases)`` runs none. Needs CUDA 12.8.
    """

    _kind, _name = "switch", "switch"

    def __init__(self, index: Any, num_cases: int):
        super().__init__(index, _check_cases(num_cases, "jaxgraph.switch"))

    def _entered(self) -> Switch:
        return Switch(self._region)


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _check_cases(num_cases: Any, what: str) -> int:
    if isinstance(num_cases, bool) or not isinstance(num_cases, int):
        raise TypeError(f"{what}: num_cases must be an int, got {type(num_cases).__name__}")
    if num_cases < 1:
        raise ValueError(f"{what}: num_cases must be at least 1, got {num_cases}")
    return num_cases
