"""The machinery the benchmark scripts share: what runs, how it is timed, where a result came from.

- ``config``: the processes and their XLA flags, chain lengths, budgets, modes;
- ``workload``: the chain of N ``add_one`` kernels and its numpy check
  (``gray_scott_split``: the gray_scott step ``gray_scott_bench.py`` times);
- ``graph_modes``, ``jax_modes``, ``loop_modes``, ``extras``, ``large_graph_modes``:
  the modes, each a factory that checks its result before it is timed;
- ``timing``: a mode's warm-up, calibration and interleaved sampling;
- ``stats``: medians, spread, ratios to the floor, the JSON merge;
- ``worker``: one benchmark process (``python -m benchmarks.harness.worker``);
- ``process_launcher``: N processes of one JAX program, as a cluster launcher starts them;
- ``provenance``: the commit, versions and device a result records;
- ``example_loader``: ``examples/<name>.py`` imported as a module.
"""
