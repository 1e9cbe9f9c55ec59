"""Parse the text of `nvidia-smi topo -m` (the GPU link matrix) into plain data.

Why: the link level between two GPUs (NV#, PIX, PXB, PHB, NODE, SYS) decides what a pipeline
hop costs, and `nvidia-smi topo -m` is the one output every user can paste. `ppscope topology
--from-nvidia-smi FILE` runs this parser on a machine without a GPU.

Formats seen across driver generations, all handled:
- columns separated by tabs or by runs of spaces; the diagonal printed as ` X ` or `X`;
- ANSI underline/bold escapes around the header when nvidia-smi wrote to a terminal;
- NIC columns and rows (`NIC0`, `mlx5_0`, `mlx4_0`), with or without a `NIC Legend:` block;
- trailing columns `CPU Affinity` [`NUMA Affinity` [`GPU NUMA ID`]] (old drivers print only
  `CPU Affinity`), any of them `N/A`;
- very old drivers print `SOC` where newer ones print `SYS`.

Anything else is rejected with a one-line message naming the line (`TopoParseError`), never a
guess: a wrong link map would silently mis-classify every hop.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
LINK_RE = re.compile(r"^(X|SYS|SOC|NODE|PHB|PXB|PIX|NV\d+|C2C)$")
GPU_RE = re.compile(r"^GPU(\d+)$")
TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


class TopoParseError(ValueError):
    """A `nvidia-smi topo -m` text that cannot be read; one line, names the line number."""


@dataclass(frozen=True)
class SmiGpu:
    index: int
    cpu_affinity: str | None   # as printed, e.g. "0-55,112-167"; None for N/A
    numa_node: int | None      # from `NUMA Affinity`; None for N/A or when not printed
    gpu_numa_id: int | None    # from `GPU NUMA ID` (set on Grace/C2C systems); None otherwise


@dataclass(frozen=True)
class SmiTopo:
    gpus: tuple[SmiGpu, ...]
    links: dict[str, str]      # "i-j" (i < j) -> link level exactly as printed
    nics: tuple[str, ...]      # NIC column names (NIC0.. or mlx5_0..)
    columns: tuple[str, ...]   # trailing columns present (driver era)


def _na_int(tok: str, lineno: int, what: str) -> int | None:
    if tok.upper() == "N/A":
        return None
    # NUMA Affinity can be a range on some hosts ("0-1"); the nearest node is its first entry.
    m = re.match(r"^(\d+)(?:[-,]\d+)*$", tok)
    if not m:
        raise TopoParseError(f"line {lineno}: {what} {tok!r} is neither a number nor N/A")
    return int(m.group(1))


def _split_header(line: str, lineno: int) -> tuple[list[str], list[str]]:
    """Device column names and the trailing column names present, in order."""
    pos = [(line.find(name), name) for name in TRAILING if line.find(name) >= 0]
    pos.sort()
    first = pos[0][0] if pos else len(line)
    devices = line[:first].split()
    trailing = [name for _, name in pos]
    if "CPU Affinity" not in trailing:
        raise TopoParseError(f"line {lineno}: header has no 'CPU Affinity' column")
    if trailing[0] != "CPU Affinity":
        raise TopoParseError(f"line {lineno}: header columns after the devices are out of order")
    return devices, trailing


def parse_topo_matrix(text: str) -> SmiTopo:
    """Parse `nvidia-smi topo -m` output. Raises TopoParseError (one line) on malformed text."""
    lines = [ANSI_RE.sub("", ln).replace("\r", "") for ln in text.splitlines()]
    header_at = None
    for n, ln in enumerate(lines):
        toks = ln.split()
        if toks and toks[0] == "GPU0":
            header_at = n
            break
        if toks and GPU_RE.match(toks[0]):
            raise TopoParseError(f"line {n + 1}: GPU row before the header line")
    if header_at is None:
        first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
        where = f"line {first + 1}" if first is not None else "line 1"
        raise TopoParseError(f"{where}: no header line starting with GPU0 "
                             "(is this `nvidia-smi topo -m` output?)")
    devices, trailing = _split_header(lines[header_at], header_at + 1)
    gpu_cols = [d for d in devices if GPU_RE.match(d)]
    if gpu_cols != [f"GPU{i}" for i in range(len(gpu_cols))]:
        raise TopoParseError(f"line {header_at + 1}: GPU columns are not GPU0..GPU{len(gpu_cols) - 1}")
    if devices[:len(gpu_cols)] != gpu_cols:
        raise TopoParseError(f"line {header_at + 1}: GPU columns must come before NIC columns")
    nics = tuple(devices[len(gpu_cols):])
    ngpu = len(gpu_cols)

    rows: dict[int, tuple[int, list[str]]] = {}
    gpus: list[SmiGpu] = []
    for n in range(header_at + 1, len(lines)):
        lineno = n + 1
        toks = lines[n].split()
        if not toks:
            continue
        if toks[0].rstrip(":") in ("Legend", "NIC"):
            break  # the legend blocks end the matrix
        m = GPU_RE.match(toks[0])
        if not m:
            if toks[0] in nics:
                continue  # NIC rows carry no GPU information
            raise TopoParseError(f"line {lineno}: unexpected row {toks[0]!r} in the matrix")
        idx = int(m.group(1))
        if idx != len(gpus):
            raise TopoParseError(f"line {lineno}: expected row GPU{len(gpus)}, found {toks[0]}")
        cells = toks[1:1 + len(devices)]
        rest = toks[1 + len(devices):]
        if len(cells) < len(devices):
            raise TopoParseError(f"line {lineno}: row {toks[0]} has {len(cells)} link entries, "
                                 f"header has {len(devices)} devices")
        for col, cell in zip(devices, cells):
            if not LINK_RE.match(cell):
                raise TopoParseError(f"line {lineno}: unknown link {cell!r} in column {col}")
        if cells[idx] != "X":
            raise TopoParseError(f"line {lineno}: diagonal entry of {toks[0]} is {cells[idx]!r}, "
                                 "expected X")
        if "X" in cells[:ngpu][:idx] + cells[:ngpu][idx + 1:]:
            raise TopoParseError(f"line {lineno}: X off the diagonal in row {toks[0]}")
        if len(rest) != len(trailing):
            raise TopoParseError(f"line {lineno}: row {toks[0]} has {len(rest)} values after the "
                                 f"links, expected {len(trailing)} ({', '.join(trailing)})")
        vals = dict(zip(trailing, rest))
        cpu = vals["CPU Affinity"]
        if cpu.upper() != "N/A" and not re.match(r"^\d+(-\d+)?(,\d+(-\d+)?)*$", cpu):
            raise TopoParseError(f"line {lineno}: CPU affinity {cpu!r} is not a CPU list")
        gpus.append(SmiGpu(
            index=idx,
            cpu_affinity=None if cpu.upper() == "N/A" else cpu,
            numa_node=_na_int(vals["NUMA Affinity"], lineno, "NUMA affinity")
            if "NUMA Affinity" in vals else None,
            gpu_numa_id=_na_int(vals["GPU NUMA ID"], lineno, "GPU NUMA ID")
            if "GPU NUMA ID" in vals else None,
        ))
        rows[idx] = (lineno, cells[:ngpu])
    if len(gpus) != ngpu:
        raise TopoParseError(f"line {len(lines)}: header names {ngpu} GPUs but {len(gpus)} GPU "
                             "rows follow")
    links: dict[str, str] = {}
    for i in range(ngpu):
        for j in range(i + 1, ngpu):
            a, b = rows[i][1][j], rows[j][1][i]
            if a != b:
                raise TopoParseError(f"line {rows[j][0]}: GPU{j}->GPU{i} is {b} but "
                                     f"GPU{i}->GPU{j} is {a} (matrix not symmetric)")
            links[f"{i}-{j}"] = a
    return SmiTopo(gpus=tuple(gpus), links=links, nics=nics, columns=tuple(trailing))
