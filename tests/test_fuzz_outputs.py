"""Bad inputs of the fuzz tier (tests/test_fuzz_bad_inputs.py's contract) aimed at what a run
writes and prints (issue 35): an output path that is a link or a device, a run's files written
as one result or not at all, two runs merging one record at once, a part with nothing usable,
SIGTERM, stale temp files, a file name that is not UTF-8; every entry point under the CLI's
error rules (`python -m microbench.sglang_lab.rounds`, `sglang-lab --analyse-only`); text from
the evidence made safe on the terminal and in report.md, error lines capped, a bench file with
a byte-order mark. Each case failed before its fix; none touches anything outside tmp_path.
"""
from __future__ import annotations

import errno
import gzip
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from test_fuzz_bad_inputs import BAD, FIX, PP2, ROOT, digest, good_sglang, one_line_error, run

assert good_sglang   # a fixture of test_fuzz_bad_inputs.py, used here by name

LAB = FIX / "sglang_lab"
TOPO = FIX / "topo"


@pytest.fixture
def good_report(tmp_path, capsys) -> Path:
    """A results folder holding a good report (all its files) made from sglang.json."""
    res = tmp_path / "results"
    rc, _, err = run(["sglang", "--log", FIX / "sglang" / "pp2_mixed.log", "--json",
                      res / "sglang.json"], capsys)
    assert rc == 0, err
    rc, _, err = run(["report", "--results", res, "--observed", "1:34,8:81.7"], capsys)
    assert rc == 0, err
    return res


REPORT_FILES = ("report.json", "report.md", "report.html", "report.trace.json")


def _fail_temp_of(monkeypatch, name: str) -> None:
    """The disk fills up when the temp file of `name` is made (ENOSPC), after the run's other
    files were written."""
    real = tempfile.mkstemp

    def mkstemp(*a, **kw):
        if kw.get("prefix", "").startswith(f".{name}."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **kw)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


# -------------------------------------------------- an output that is a link or a device

def test_output_link_to_a_file_writes_its_target_and_keeps_the_link(good_report, capsys):
    target = good_report / "mine.json"
    target.write_text("{}")
    link = good_report / "link.json"
    link.symlink_to(target)
    rc, _, err = run(["report", "--results", good_report, "--json", link], capsys)
    assert rc == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["schema"] == json.loads(
        (good_report / "report.json").read_text())["schema"]


def test_output_dangling_link_is_refused(good_report, capsys):
    link = good_report / "link.json"
    link.symlink_to(good_report / "nowhere" / "x.json")
    rc, _, err = run(["report", "--results", good_report, "--json", link], capsys)
    one_line_error(rc, err, str(link), "symbolic link", "does not exist")
    assert link.is_symlink() and not (good_report / "nowhere").exists()


def test_output_through_a_link_to_another_device_is_refused(good_report, capsys):
    link = good_report / "z.json"
    link.symlink_to("/dev/zero")      # not a terminal, a FIFO or /dev/null
    before = {n: digest(good_report / n) for n in REPORT_FILES}
    rc, _, err = run(["report", "--results", good_report, "--json", link], capsys)
    one_line_error(rc, err, str(link), "character device", "refused")
    assert link.is_symlink() and {n: digest(good_report / n) for n in REPORT_FILES} == before


def test_output_fifo_is_written_through(good_report, capsys):
    fifo = good_report / "pipe.json"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)   # a reader, there before the writer
    got, done = bytearray(), threading.Event()

    def drain():   # the record may be larger than the pipe's buffer: read as it comes
        while not done.is_set():
            try:
                b = os.read(fd, 1 << 16)
            except BlockingIOError:
                b = None
            if b:
                got.extend(b)
            else:
                time.sleep(0.01)
    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        rc, _, err = run(["report", "--results", good_report, "--json", fifo], capsys)
        done.set()
        t.join(30)
        while b := os.read(fd, 1 << 16):
            got.extend(b)
    finally:
        os.close(fd)
    assert rc == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert json.loads(bytes(got))["schema"]
    assert "written through" in err


def test_output_that_is_standard_output_is_written_through(good_report):
    out = good_report / "stdout.json"
    out.symlink_to("/proc/self/fd/1")  # /dev/stdout's own link, here where a run may replace it
    r = _cli(["report", "--results", str(good_report), "--json", str(out)], good_report.parent)
    assert r.returncode == 0, r.stderr
    assert out.is_symlink() and os.readlink(out) == "/proc/self/fd/1"
    start = r.stdout.index("{")
    rep, _ = json.JSONDecoder().raw_decode(r.stdout[start:])
    assert rep["schema"] and "The answer" in r.stdout[start:]   # then the summary, after it
    assert "written through" in r.stderr


# ------------------------------------------------------------ one result, one commit

def test_report_on_a_full_disk_keeps_the_earlier_report_whole(good_report, capsys,
                                                              monkeypatch):
    before = {n: digest(good_report / n) for n in REPORT_FILES}
    _fail_temp_of(monkeypatch, "report.html")   # the last file: the others are written first
    rc, _, err = run(["report", "--results", good_report, "--observed", "1:30,8:70"], capsys)
    one_line_error(rc, err, "report.html", "No space left")
    assert {n: digest(good_report / n) for n in REPORT_FILES} == before
    assert not [p for p in good_report.iterdir() if p.name.endswith(".tmp")]


def test_topology_on_a_full_disk_keeps_json_and_png_together(tmp_path, capsys, monkeypatch):
    out = tmp_path / "topology.json"
    rc, _, err = run(["topology", "--from-nvidia-smi", TOPO / "rtxpro6000x8_pcie.txt",
                      "--json", out], capsys)
    assert rc == 0, err
    png = out.with_suffix(".png")
    before = digest(out), digest(png)
    _fail_temp_of(monkeypatch, "topology.png")
    rc, _, err = run(["topology", "--from-nvidia-smi", TOPO / "workstation_2x5090.txt",
                      "--json", out], capsys)
    one_line_error(rc, err, "topology.png", "No space left")
    assert (digest(out), digest(png)) == before


def test_two_sglang_runs_merging_one_record_at_once_lose_no_part(tmp_path, capsys,
                                                                 monkeypatch):
    """Run A (--log) reads the record, then waits up to 2 s for run B (--bench) to finish;
    B reads and writes meanwhile unless A's read-modify-write holds it off. A's write must
    not drop B's part."""
    import microbench.sglang.cli as sc
    path = tmp_path / "sglang.json"
    a_read, b_done = threading.Event(), threading.Event()
    real = sc.merge_earlier

    def slow_merge(data, args, p, utc):
        kept = real(data, args, p, utc)
        if args.sglang_log:
            a_read.set()
            b_done.wait(2)
        return kept
    monkeypatch.setattr(sc, "merge_earlier", slow_merge)
    rcs = {}

    def go(name, argv):
        rcs[name] = run(argv, capsys)[0]
    a = threading.Thread(target=go, args=("a", ["sglang", "--log", FIX / "sglang" / "pp2_mixed.log",
                                                "--json", path]))
    a.start()
    assert a_read.wait(30)
    go("b", ["sglang", "--bench", FIX / "sglang" / "bench.jsonl", "--json", path])
    b_done.set()
    a.join(30)
    assert rcs == {"a": 0, "b": 0}
    d = json.loads(path.read_text())["data"]
    assert d["ranks"] and d["bench"] and set(d["sources"]) == {"log", "bench"}


def _own_trace(tmp_path: Path, capsys) -> Path:
    """ppscope's own report.trace.json (a simulated timeline, not SGLang's)."""
    (tmp_path / "r").mkdir()
    rc, _, err = run(["report", "--results", tmp_path / "r"], capsys)
    assert rc == 0, err
    return tmp_path / "r" / "report.trace.json"


def _all_events(change):
    def f(d):
        for e in d["traceEvents"]:
            if isinstance(e, dict):
                change(e)
    return f


@pytest.mark.parametrize("kind", ["empty", "own_report_trace", "other_chrome_trace",
                                  "every_dur_negative", "every_ts_a_word"])
def test_traces_with_no_usable_event_never_replace_a_good_part(tmp_path, capsys, good_sglang,
                                                                kind):
    rc, _, err = run(["sglang", "--traces", PP2 / "pp2_burst_c8-rank0.json.gz",
                      PP2 / "pp2_burst_c8-rank1.json.gz", "--json", good_sglang], capsys)
    assert rc == 0, err
    before = digest(good_sglang)
    src = PP2 / "pp2_burst_c8-rank1.json.gz"
    if kind == "empty":
        (t := tmp_path / "t-rank1.json").write_text('{"traceEvents": []}')
    elif kind == "own_report_trace":
        t = _own_trace(tmp_path, capsys)
    elif kind == "other_chrome_trace":
        t = BAD / "trace_chrome_devtools.json"
    else:
        from test_fuzz_bad_inputs import trace_variant
        change = (lambda e: e.update(dur=-1) if "dur" in e else None) \
            if kind == "every_dur_negative" else \
            (lambda e: e.update(ts=f"t{e['ts']}") if "ts" in e else None)
        t = trace_variant(src, tmp_path / "t-rank1.json", _all_events(change))
    rc, _, err = run(["sglang", "--traces", t, "--json", good_sglang], capsys)
    one_line_error(rc, err, str(t), "no usable event")
    assert digest(good_sglang) == before


def test_stale_temp_files_of_ours_are_swept(good_report, capsys):
    old = good_report / ".report.json.ab12cd34.tmp"     # a run killed mid-write, an hour ago
    old.write_bytes(b"x" * 4096)
    os.utime(old, (time.time() - 3600,) * 2)
    fresh = good_report / ".report.json.ef56gh78.tmp"   # a run writing now: not ours to touch
    fresh.write_bytes(b"y")
    theirs = good_report / ".report.json.old.tmp"        # not our naming
    theirs.write_bytes(b"z")
    os.utime(theirs, (time.time() - 3600,) * 2)
    rc, _, err = run(["report", "--results", good_report], capsys)
    assert rc == 0, err
    assert not old.exists() and fresh.exists() and theirs.exists()


def _cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PPSCOPE_RESULTS=str(cwd / "results"))
    return subprocess.run([sys.executable, "-c", "import sys; from reports.cli import main; "
                           "sys.exit(main())", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_sigterm_unwinds_like_ctrl_c(tmp_path):
    srv = socket.socket()            # accepts, then never answers: the run waits on it
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PPSCOPE_RESULTS=str(tmp_path / "results"))
    p = subprocess.Popen([sys.executable, "-c", "import sys; from reports.cli import main; "
                          "sys.exit(main())", "sglang", "--url",
                          f"http://127.0.0.1:{srv.getsockname()[1]}", "--model-name", "m",
                          "--live-timeout", "60", "--json", str(tmp_path / "s.json")],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        srv.settimeout(60)
        conn, _ = srv.accept()       # the command is running
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        conn.close()
    finally:
        p.kill()
        srv.close()
    assert p.returncode == 143, (p.returncode, err)
    one_line_error(2, err, "terminated")
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_log_whose_name_is_not_utf8_does_not_break_later_reports(tmp_path, capsys):
    res = tmp_path / "results"
    res.mkdir()
    log = os.path.join(os.fsencode(tmp_path), b"srv\xff.log")
    shutil.copy(FIX / "sglang" / "pp2_mixed.log", log)
    rc, out, err = run(["sglang", "--log", os.fsdecode(log), "--json", res / "sglang.json"],
                       capsys)
    assert rc == 0, err
    for _ in range(2):
        rc, out, err = run(["report", "--results", res], capsys)
        assert rc == 0 and "internal error" not in err, err
    assert "srv\\udcff.log" in (res / "report.md").read_text(encoding="utf-8") + out


# ---------------------------------------------------- every entry point, the CLI's rules

def _case(tmp_path: Path, name: str = "clean-c8") -> Path:
    d = tmp_path / "lab" / name
    shutil.copytree(LAB / "clean-c8", d, ignore=shutil.ignore_patterns("traces-stacks"))
    return d


def test_analyse_only_with_a_garbage_case_json_is_one_line(tmp_path, capsys):
    d = _case(tmp_path)
    (d / "case.json").write_text("garbage")
    rc, _, err = run(["sglang-lab", "--analyse-only", "--out", tmp_path / "lab"], capsys)
    one_line_error(rc, err, str(d / "case.json"))
    assert not (d / "analysis.json").exists()


def test_analyse_only_marks_a_failed_analysis_not_the_earlier_one(tmp_path, capsys):
    d = _case(tmp_path)
    (d / "report.json").write_text(json.dumps({"diagnosis": {   # an earlier, good analysis
        "status": "ok", "rows": [{"cause": "slow stage", "size_pct": 50.0}],
        "named": ["slow stage"]}}))
    (d / "server.log").write_text("not a server log\n")          # today's fails
    rc, out, err = run(["sglang-lab", "--analyse-only", "--out", tmp_path / "lab"], capsys)
    one_line_error(rc, err, "clean-c8", "could not be read again")
    assert "analysis failed" in out and "slow stage" not in out
    row = json.loads((tmp_path / "lab" / "summary.json").read_text())[0]
    assert row["first_cause"] == "analysis failed" and row["analysis_error"]


def _rounds_case(tmp_path: Path) -> Path:
    c = tmp_path / "case"
    (c / "traces").mkdir(parents=True)
    for t in (LAB / "clean-c8" / "traces").glob("*PP-0*"):
        shutil.copy(t, c / "traces")
    (c / "sglang.json").write_text("{}")
    return c


@pytest.mark.parametrize("kind", ["garbage_record", "garbage_trace", "empty_trace",
                                  "truncated_trace"])
def test_rounds_gives_one_line_not_a_traceback(tmp_path, capsys, kind):
    from microbench.sglang_lab import rounds
    c = _rounds_case(tmp_path)
    if kind == "garbage_record":
        (c / "sglang.json").write_text("garbage")
    else:
        rc, _, err = run(["sglang", "--traces", LAB / "clean-c8" / "traces", "--concurrency", "8",
                          "--json", c / "sglang.json"], capsys)
        assert rc == 0, err
        t = next((c / "traces").glob("*PP-0*"))
        raw = gzip.decompress(t.read_bytes())
        t.unlink()
        bad = {"garbage_trace": b"garbage", "empty_trace": b"",
               "truncated_trace": raw[:len(raw) // 3]}[kind]
        (c / "traces" / "x-TP-0-PP-0.trace.json").write_bytes(bad)
    rc = rounds.main([str(c)])
    one_line_error(rc, capsys.readouterr().err, str(c))


# ------------------------------------------------------------------ text made safe

ESC = "\x1b]0;pwned\x07\x1b[2J"


def _no_control(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, repr(text[:300])


def test_a_file_name_with_escapes_is_escaped_in_the_error(tmp_path, capsys):
    rc, out, err = run(["sglang", "--log", tmp_path / f"x{ESC}.log", "--json",
                        tmp_path / "s.json"], capsys)
    line = one_line_error(rc, err, "no such file")
    _no_control(line)
    assert "\\x1b" in line


def test_cases_with_escapes_are_escaped(tmp_path, capsys):
    rc, _, err = run(["sglang-lab", "--cases", f"clean-c8,{ESC}", "--analyse-only", "--out",
                      tmp_path], capsys)
    _no_control(one_line_error(rc, err, "--cases"))


def test_log_file_names_with_escapes_are_escaped_on_stdout(tmp_path, capsys):
    odd = tmp_path / f"n{ESC}.log"
    odd.write_text("[2026-04-05 20:02:50] INFO: nothing of the scheduler here\n")
    rc, out, err = run(["sglang", "--log", FIX / "sglang" / "pp2_mixed.log", odd, "--json",
                        tmp_path / "s.json"], capsys)
    assert rc == 0, err
    assert "no batch lines in" in out
    _no_control(out + err)


def test_report_md_holds_no_html_or_link_from_a_file_name(tmp_path, capsys):
    bench = tmp_path / "<script>alert(1)<.script>[x](javascript:alert(1)).jsonl"
    shutil.copy(FIX / "sglang" / "bench.jsonl", bench)
    res = tmp_path / "r"
    res.mkdir()
    rc, _, err = run(["report", "--results", res, "--bench", bench], capsys)
    assert rc == 0, err
    md = (res / "report.md").read_text()
    assert "alert(1)" in md                      # the name is shown...
    assert not re.search(r"(?<!\\)<script|(?<!\\)\]\(javascript", md)   # ...as text


@pytest.mark.parametrize("arg, words", [("a" * 70_000, "a" * 50), ("x\ny", "x / y")],
                         ids=["69kB", "two_lines"])
def test_error_lines_are_one_line_and_capped(tmp_path, capsys, arg, words):
    rc, _, err = run(["sglang-lab", "--cases", arg, "--list"], capsys)
    line = one_line_error(rc, err, "--cases", words)
    assert len(line) < 1000


def test_bench_file_with_a_byte_order_mark_is_read(tmp_path, capsys):
    bom = tmp_path / "bench.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + (FIX / "sglang" / "bench.jsonl").read_bytes())
    runs = []
    for b in (FIX / "sglang" / "bench.jsonl", bom):
        out = tmp_path / f"{len(runs)}.json"
        rc, _, err = run(["sglang", "--bench", b, "--json", out], capsys)
        assert rc == 0, err
        runs.append(json.loads(out.read_text())["data"]["bench"])
    assert runs[0] == runs[1] and runs[0]


# ------------------------------------------- issue 55, item 6: outputs and entry points

def test_rounds_on_a_record_of_another_probe_is_one_line(tmp_path, capsys):
    from microbench.sglang_lab import rounds
    c = _rounds_case(tmp_path)
    shutil.copy(FIX / "h200x2" / "stage_cost.json", c / "sglang.json")
    rc = rounds.main([str(c)])
    one_line_error(rc, capsys.readouterr().err, "stage_cost record", "ppscope sglang")


def test_a_refusal_of_unusable_traces_is_one_line_with_its_warnings(tmp_path):
    # each rank's one event unreadable (skipped, a warning) and so nothing usable: the refusal
    # alone, as a user's terminal shows it (a subprocess: pytest takes the warnings' logging)
    d = tmp_path / "t"
    d.mkdir()
    bad = {"ph": "X", "name": "foo", "ts": "x", "dur": -2, "pid": 1, "tid": 1, "cat": "kernel"}
    for r in (0, 1):
        (d / f"p-TP-0-PP-{r}.trace.json").write_text(json.dumps({"traceEvents": [bad]}))
    p = _cli(["sglang", "--traces", str(d), "--json", str(tmp_path / "s.json")], tmp_path)
    one_line_error(p.returncode, p.stderr, "no usable event")
    # a good run still says what it skipped, once the record is kept
    ok = [json.loads(gzip.decompress((PP2 / f"pp2_burst_c8-rank{r}.json.gz").read_bytes()))
          for r in (0, 1)]
    for r, doc in enumerate(ok):
        doc["traceEvents"].append(bad)
        (tmp_path / f"g-rank{r}.json").write_text(json.dumps(doc))
    p = _cli(["sglang", "--traces", str(tmp_path / "g-rank0.json"), str(tmp_path / "g-rank1.json"),
              "--json", str(tmp_path / "g.json")], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "warning: trace g-rank0.json (rank 0): 1 event(s) not readable" in p.stderr, p.stderr


@pytest.mark.parametrize("made", [False, True])
def test_json_naming_a_folder_writes_the_default_name_in_it(tmp_path, capsys, made):
    d = tmp_path / "newdir"
    if made:
        d.mkdir()
    L = FIX / "sglang_lab" / "clean-c8"
    rc, _, err = run(["sglang", "--bench", L / "bench.jsonl", "--json", f"{d}/"], capsys)
    assert rc == 0, err
    assert d.is_dir() and (d / "sglang.json").is_file()
    rc, _, err = run(["report", "--results", d, "--out", tmp_path / "out", "--json",
                      f"{tmp_path / 'rep'}/"], capsys)
    assert rc == 0, err
    assert (tmp_path / "rep" / "report.json").is_file()
    rc, _, err = run(["topology", "--from-nvidia-smi", FIX / "topo" / "h200x2_nv18_vm.txt",
                      "--no-png", "--json", f"{tmp_path / 'topo'}/"], capsys)
    assert rc == 0, err
    assert (tmp_path / "topo" / "topology.json").is_file()


def test_results_through_a_symlink_loop_is_said(tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    rc, _, err = run(["report", "--results", loop], capsys)
    one_line_error(rc, err, str(loop), "symbolic-link loop")
    gone = tmp_path / "gone"
    gone.symlink_to(tmp_path / "nowhere")
    rc, _, err = run(["report", "--results", gone], capsys)
    one_line_error(rc, err, str(gone), "nowhere", "not there")
