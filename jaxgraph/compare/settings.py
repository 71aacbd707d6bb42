"""The XLA settings a comparison runs under: one worker process each, with its own ``XLA_FLAGS``.

XLA reads ``XLA_FLAGS`` once, when its backend starts, so a setting is a
process, never a switch inside one. These four are the ones the project's
benchmarks use (``benchmarks/config.py`` defines the same flags; it may import
them from here).
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["DEFAULT_SETTINGS", "SETTINGS", "Setting", "parse_setting"]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One XLA setting: a name, the exact ``XLA_FLAGS`` its process gets, and what it means.

    Attributes
    ----------
    name : str
        A short key (``"off"``, ``"on"``, ``"defaults"``, ``"while"`` or your own).
    xla_flags : str or None
        ``XLA_FLAGS`` for the worker, exactly; ``None`` removes ``XLA_FLAGS``
        from its environment (JAX's defaults).
    label : str
        One line saying what the setting is, for the table's legend.
    """

    name: str
    xla_flags: str | None
    label: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_.+-]+", self.name):
            raise ValueError(f"a setting's name must be letters, digits or _.+- (it names a process and a "
                             f"file); got {self.name!r}")
        if self.xla_flags is not None and not isinstance(self.xla_flags, str):
            raise TypeError(f"xla_flags must be a str or None, got {type(self.xla_flags).__name__}")


SETTINGS: dict[str, Setting] = {
    "off": Setting("off", "--xla_gpu_enable_command_buffer=", "XLA command buffers off"),
    "on": Setting("on", "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
                  "XLA command buffers on (FUSION,CUSTOM_CALL, min size 1)"),
    "defaults": Setting("defaults", None, "JAX defaults (XLA_FLAGS unset)"),
    # XLA's opt-in command buffers for loops and branches: a while loop or a conditional becomes a
    # CUDA graph node. The same set as the benchmarks' "while": "on" plus WHILE,CONDITIONAL.
    "while": Setting("while", "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL "
                     "--xla_gpu_graph_min_graph_size=1",
                     "XLA command buffers with WHILE,CONDITIONAL (FUSION,CUSTOM_CALL, min size 1)"),
}
DEFAULT_SETTINGS: tuple[str, ...] = ("off", "on", "defaults", "while")


def parse_setting(spec: str | Setting) -> Setting:
    """A :class:`Setting` from a known name (``"on"``) or ``"NAME=FLAGS"`` (your own flags).

    ``"NAME="`` gives an empty ``XLA_FLAGS``; to run with ``XLA_FLAGS`` unset
    use the ``defaults`` setting.
    """
    if isinstance(spec, Setting):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a setting is a name, 'NAME=FLAGS' or a Setting; got {type(spec).__name__}")
    if "=" in spec.split(" ", 1)[0] and not spec.startswith("-"):
        name, flags = spec.split("=", 1)
        return Setting(name.strip(), flags.strip(), "your own flags")
    if spec not in SETTINGS:
        raise ValueError(f"unknown setting {spec!r}: choose from {', '.join(SETTINGS)} or give your own "
                         "as NAME=FLAGS")
    return SETTINGS[spec]
