"""jaxgraph: PyTorch's CUDA-graph API for JAX, on cuda-python.

Write a CUDA C++ kernel, launch it on device arrays, capture launches into a
CUDA graph with the API PyTorch users know (``CUDAGraph``, ``graph()``, pools,
hooks, ``make_graphed_callables``), and replay the graph inside ``jax.jit`` on
XLA's own stream.

``import jaxgraph`` works without a GPU and without the native extension;
CUDA is initialised on first use.
"""

__all__ = [
    "asarray",
    "BindingMode",
    "BufferBinding",
    "capture_per_device",
    "compile_kernel",
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

from ._array import DeviceArray as DeviceArray
from ._array import asarray as asarray
from ._array import empty as empty
from ._array import to_host as to_host
from ._array import zeros as zeros
from ._capture import Graph as Graph
from ._capture import graph as graph
from ._capture import is_current_stream_capturing as is_current_stream_capturing
from ._compile import CompileError as CompileError
from ._compile import compile_kernel as compile_kernel
from ._driver import CudaError as CudaError
from ._driver import CudaUnavailableError as CudaUnavailableError
from ._driver import current_device as current_device
from ._driver import device_count as device_count
from ._driver import set_device as set_device
from ._generator import Generator as Generator
from ._graphed import GraphedCallable as GraphedCallable
from ._graphed import make_graphed_callables as make_graphed_callables
from ._graphs import CUDAGraph as CUDAGraph
from ._hooks import RemovableHandle as RemovableHandle
from ._loops import GraphedLoop as GraphedLoop
from ._loops import default_unroll as default_unroll
from ._loops import graphed_loop as graphed_loop
from ._regions import IfElse as IfElse
from ._regions import Switch as Switch
from ._regions import if_else as if_else
from ._regions import if_then as if_then
from ._regions import switch as switch
from ._regions import while_loop as while_loop
from ._replay_codes import BindingMode as BindingMode
from ._replay_codes import BufferBinding as BufferBinding
from ._replay_codes import ReplayPath as ReplayPath
from ._replayable import Replayable as Replayable
from ._replayable import replayable as replayable
from ._sharded import ShardedGraph as ShardedGraph
from ._sharded import capture_per_device as capture_per_device
from ._kernel import Kernel as Kernel
from ._memory import MemPool as MemPool
from ._memory import graph_pool_handle as graph_pool_handle
from ._signature import Param as Param
from ._stream import Event as Event
from ._stream import Stream as Stream
from ._stream import current_stream as current_stream
from ._stream import stream as stream
from ._stream import synchronize as synchronize

__version__ = "0.1.0"
