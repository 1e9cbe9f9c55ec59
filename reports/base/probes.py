"""The probes, listed once: the record each writes (`results/<name>.json`, its payload class in
reports/base/payloads/), the `ppscope` sub-command and the module that registers it, and the
make target `make all` runs. The console script (reports/cli.py), the report's record loader
(reports/model/scenario/inputs.py), the payload map and the Makefile all read this list.

`python -m reports.base.probes make-targets` prints the targets `make all` runs, in order.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    name: str                  # the record: results/<name>.json
    command: str | None        # `ppscope <command>`; None: written by another command
    cli: str | None            # module whose register(subparsers) adds the command
    make: str | None = None    # the make target `make all` runs (a probe of the GPU machine)


PROBES: tuple[Probe, ...] = (
    Probe("topology", "topology", "topology.topology_cli", "topology"),
    Probe("stage_cost", "stage-cost", "microbench.stage_cost.cli", "stage-cost"),
    Probe("graphs", "graphs", "microbench.graphs.cli", "graphs"),
    Probe("dispatch", "dispatch", "microbench.dispatch.cli", "dispatch"),
    Probe("sglang", "sglang", "microbench.sglang.cli"),
    Probe("watch", None, None),          # `ppscope sglang --watch` writes it
)
# Commands that are not probes: the lab (SGLang's own server under test) and the report.
OTHER_COMMANDS = ("microbench.sglang_lab.lab_cli", "microbench.sglang_lab.twin.cli",
                  "reports.report_cli")
NAMES = tuple(p.name for p in PROBES)


def cli_modules() -> tuple[str, ...]:
    """Every module that registers a sub-command, in the order `ppscope --help` lists them."""
    return tuple(p.cli for p in PROBES if p.cli) + OTHER_COMMANDS


def make_targets() -> tuple[str, ...]:
    return tuple(p.make for p in PROBES if p.make)


if __name__ == "__main__":
    if sys.argv[1:] != ["make-targets"]:
        sys.exit("usage: python -m reports.base.probes make-targets")
    print(" ".join(make_targets()))
