"""Parse the text of `nvidia-smi topo -m` (the GPU link matrix) into plain data.

Why: the link level between two GPUs (NV#, PIX, PXB, PHB, NODE, SYS) decides what a pipeline
hop costs, and `nvidia-smi topo -m` is the one output every user can paste. `ppscope topology
--from-nvidia-smi FILE` runs this parser on a machine without a GPU.

Users paste what they have, so the parser reads what can be read, marks the rest unknown and
says what it skipped (`SmiTopo.notes`, one line each, naming the line), and rejects the text
(`TopoParseError`, one line) only when no matrix is recognisable: no header line with GPU0, or a
header with no readable GPU row under it. It never guesses a link: a pair whose cell cannot be
placed with certainty is left out of `links` and listed in `unknown_pairs` (a wrong link would
silently mis-classify a hop; a missing one shows as "?" and the hop as unknown).

Layouts handled:
- as nvidia-smi prints it: tab-separated, ` X ` on the diagonal, an empty cell before
  `GPU NUMA ID`; ANSI underline/bold around the header when it wrote to a terminal; NIC columns
  and rows (`NIC0`, `mlx5_0`, `mlx4_0`) with or without a `NIC Legend:` block; trailing columns
  `CPU Affinity` [`NUMA Affinity` [`GPU NUMA ID`]] (old drivers print only `CPU Affinity`), any of
  them `N/A`; `SOC` (very old drivers) for `SYS`;
- empty fields: inside a Slurm/cgroup allocation CPU Affinity is printed empty for GPUs whose
  CPUs are outside the job's cpuset (two tabs in a row; layout as in rapidsai/dask-cuda#1381).
  With tabs the empty cell is exact; when the tabs became spaces the values are right-aligned
  (NUMA Affinity and GPU NUMA ID are always printed, N/A when unknown), and the note says so;
- tables trimmed by hand in READMEs, issues and job scripts: spaces instead of tabs, no
  affinity columns, a `NUMA n` note at the end of each row, lines behind `#` or `>` or in a
  Markdown table, rows shifted by a column. A shifted row is re-aligned on its ` X ` (the cells
  on the side of the diagonal where nothing was lost or added are kept, the others are unknown),
  and a pair is taken from the other GPU's row when only one of the two is readable;
- glued columns from a lost tab (`NIC8NIC9` in the header, `NODEPXB` in a row; layout as in
  vllm-project/vllm#13855): split into known names/levels, with a note;
- shell prompts, the command line and blank lines before the table, the legend after it.

Each note starts with `line N:` when it is about one line. A pair both rows give but disagree on
is unknown (`matrix not symmetric` in the note).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reports.base.errors import CliError
from reports.base.paths import open_input

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LEVEL = r"(?:X|SYS|SOC|NODE|PHB|PXB|PIX|NV\d+|C2C)"
LINK_RE = re.compile(rf"^{_LEVEL}$")
_LINKS_GLUED = re.compile(rf"^{_LEVEL}{{2,}}$")
_LINK_ITER = re.compile(_LEVEL)
GPU_RE = re.compile(r"^GPU(\d+)$")
_DEV = r"(?:GPU\d+|NIC\d+|mlx\d+_\d+)"
_DEVS_GLUED = re.compile(rf"^{_DEV}{{2,}}$")
_DEV_ITER = re.compile(_DEV)
TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_NUMA_VAL = re.compile(r"^(\d+)(?:[-,]\d+)*$")
# a hand-written note at the end of a row: "NUMA 0", "(NUMA node 1)", "numa=1", "# NUMA: 0"
_NUMA_NOTE = re.compile(r"[#(\[]?\s*\bNUMA(?:[ _]?node)?\s*[:=]?\s*(\d+)\s*[)\]]?", re.I)
_QUOTE = re.compile(r"^\s*(?:#+|>+|//)\s?(?=\s*(?:GPU|NIC|mlx|\t|\s{2}))")
# an upper-case word where a link level should be: an unknown level, holding its cell
_LINKISH = re.compile(r"^(?!N/A$|NUMA|CPU)[A-Z][A-Z0-9]{1,7}$")
_MD_RULE = re.compile(r"^[\s|:+-]+$")
MAX_TEXT_BYTES = 1 << 20   # a 16-GPU, 16-NIC matrix with legend is ~10 kB
MAX_NOTES = 40


class TopoParseError(CliError, ValueError):
    """A `nvidia-smi topo -m` text with no recognisable matrix; one line, names the line (a
    CliError: the CLI prints it and exits 2)."""


@dataclass(frozen=True)
class SmiGpu:
    index: int
    cpu_affinity: str | None   # as printed, e.g. "0-55,112-167"; None for N/A, empty or unknown
    numa_node: int | None      # from `NUMA Affinity` (or a `NUMA n` row note); None otherwise
    gpu_numa_id: int | None    # from `GPU NUMA ID` (set on Grace/C2C systems); None otherwise


@dataclass(frozen=True)
class SmiTopo:
    gpus: tuple[SmiGpu, ...]
    links: dict[str, str]      # "i-j" (i < j) -> link level exactly as printed; known pairs only
    nics: tuple[str, ...]      # NIC column names (NIC0.. or mlx5_0..)
    columns: tuple[str, ...]   # trailing columns present in the header (driver era)
    unknown_pairs: tuple[str, ...] = ()   # "i-j" pairs whose link could not be read
    notes: tuple[str, ...] = ()           # what was skipped, guessed or left unknown, and why


def read_smi_file(path: str | Path) -> str:
    """The text of a saved `nvidia-smi topo -m`, at most MAX_TEXT_BYTES (a device file such as
    /dev/zero or a huge paste is refused, not read forever). Raises TopoParseError (one line)."""
    p = Path(path)
    with open_input(path, "`nvidia-smi topo -m` output", TopoParseError) as f:
        try:
            raw = f.read(MAX_TEXT_BYTES + 1)
        except OSError as e:
            raise TopoParseError(f"cannot read {p}: {e.strerror or e}") from None
    if len(raw) > MAX_TEXT_BYTES:
        raise TopoParseError(f"{p} is larger than {MAX_TEXT_BYTES >> 20} MB; a `nvidia-smi topo "
                             "-m` output is a few kB (is it the right file?)")
    if b"\x00" in raw:
        raise TopoParseError(f"{p} holds binary data, not `nvidia-smi topo -m` text")
    return raw.decode("utf-8", errors="replace")


def _unglue_devices(tok: str) -> list[str]:
    return _DEV_ITER.findall(tok) if _DEVS_GLUED.match(tok) else [tok]


def _unglue_links(tok: str) -> list[str]:
    return _LINK_ITER.findall(tok) if _LINKS_GLUED.match(tok) else [tok]


def _clean(line: str) -> str:
    line = ANSI_RE.sub("", line).replace("\r", "").replace("\u00a0", " ")
    line = _QUOTE.sub("", line)
    if "|" in line:   # a Markdown table: cells between pipes are like tab-separated cells
        line = "\t".join(c.strip() for c in line.strip().strip("|").split("|"))
    return line


def _cells(line: str) -> tuple[list[str], bool]:
    """Cells of a line and whether they are exact (tab-separated: an empty cell is a cell)."""
    if "\t" in line:
        cells = [c.strip() for c in line.split("\t")]
        while cells and not cells[0]:
            cells.pop(0)
        return cells, True
    return line.split(), False


def _find_header(lines: list[str]) -> tuple[int, list[str]] | None:
    for n, ln in enumerate(lines):
        toks = [t for tok in ln.split() for t in _unglue_devices(tok)]
        if "GPU0" not in toks:
            continue
        k = toks.index("GPU0")
        nxt = toks[k + 1] if k + 1 < len(toks) else None
        # a header's GPU0 is followed by another column name (or nothing, on a 1-GPU machine);
        # a row's GPU0 is followed by a link level
        if nxt is None or not LINK_RE.match(nxt) and not _LINKS_GLUED.match(nxt):
            return n, toks
    return None


def _split_header(line: str, lineno: int, notes: list[str]) -> tuple[list[str], list[str]]:
    """Device column names and the trailing column names present, in printed order."""
    pos = sorted((line.find(name), name) for name in TRAILING if line.find(name) >= 0)
    first = pos[0][0] if pos else len(line)
    raw = line[:first].split()
    devices: list[str] = []
    for tok in raw:
        parts = _unglue_devices(tok)
        if len(parts) > 1:
            notes.append(f"line {lineno}: header cell {tok!r} read as {', '.join(parts)} "
                         "(a lost tab glued two columns)")
        devices += parts
    k = devices.index("GPU0")
    if k:
        notes.append(f"line {lineno}: {' '.join(devices[:k])!r} before GPU0 in the header ignored")
    devices = devices[k:]
    trailing = [name for _, name in pos]
    if not trailing:
        notes.append(f"line {lineno}: header has no CPU Affinity / NUMA Affinity columns (a "
                     "trimmed table?): affinity unknown unless rows carry a 'NUMA n' note")
    return devices, trailing


def _affinity(vals: dict[str, str], lineno: int, label: str, notes: list[str]) -> tuple:
    """(cpu_affinity, numa_node, gpu_numa_id) from a row's trailing values; bad ones -> None."""
    def num(col: str) -> int | None:
        v = vals.get(col)
        if v is None or v == "" or v.upper() == "N/A":
            return None
        m = _NUMA_VAL.match(v)  # NUMA Affinity can be a range ("0-1"): the nearest node first
        if not m:
            notes.append(f"line {lineno}: {label} {col} {v!r} is neither a number nor N/A; "
                         "left unknown")
            return None
        return int(m.group(1))

    cpu = vals.get("CPU Affinity")
    if cpu is not None and cpu.upper() != "N/A" and cpu != "" and not _CPU_LIST.match(cpu):
        notes.append(f"line {lineno}: {label} CPU affinity {cpu!r} is not a CPU list; left unknown")
        cpu = None
    if cpu is not None and (cpu == "" or cpu.upper() == "N/A"):
        cpu = None
    return cpu, num("NUMA Affinity"), num("GPU NUMA ID")


def _fits(col: str, v: str) -> bool:
    if v.upper() == "N/A":
        return True
    if col == "CPU Affinity":
        return bool(_CPU_LIST.match(v))
    # a NUMA node list is a node or a few ("0", "0-1"); "0-31,64-95" is a CPU list, never one
    if not _NUMA_VAL.match(v):
        return False
    spans = [[int(x) for x in part.split("-")] for part in v.split(",")]
    return all(n < 64 for sp in spans for n in sp) and all(sp[-1] - sp[0] < 8 for sp in spans)


def _trailing_values(rest: list[str], exact: bool, trailing: list[str], lineno: int,
                     label: str, notes: list[str]) -> dict[str, str]:
    """Map a row's cells after the links onto the header's trailing columns."""
    text = " ".join(c for c in rest if c)
    m = _NUMA_NOTE.search(text)
    note_numa = None
    if m:   # a hand-written "NUMA n" in the row: the row was edited, its cells are not exact
        note_numa = m.group(1)
        rest, exact = (text[:m.start()] + " " + text[m.end():]).split(), False
    if exact:
        while len(rest) > len(trailing) and rest and not rest[-1]:
            rest = rest[:-1]
        # nvidia-smi writes an empty cell between NUMA Affinity and GPU NUMA ID
        if (len(rest) == len(trailing) + 1 and trailing and trailing[-1] == "GPU NUMA ID"
                and rest[-2] == ""):
            rest = rest[:-2] + rest[-1:]
    else:
        rest = [c for c in rest if c]
    vals: dict[str, str] = {}
    if len(rest) == len(trailing):
        vals = dict(zip(trailing, rest))
        empty = [c for c, v in vals.items() if v == ""]
        if empty:
            notes.append(f"line {lineno}: {label} has an empty {' and '.join(empty)} (as printed "
                         "inside a Slurm/cgroup allocation); left unknown")
    elif len(rest) < len(trailing) and rest and not exact:
        # which columns lost their value: right-aligned first (an empty CPU Affinity), else the
        # first placement in which every value fits its column (`N/A` fits any)
        import itertools
        places = [[trailing[i] for i in c] for c in
                  reversed(list(itertools.combinations(range(len(trailing)), len(rest))))]
        cols = next((c for c in places if all(_fits(k, v) for k, v in zip(c, rest))), None)
        if cols is not None:
            vals = dict(zip(cols, rest))
            missing = [c for c in trailing if c not in cols]
            notes.append(f"line {lineno}: {label} has no {' / '.join(missing)} value (empty inside "
                         "a Slurm/cgroup allocation; the tabs became spaces); each value placed "
                         "in the column it fits, the missing ones unknown")
        else:
            notes.append(f"line {lineno}: {label} has {len(rest)} values after the links for "
                         f"{len(trailing)} columns ({', '.join(trailing)}); affinity unknown")
    elif rest and any(rest):
        if trailing:
            notes.append(f"line {lineno}: {label} has {len(rest)} values after the links for "
                         f"{len(trailing)} columns ({', '.join(trailing)}); affinity unknown")
        else:
            notes.append(f"line {lineno}: {label}: {' '.join(c for c in rest if c)!r} after the "
                         "links, no column for it in the header; ignored")
    elif trailing and not note_numa:
        notes.append(f"line {lineno}: {label} has no values after the links; affinity unknown")
    if note_numa is not None and "NUMA Affinity" not in vals:
        vals["NUMA Affinity"] = note_numa
    return vals


def _row_links(cells: list[str], ndev: int, idx: int, lineno: int, label: str,
               notes: list[str], exact: bool) -> tuple[dict[int, str], list[str]]:
    """Column index -> level for the cells of a row that can be placed with certainty, and the
    cells after the links. See the module docstring for the re-alignment on ` X `."""
    head = cells[:ndev]
    if (exact and len(head) == ndev and head[idx:idx + 1] == ["X"]
            and all(c == "" or LINK_RE.match(c) for c in head)):
        # exact cells with the X in place: every cell is where it was printed, an empty one is
        # a cell left blank (a hand-edited table), unknown
        return {j: c for j, c in enumerate(head) if c and j != idx}, cells[ndev:]
    links: list[str] = []
    k = end = 0   # end: just past the last link cell (an empty cell after it is a value)
    while k < len(cells) and len(links) < ndev + 2:
        c = cells[k]
        k += 1
        if c == "":
            continue
        parts = _unglue_links(c)
        if not all(LINK_RE.match(p) for p in parts):
            if not _LINKISH.match(c):
                break
            # a level this parser does not know (a typo, a future driver's): the cell holds
            # the column's place, its value is unknown
            notes.append(f"line {lineno}: {label} has unknown link {c!r}; that pair unknown")
            parts = ["?"]
        if len(parts) > 1:
            notes.append(f"line {lineno}: {label} cell {c!r} read as {', '.join(parts)} (a lost "
                         "tab glued two columns)")
        links += parts
        end = k
    rest = cells[end:]
    if "X" not in links:
        notes.append(f"line {lineno}: {label} has no X on its diagonal; its links are unknown")
        return {}, rest
    p = links.index("X")
    if links.count("X") > 1:
        notes.append(f"line {lineno}: {label} has X off the diagonal; its links are unknown")
        return {}, rest
    lost_before = idx - p
    lost_after = (ndev - len(links)) - lost_before
    out: dict[int, str] = {}
    if lost_before == 0:  # nothing lost or added before the diagonal: those cells are in place
        out.update({j: links[j] for j in range(p)})
    if lost_after == 0:
        out.update({idx + d: links[p + d] for d in range(1, len(links) - p) if idx + d < ndev})
    if lost_before or lost_after:
        side = " and ".join(s for s, lost in (("before", lost_before), ("after", lost_after))
                            if lost)
        notes.append(f"line {lineno}: {label} has {len(links)} link entries for {ndev} columns "
                     f"(a row shifted by a column?); re-aligned on its X, entries {side} the "
                     "diagonal unknown")
    return {j: v for j, v in out.items() if v != "?"}, rest


def parse_topo_matrix(text: str) -> SmiTopo:
    """Parse `nvidia-smi topo -m` output (see the module docstring). Raises TopoParseError (one
    line) only when no matrix is recognisable."""
    if len(text) > MAX_TEXT_BYTES:
        raise TopoParseError(f"line 1: text is larger than {MAX_TEXT_BYTES >> 20} MB; a "
                             "`nvidia-smi topo -m` output is a few kB")
    lines = [_clean(ln) for ln in text.splitlines()]
    notes: list[str] = []
    found = _find_header(lines)
    if found is None:
        first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
        where = f"line {first + 1}" if first is not None else "line 1"
        raise TopoParseError(f"{where}: no header line with GPU0 "
                             "(is this `nvidia-smi topo -m` output?)")
    header_at = found[0]
    for n in range(header_at):
        toks = lines[n].split()
        if toks and GPU_RE.match(toks[0]):
            notes.append(f"line {n + 1}: GPU row before the header line; skipped")
    devices, trailing = _split_header(lines[header_at], header_at + 1, notes)
    ngpu = 0
    while ngpu < len(devices) and devices[ngpu] == f"GPU{ngpu}":
        ngpu += 1
    if any(GPU_RE.match(d) for d in devices[ngpu:]):
        raise TopoParseError(f"line {header_at + 1}: GPU columns are not GPU0..GPUn in order "
                             "before the NIC columns")
    nics = tuple(devices[ngpu:])
    ndev = len(devices)

    rows: dict[int, tuple[int, dict[int, str]]] = {}
    aff: dict[int, tuple] = {}
    for n in range(header_at + 1, len(lines)):
        lineno = n + 1
        cells, exact = _cells(lines[n])
        if not cells or not cells[0] or _MD_RULE.match(lines[n]):
            continue   # blank, or a Markdown / box-drawing rule under the header
        head = cells[0].rstrip(":")
        if head in ("Legend", "NIC Legend") or (head == "NIC" and len(cells) > 1
                                                  and cells[1].startswith("Legend")):
            break  # the legend blocks end the matrix
        label_parts = _unglue_devices(cells[0])
        if len(label_parts) > 1:   # "GPU0X": the tab after the label was lost
            cells = label_parts[:1] + [cells[0][len(label_parts[0]):]] + cells[1:]
        m = GPU_RE.match(cells[0])
        if not m:
            if cells[0] in nics or _DEVS_GLUED.match(cells[0]):
                continue  # NIC rows carry no GPU information
            if len(rows) >= ngpu:
                break     # the table is over (prose or another command follows)
            notes.append(f"line {lineno}: {cells[0][:30]!r} is not a matrix row; skipped")
            continue
        idx = int(m.group(1))
        label = f"row GPU{idx}"
        if idx >= ngpu:
            notes.append(f"line {lineno}: {label} but the header names {ngpu} GPUs; skipped")
            continue
        if idx in rows:
            notes.append(f"line {lineno}: a second {label}; skipped")
            continue
        got, rest = _row_links(cells[1:], ndev, idx, lineno, label, notes, exact)
        for j, v in list(got.items()):
            if v == "X" and j != idx:
                del got[j]
        rows[idx] = (lineno, got)
        vals = _trailing_values(rest, exact, trailing, lineno, label, notes)
        aff[idx] = _affinity(vals, lineno, label, notes)
    if ngpu == 1 and not rows:
        raise TopoParseError(f"line {header_at + 1}: header names one GPU and no GPU0 row follows")
    if ngpu > 1 and not any(r[1] for r in rows.values()):
        # nothing recognisable: say why with the first row's problem
        why = next((n for n in notes if " row " in n), "no GPU row follows it")
        raise TopoParseError(f"line {header_at + 1}: header names {ngpu} GPUs but no link "
                             f"between them could be read ({why})")
    missing = [i for i in range(ngpu) if i not in rows]
    if missing:
        notes.append(f"line {len(lines)}: header names {ngpu} GPUs but {len(rows)} GPU rows "
                     f"follow (no row for {', '.join(f'GPU{i}' for i in missing)})")
    links: dict[str, str] = {}
    unknown: list[str] = []
    for i in range(ngpu):
        for j in range(i + 1, ngpu):
            a = rows.get(i, (0, {}))[1].get(j)
            b = rows.get(j, (0, {}))[1].get(i)
            key = f"{i}-{j}"
            if a is not None and b is not None and a != b:
                notes.append(f"line {rows[j][0]}: GPU{j}->GPU{i} is {b} but GPU{i}->GPU{j} is {a} "
                             "(matrix not symmetric); link unknown")
                unknown.append(key)
            elif a is None and b is None:
                unknown.append(key)
            else:
                links[key] = a if a is not None else b
    if unknown:
        notes.append(f"{len(unknown)} GPU pair(s) with no readable link: "
                     f"{', '.join(unknown[:12])}{' ...' if len(unknown) > 12 else ''}")
    if len(notes) > MAX_NOTES:
        notes = notes[:MAX_NOTES - 1] + [f"... and {len(notes) - MAX_NOTES + 1} more notes"]
    gpus = tuple(SmiGpu(i, *aff.get(i, (None, None, None))) for i in range(ngpu))
    return SmiTopo(gpus=gpus, links=links, nics=nics, columns=tuple(trailing),
                   unknown_pairs=tuple(unknown), notes=tuple(notes))
