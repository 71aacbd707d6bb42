"""A factory file that cannot be imported: it imports a module that does not exist."""

import jaxgraph_no_such_module  # noqa: F401


def make_case():
    raise AssertionError("never reached")
