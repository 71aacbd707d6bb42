"""jaxgraph's benchmark harness: chains of tiny kernels, replayed every way jaxgraph offers.

Run everything on a GPU machine with ``python benchmarks/run.py`` (``--quick``
for a one-minute smoke run); see ``benchmarks/README.md``. The scripts you run
are at the top; what they share (modes, timing, workers, statistics) is in
``harness/``, what they write (markdown, plots, targets files) in ``reports/``,
the one-question probes in ``probes/``, the committed results in ``results/``. The pure parts
(statistics, the JSON merge, markdown, the plot) import without a GPU and are
tested in ``tests/benchmarks/test_benchmarks*.py``.
"""
