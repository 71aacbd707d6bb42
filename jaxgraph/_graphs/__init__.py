"""The graph layer: CUDAGraph and capture, handles, hooks, embedding, introspection and pictures.

Also conditional nodes (``conditional.py``, ``predicates.py``, ``regions.py``),
the graphs of device loops (``loop_build.py``), the copy-node kernels of large
graphs (``copy_ring.py``), what a graph hands to replay (``replay_source.py``)
and the replayable random generator. It imports the CUDA and kernel layers,
nothing from the JAX layer.
"""
