"""One-question probes: each answered a question the harness raised; the table in README.md gives the answers.

They stay runnable (``python benchmarks/probes/<name>.py``; ``tests/benchmarks/test_probes.py``
runs them small on a GPU) so an answer can be checked again on another machine.
"""
