"""jaxgraph's benchmark harness: chains of tiny kernels, replayed every way jaxgraph offers.

Run everything on a GPU machine with ``python benchmarks/run.py`` (``--quick``
for a one-minute smoke run); see ``benchmarks/README.md``. The pure parts
(statistics, the JSON merge, markdown, the plot) import without a GPU and are
tested in ``tests/benchmarks/test_benchmarks*.py``.
"""
