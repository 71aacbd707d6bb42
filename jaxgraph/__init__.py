"""jaxgraph: PyTorch's CUDA-graph API for JAX, on cuda-python.

Write a CUDA C++ kernel, launch it on device arrays, capture launches into a
CUDA graph with the API PyTorch users know (``CUDAGraph``, ``graph()``, pools,
hooks, ``make_graphed_callables``), and replay the graph inside ``jax.jit`` on
XLA's own stream.

``import jaxgraph`` works without a GPU and without the native extension;
CUDA is initialised on first use.
"""

import typing

__all__ = [
    "asarray",
    "BindingMode",
    "BufferBinding",
    "capture_per_device",
    "compile_kernel",
    "CompiledKernel",
    "CompileError",
    "CudaError",
    "CUDAGraph",
    "CudaUnavailableError",
    "current_device",
    "current_stream",
    "default_unroll",
    "device_count",
    "DeviceArray",
    "empty",
    "Event",
    "Generator",
    "Graph",
    "graph",
    "graph_pool_handle",
    "graphed_loop",
    "GraphedCallable",
    "GraphedLoop",
    "if_else",
    "if_then",
    "IfElse",
    "is_current_stream_capturing",
    "Kernel",
    "make_graphed_callables",
    "MemPool",
    "Param",
    "RemovableHandle",
    "Replayable",
    "replayable",
    "ReplayPath",
    "set_device",
    "ShardedGraph",
    "stream",
    "Stream",
    "switch",
    "Switch",
    "synchronize",
    "to_host",
    "while_loop",
    "zeros",
]

from ._cuda.array import asarray as asarray
from ._cuda.array import DeviceArray as DeviceArray
from ._cuda.array import empty as empty
from ._cuda.array import to_host as to_host
from ._cuda.array import zeros as zeros
from ._cuda.driver import CudaError as CudaError
from ._cuda.driver import CudaUnavailableError as CudaUnavailableError
from ._cuda.driver import current_device as current_device
from ._cuda.driver import device_count as device_count
from ._cuda.driver import set_device as set_device
from ._cuda.memory import graph_pool_handle as graph_pool_handle
from ._cuda.memory import MemPool as MemPool
from ._cuda.stream import current_stream as current_stream
from ._cuda.stream import Event as Event
from ._cuda.stream import Stream as Stream
from ._cuda.stream import stream as stream
from ._cuda.stream import synchronize as synchronize
from ._kernels.compile import compile_kernel as compile_kernel
from ._kernels.compile import CompileError as CompileError
from ._kernels.compile import CompiledKernel as CompiledKernel
from ._kernels.kernel import Kernel as Kernel
from ._kernels.signature import Param as Param
from ._graphs.capture_contexts import Graph as Graph
from ._graphs.capture_contexts import graph as graph
from ._graphs.capture_contexts import is_current_stream_capturing as is_current_stream_capturing
from ._graphs.cuda_graph import CUDAGraph as CUDAGraph
from ._graphs.generator import Generator as Generator
from ._graphs.hooks import RemovableHandle as RemovableHandle
from ._graphs.conditional_regions import if_else as if_else
from ._graphs.conditional_regions import if_then as if_then
from ._graphs.conditional_regions import IfElse as IfElse
from ._graphs.conditional_regions import Switch as Switch
from ._graphs.conditional_regions import switch as switch
from ._graphs.conditional_regions import while_loop as while_loop
from ._jax_interop.graphed_callables import GraphedCallable as GraphedCallable
from ._jax_interop.graphed_callables import make_graphed_callables as make_graphed_callables
from ._jax_interop.graphed_loops import default_unroll as default_unroll
from ._jax_interop.graphed_loops import graphed_loop as graphed_loop
from ._jax_interop.graphed_loops import GraphedLoop as GraphedLoop
from ._jax_interop.replay_boundary import BindingMode as BindingMode
from ._jax_interop.replay_boundary import BufferBinding as BufferBinding
from ._jax_interop.replay_boundary import ReplayPath as ReplayPath
from ._jax_interop.replayable import Replayable as Replayable
from ._jax_interop.replayable import replayable as replayable
from ._jax_interop.sharded import capture_per_device as capture_per_device
from ._jax_interop.sharded import ShardedGraph as ShardedGraph

__version__ = "0.1.0"


def __dir__() -> list[str]:
    """``dir(jaxgraph)``: the public API, not the private modules it is built from."""
    loaded = {n for n in ("compare", "diagnostics") if n in globals()}  # public submodules, once imported
    return sorted(set(__all__) | loaded | {n for n in globals() if n.startswith("__") and n != "__dir__"})


def _name_the_public_module(namespace: dict, module: str) -> None:
    """Set ``__module__`` to ``module`` on each class and function ``namespace["__all__"]`` lists,
    and on the private bases those classes inherit from (``Kernel``'s ``KernelLaunching``).

    As jax does for ``jax.Array`` (``jax._src.util.set_module``): reprs, errors, pickles and
    ``help(jaxgraph)`` then name ``jaxgraph.Kernel``, where users import it from, instead of the
    private module that defines it (``jaxgraph._kernels.kernel``), which may move. A private
    base is named under ``module`` too: its methods are the public class's own, and ``help``
    lists them as inherited from it. A class's own annotations are resolved first, in the module
    that wrote them, so that ``typing.get_type_hints(jaxgraph.Param)`` still finds ``np`` there.
    Costs the same as jax's: ``inspect.getsource`` finds no source for such a class (functions
    keep theirs); the docs' [source] links find it through ``docs/conf.py``.

    ``help(jaxgraph)`` still lists ``_cuda``, ``_kernels``, ... under PACKAGE CONTENTS: pydoc
    lists every module file in ``__path__`` (``pkgutil.iter_modules``), with no hook to leave
    one out; ``help(jax)`` lists its ``_src`` the same way.
    """
    for name in namespace["__all__"]:
        obj = namespace[name]
        if not isinstance(obj, type):
            if obj.__module__.startswith("jaxgraph._"):
                obj.__module__ = module
            continue
        for cls in reversed(obj.__mro__):
            if cls.__module__.startswith("jaxgraph._"):
                own = vars(cls).get("__annotations__")
                if own:
                    cls.__annotations__ = {k: v for k, v in typing.get_type_hints(cls, include_extras=True).items()
                                           if k in own}
                cls.__module__ = module


_name_the_public_module(globals(), __name__)
