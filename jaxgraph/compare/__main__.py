"""``python -m jaxgraph.compare FACTORY``: the command line of :func:`jaxgraph.compare.run`.

Prints the table; exits 0 when every function ran under every setting and the
results agree, 1 when something failed or differs (the table says what), 2 on
a usage error.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys

from . import DEFAULT_SETTINGS, SETTINGS, run
from .plot import matplotlib_missing

EPILOG = """\
FACTORY is 'module:function' or 'path/to/file.py:function'. It returns (fn, args), a
jaxgraph.compare.Case, or a dict {label: (fn, args)}; fn is jitted unless it already is.
Settings: """ + "; ".join(f"{s.name}: {s.label}" for s in SETTINGS.values()) + """.
Add your own with --setting NAME=FLAGS (e.g. --setting "plus=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL").
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jaxgraph.compare", description=__doc__.splitlines()[0].strip("`"),
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("factory", help="module:function or path/to/file.py:function")
    p.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                   help=f"comma-separated names from {', '.join(SETTINGS)} (default: all four)")
    p.add_argument("--setting", action="append", default=[], metavar="NAME=FLAGS",
                   help="a setting of your own, XLA_FLAGS exactly FLAGS (repeatable)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--target-ms", type=float, default=20.0, help="about how long one sample takes (default 20)")
    p.add_argument("--max-calls", type=int, default=10_000, help="at most this many calls a sample")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="per worker: the longest its start-up or one sample may take (default 300)")
    p.add_argument("--rtol", type=float, default=1e-5, help="agreement: relative tolerance (default 1e-5)")
    p.add_argument("--atol", type=float, default=1e-8, help="agreement: absolute tolerance (default 1e-8)")
    p.add_argument("--compare-functions", action="store_true",
                   help="also check that every function's result matches the first function's")
    p.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a keyword argument for the factory (VALUE a Python literal, else a string; repeatable)")
    p.add_argument("--xla-flags", default="", metavar="FLAGS",
                   help="flags appended to every setting's XLA_FLAGS (the environment's XLA_FLAGS are not used)")
    p.add_argument("--no-dump", action="store_true", help="don't dump XLA's HLO to count command buffers")
    p.add_argument("--json", metavar="PATH", help="write the data as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG (needs matplotlib)")
    p.add_argument("--verbose", action="store_true", help="show each failure's traceback and the workers' progress")
    args = p.parse_args(argv)
    args.settings_list = [s.strip() for s in args.settings.split(",") if s.strip()] + args.setting
    args.kwargs = {}
    for item in args.arg:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            p.error(f"--arg {item!r}: write KEY=VALUE")
        try:
            args.kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            args.kwargs[key] = value
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    progress = (lambda line: print(line, file=sys.stderr, flush=True)) if args.verbose else None
    try:
        result = run(args.factory, args.settings_list, rounds=args.rounds, target_ms=args.target_ms,
                     max_calls=args.max_calls, timeout_s=args.timeout, rtol=args.rtol, atol=args.atol,
                     compare_functions=args.compare_functions,
                     factory_kwargs=args.kwargs, extra_xla_flags=args.xla_flags,
                     count_command_buffers=not args.no_dump, progress=progress)
    except (ValueError, TypeError) as exc:  # our own argument checks: a usage error, not a traceback
        print(f"python -m jaxgraph.compare: error: {exc}", file=sys.stderr)
        return 2
    print(result.table(verbose=args.verbose))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(result.to_json() + "\n")
        print(f"\nwrote {args.json}")
    if args.plot:
        missing = matplotlib_missing()
        if missing:
            print(f"\n{missing}")
        else:
            result.plot(args.plot)
            print(f"\nwrote {args.plot}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
