"""Turn lab cases into small test fixtures (`tests/fixtures/sglang_lab/<case>/`).

A lab case holds seconds of SGLang's real artefacts (traces of several MB). A fixture keeps
their real format and a short steady window of them:
- each trace: its metadata (`distributedInfo`, `deviceProperties`, ...) and every event that
  starts inside `iterations` consecutive loop iterations (from one `recv_requests` to the next)
  in the middle of the profiled window: SGLang's ranges, step spans, c10d's gloo ranges, CPU ops
  and, for the with-stacks window, the Python tracer's events as they are;
- the server log: the start-up lines, then the case's lines up to `log_lines` batch lines;
- bench.jsonl, metrics.txt and case.json as they are.
Absolute paths of the machine the lab ran on become relative names (`.lab/...`, the model's
folder name), so nothing of the recording machine is committed.

    python -m microbench.sglang_lab.fixtures results/lab tests/fixtures/sglang_lab [CASE ...]
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
import sys
from pathlib import Path

ITERATIONS = 60
LOG_LINES = 400
_ABS = re.compile(r"(/[A-Za-z0-9_.+-]+)+/(\.lab|site-packages|results/lab)/")


def scrub(text: str) -> str:
    """Absolute paths up to a known folder -> that folder's relative name."""
    text = _ABS.sub(lambda m: {".lab": ".lab/", "site-packages": "site-packages/",
                               "results/lab": "results/lab/"}[m.group(2)], text)
    return re.sub(r"(['\"])/(?:[A-Za-z0-9_.+-]+/)+(model-llama-\d+l)", r"\1\2", text)


def trim_trace(src: Path, dst: Path, iterations: int = ITERATIONS) -> int:
    doc = json.loads(gzip.open(src, "rt").read())
    ev = doc.get("traceEvents") or []
    marks = sorted(e["ts"] for e in ev if e.get("name") == "recv_requests" and e.get("ph") == "X")
    if len(marks) > iterations + 2:
        mid = len(marks) // 2 - iterations // 2
        lo, hi = marks[mid], marks[mid + iterations]
        keep = [e for e in ev if e.get("ph") != "X" or lo <= float(e.get("ts", -1)) < hi]
    else:
        keep = ev
    doc["traceEvents"] = keep
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt", compresslevel=9) as f:
        f.write(scrub(json.dumps(doc, separators=(",", ":"))))
    return len(keep)


def trim_log(src: Path, dst: Path, log_lines: int = LOG_LINES) -> None:
    out, n = [], 0
    for ln in src.read_text(errors="replace").splitlines(keepends=True):
        if "Decode batch" in ln or "Prefill batch" in ln:
            n += 1
            if n > log_lines:
                continue
        out.append(ln)
    dst.write_text(scrub("".join(out)))


def make(case_dir: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for sub in ("traces", "traces-stacks"):
        for p in sorted((case_dir / sub).glob("*.trace.json.gz")):
            trim_trace(p, dst / sub / p.name, ITERATIONS if sub == "traces" else ITERATIONS // 3)
    trim_log(case_dir / "server.log", dst / "server.log")
    for name in ("bench.jsonl", "metrics.txt", "case.json"):
        if (case_dir / name).exists():
            (dst / name).write_text(scrub((case_dir / name).read_text()))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    src, dst, names = Path(argv[0]), Path(argv[1]), argv[2:]
    cases = [d for d in sorted(src.iterdir()) if (d / "case.json").exists()
             and (not names or d.name in names)]
    for d in cases:
        make(d, dst / d.name)
        print(f"{d.name}: {sum(p.stat().st_size for p in (dst / d.name).rglob('*') if p.is_file()) >> 10} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
