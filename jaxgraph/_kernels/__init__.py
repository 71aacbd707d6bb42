"""The kernel layer: CUDA C++ compiled by NVRTC, its cubin read, its signature parsed, loaded, launched.

:class:`~jaxgraph.Kernel` (``kernel.py``) is the user's object; the modules
beside it compile (``compile.py``, ``cubin.py``), read the parameter list and
encode arguments (``signature.py``, ``packer.py``), name launch limits
(``launch_limits.py``), load (``load.py``) and launch eagerly
(``eager_launch.py``). It imports only the CUDA layer.
"""
