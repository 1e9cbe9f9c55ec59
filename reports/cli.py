"""`ppscope` console script: one sub-command per probe plus `report`.

Argument parsing lives here and in each area's `*_cli.py` (`register(subparsers)`); the probes
themselves are plain functions. Sub-command modules are imported when the parser is built, so
they must not import torch or touch CUDA at module level.

Errors the user can fix print one line (`ppscope: error: ...`) and exit 2; Ctrl-C exits 130
after the probe has kept what it measured; anything unexpected prints one line and exits 1
(set PPSCOPE_DEBUG=1 for the traceback).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from reports.base.errors import CliError
from reports.base.probes import cli_modules

# The modules that register a sub-command, in the order `--help` lists them (the probe list,
# reports/base/probes.py, then the lab and the report).
SUBCOMMANDS = cli_modules()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ppscope",
        description="Find out why pipeline-parallel LLM inference is slower than it should be. "
                    "Run the probes on the GPU machine, then `ppscope report`.",
    )
    p.add_argument("--version", action="version", version="ppscope 0.1.0")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in SUBCOMMANDS:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:  # an area not built yet must not break the others
            if e.name and mod.startswith(e.name):
                continue
            raise
        m.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.argv = ["ppscope", *argv]
    try:
        rc = args.func(args)
        return int(rc or 0)
    except CliError as e:
        print(f"ppscope {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a path that is a directory, unwritable, missing, a full disk...
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"ppscope {args.command}: error: {where}{e.strerror or type(e).__name__}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ppscope {args.command}: interrupted; what was measured so far is kept",
              file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - last line of defence: one line, never a traceback
        if os.environ.get("PPSCOPE_DEBUG"):
            traceback.print_exc()
        msg = str(e).splitlines()[0] if str(e) else ""
        print(f"ppscope {args.command}: internal error: {type(e).__name__}: {msg} "
              f"(set PPSCOPE_DEBUG=1 for details)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
