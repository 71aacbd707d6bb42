"""Shared by the kernels tests that stub launches (no tests here): the ``add_one`` fixture (compiled for sm_90;
a test module imports it) and ``stub_launches``, its driver call recorded. Not a conftest.py: a second
``conftest`` module would shadow tests/conftest.py for ``from conftest import ...`` (test_packer.py's).

Tests internals (listed in tests/README.md): a Kernel's loaded state and ``_native_launch`` stubbed,
``Kernel._launch_configs``, ``_cuda.driver._primary_context_addresses``: a launch on a CPU, seen as the driver would.
"""

import pytest

import jaxgraph
from jaxgraph._cuda import driver as _driver
from support.kernel_sources import ADD_ONE


@pytest.fixture(scope="module")
def add_one(tmp_path_factory):
    return jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path_factory.mktemp("cubins"))


def stub_launches(kernel, monkeypatch):
    """``kernel`` as if loaded (function 0xF00, device 0's context 0xC0), no configuration kept, its driver
    calls recorded instead of made: the list they go to."""
    launched = []
    monkeypatch.setattr(kernel, "_h_kernel", 1)
    monkeypatch.setattr(kernel, "_function_address", 0xF00)
    monkeypatch.setattr(kernel, "_native_launch", lambda *a: launched.append(a) or 0)
    monkeypatch.setattr(kernel, "_launch_configs", {})
    monkeypatch.setitem(_driver._primary_context_addresses, 0, 0xC0)
    return launched
