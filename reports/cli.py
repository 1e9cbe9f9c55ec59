"""`ppscope` console script: one sub-command per probe plus `report`.

Argument parsing lives here and in each area's `*_cli.py` (`register(subparsers)`); the probes
themselves are plain functions. Sub-command modules are imported when the parser is built, so
they must not import torch or touch CUDA at module level.

Errors the user can fix print one line (`ppscope: error: ...`, capped) and exit 2; Ctrl-C exits
130 after the probe has kept what it measured, SIGTERM the same way with 143; anything
unexpected prints one line and exits 1 (set PPSCOPE_DEBUG=1 for the traceback).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import Callable

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
        importlib.import_module(mod).register(sub)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM (a `kill`, a CI timeout, a container stopping), unwound like Ctrl-C: temp files
    removed, what was measured kept, exit 143."""


def _sigterm_as_interrupt():
    """Make SIGTERM raise Terminated while a command runs; returns the handler to restore
    (None off the main thread, where signals cannot be set)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise Terminated(f"signal {signum}")
    return signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    """Run one `ppscope` command under the CLI's rules (`run_guarded`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.argv = ["ppscope", *argv]
    return run_guarded(f"ppscope {args.command}", lambda: args.func(args))


def run_guarded(label: str, fn: Callable[[], int | None]) -> int:
    """`fn()` under the CLI's rules (module docstring), for `ppscope` and for the entry points
    beside it (`python -m` modules): a CliError or OSError is one capped line and exit 2,
    Ctrl-C 130, SIGTERM 143, anything else one line and exit 1. What it prints goes through
    reports/base/text.py's `printable`: nothing of the user's evidence drives the terminal."""
    import signal
    from reports.base.text import PrintableStream, one_line
    old_term = _sigterm_as_interrupt()
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PrintableStream(sys.stdout), PrintableStream(sys.stderr)
    try:
        return int(fn() or 0)
    except CliError as e:
        print(f"{label}: error: {one_line(str(e))}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a path that is a directory, unwritable, missing, a full disk...
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"{label}: error: {one_line(where + (e.strerror or type(e).__name__))}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"{label}: {'terminated' if isinstance(e, Terminated) else 'interrupted'}; "
              "what was measured so far is kept", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    except Exception as e:  # noqa: BLE001 - last line of defence: one line, never a traceback
        if os.environ.get("PPSCOPE_DEBUG"):
            traceback.print_exc()
        msg = str(e).splitlines()[0] if str(e) else ""
        print(f"{label}: internal error: {type(e).__name__}: {one_line(msg)} "
              f"(set PPSCOPE_DEBUG=1 for details)", file=sys.stderr)
        return 1
    finally:
        sys.stdout, sys.stderr = streams
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


if __name__ == "__main__":
    sys.exit(main())
