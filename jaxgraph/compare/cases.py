"""The factory contract: what a user's factory returns, and how a worker finds and calls it.

A factory is a function named ``module:function`` or ``path/to/file.py:function``.
Each worker process imports it and calls it once, with the keyword arguments
given to the tool, after its ``XLA_FLAGS`` are set. It returns one of:

- ``(fn, args)``: one function and the tuple of its positional arguments;
- a :class:`Case`;
- a dict ``{label: (fn, args) or Case}``: several functions, compared side by side.

``fn`` is wrapped in :func:`jax.jit` unless it already is one (or the Case says
``jit=False``). The arguments are built by the factory, in the worker, so they
live on that process's device. The setting's name is in the environment variable
``JAXGRAPH_COMPARE_SETTING`` while the factory runs (:func:`current_setting`).

Nothing here imports JAX: the parent process uses it too.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import sys
from typing import Any, Callable

__all__ = ["Case", "SETTING_ENV", "current_setting", "factory_spec", "load_factory", "normalize_cases"]

SETTING_ENV = "JAXGRAPH_COMPARE_SETTING"


@dataclasses.dataclass
class Case:
    """One function to compare, with its arguments.

    Parameters
    ----------
    fn : callable
        The function. Its return value (any pytree of arrays) is what the
        settings' results are compared on.
    args : tuple
        Its positional arguments, as it is called: ``fn(*args)``.
    jit : bool
        Wrap ``fn`` in :func:`jax.jit` (default) unless it is jitted already.
        ``False`` calls it as given, for code that runs its own jitted pieces.
    label : str, optional
        The name in the table when the factory returns this one case (a dict's
        keys name its cases). Default: ``fn``'s name.
    """

    fn: Callable[..., Any]
    args: tuple = ()
    jit: bool = True
    label: str | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"Case.fn must be callable, got {type(self.fn).__name__}")
        if not isinstance(self.args, (tuple, list)):
            raise TypeError(f"Case.args must be a tuple of positional arguments, got {type(self.args).__name__} "
                            "(one argument x is written (x,))")
        self.args = tuple(self.args)


def current_setting() -> str | None:
    """The name of the setting this worker runs under (``None`` outside a comparison's worker)."""
    return os.environ.get(SETTING_ENV)


# ----------------------------------------------------------------------------
# Naming and loading a factory
# ----------------------------------------------------------------------------


def factory_spec(factory: str | Callable[..., Any]) -> str:
    """``factory`` as the ``module:function`` or ``/abs/path.py:function`` string a worker loads.

    A file path is made absolute here (the worker may resolve it elsewhere). A
    function is named by its module and qualified name; one defined in the
    script being run (``__main__``) by that script's path.
    """
    if callable(factory) and not isinstance(factory, str):
        module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
        if not module or not name or "<" in name:
            raise ValueError(f"{factory!r} cannot be found by a worker process: pass a function defined at the "
                             "top level of a module, or its 'module:function' name")
        if module == "__main__":
            path = getattr(sys.modules["__main__"], "__file__", None)
            if not path:
                raise ValueError(f"{factory!r} is defined in an interactive session: a worker process cannot "
                                 "import it; put it in a file and pass 'path/to/file.py:function'")
            return f"{os.path.abspath(path)}:{name}"
        return f"{module}:{name}"
    if not isinstance(factory, str):
        raise TypeError(f"factory must be 'module:function', 'path/to/file.py:function' or a function; "
                        f"got {type(factory).__name__}")
    target, sep, name = factory.rpartition(":")
    if not sep or not target or not re.fullmatch(r"[A-Za-z_][\w.]*", name):
        raise ValueError(f"factory {factory!r} must be 'module:function' or 'path/to/file.py:function'")
    if _is_path(target):
        target = os.path.abspath(target)
    return f"{target}:{name}"


def load_factory(spec: str) -> Callable[..., Any]:
    """Import the factory named by ``spec`` (see :func:`factory_spec`); the worker calls this."""
    target, _, name = spec.rpartition(":")
    if _is_path(target):
        if not os.path.isfile(target):
            raise FileNotFoundError(f"no such factory file: {target}")
        # Its folder first on sys.path, as `python file.py` would have it: sibling imports work.
        sys.path.insert(0, os.path.dirname(target))
        module_name = "_jaxgraph_compare_factory_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(target))[0])
        module_spec = importlib.util.spec_from_file_location(module_name, target)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        module_spec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # `module:function` from the directory the tool runs in
        module = importlib.import_module(target)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{target} has no {name!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec}: {name} is a {type(obj).__name__}, not a function")
    return obj


def normalize_cases(value: Any, factory_name: str = "fn") -> dict[str, Case]:
    """What a factory returned, as ``{label: Case}`` in order; a ``TypeError`` says what it should be."""
    if isinstance(value, Case):
        return {value.label or _name_of(value.fn, factory_name): value}
    if isinstance(value, dict):
        if not value:
            raise TypeError("the factory returned an empty dict: give at least one {label: (fn, args)}")
        out = {}
        for label, item in value.items():
            if not isinstance(label, str) or not label:
                raise TypeError(f"a case's label must be a non-empty str, got {label!r}")
            out[label] = item if isinstance(item, Case) else _pair(item, f"the case {label!r}")
        return out
    case = _pair(value, "the factory's result")
    return {_name_of(case.fn, factory_name): case}


def _pair(item: Any, what: str) -> Case:
    if isinstance(item, tuple) and len(item) == 2 and callable(item[0]):
        return Case(item[0], item[1])
    raise TypeError(f"{what} must be (fn, args), a jaxgraph.compare.Case or a dict {{label: (fn, args)}}; got "
                    f"{_describe(item)}")


def _describe(item: Any) -> str:
    if isinstance(item, tuple):
        return f"a tuple of {len(item)} ({', '.join(type(x).__name__ for x in item[:4])})"
    return type(item).__name__


def _name_of(fn: Callable[..., Any], default: str) -> str:
    name = getattr(fn, "__name__", "")
    return name if name.isidentifier() else default


def _is_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target
