"""The CUDA layer: driver and contexts, streams and events, memory and pools, device arrays.

Also the registry of captures underway (what a launch records into), the
argument checks the public API shares, and the loader of jaxgraph's native
extensions. It imports nothing from the kernel, graph or JAX layers above it.
"""
