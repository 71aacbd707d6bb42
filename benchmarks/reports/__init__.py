"""What the benchmark scripts write: markdown, plots and the targets files, pure functions of their JSON.

- ``run_report``: the markdown of a ``run.py`` run; ``plot``: its PNG;
- ``consecutive_runs``: ``run.py --runs K``'s file names and its runs side by side;
- ``large_graphs_report``, ``gray_scott_report``, ``vs_idiomatic_report``: the other scripts' reports;
- ``targets`` and ``targets_over_runs`` (issues 8 and 19), with ``verdicts``, what they share:
  ``<device>-targets.md``, generated from the committed JSON.

``plot.py``, ``targets.py`` and ``consecutive_runs.py`` also run as scripts (any machine).
"""
