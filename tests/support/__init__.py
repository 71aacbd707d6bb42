"""What the tests share (no tests here): kernel sources, graph and loop helpers, the door into internals.

``python -m pytest`` puts ``tests/`` on the import path through ``conftest.py``, so test modules
import these as ``support.<module>``; workers run in fresh processes get ``tests/`` on their path too.
"""
