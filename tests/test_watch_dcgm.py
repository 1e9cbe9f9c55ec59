"""The GPU watch's DCGM source (microbench/watch/dcgm.py) against a fake `dcgmi`: a script the
test writes into tmp_path and puts first on PATH, printing `dcgmi dmon` output in the layout of
DCGM's dcgmi/DeviceMonitor.cpp (header `#Entity` + short names, a units line `ID`, rows
`GPU <id>` with 3-decimal ratios and integer bytes, `N/A` cells, the header again every 14
rounds), and its failure modes: an immediate error exit, "Error setting watches" (profiling not
supported, module in use), garbage lines, an endless line, a dcgmi that hangs or ignores SIGTERM.
The NVML side is tests/fake_nvml.py. Never run against a real DCGM host engine."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from fake_nvml import FakeClock, FakeGpu, FakeNvml, driver_samples, sglang_args, two_gpus
from microbench.sglang import cli as sglang_cli
from microbench.watch import dcgm as D
from microbench.watch import sampler as W
from reports.base.payloads.watch import DCGM_SERIES, WatchData, WatchSource
from reports.base.records import read_record
from reports.base.schema import from_json, to_json
from reports.model.observed import watch_summary as S

T0 = 1_700_000_000.0
HEADER = ("#Entity           SMACT        SMOCC        DRAMA        PCITX                       "
          "PCIRX                       NVLTX                       NVLRX")
UNITS = "ID"

# the fake: argv as dcgmi's; FAKE_DCGMI_MODE picks the behaviour, FAKE_DCGMI_LOG gets its pid
# and argv. Values are exact in binary (0.125, 0.375, ...) so means of equal rows stay exact.
FAKE = r'''
import os, signal, sys, time
args = sys.argv[1:]
log = os.environ.get("FAKE_DCGMI_LOG")
if log:
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {' '.join(args)}\n")
mode = os.environ.get("FAKE_DCGMI_MODE", "ok")
period = int(args[args.index("-d") + 1]) / 1000 if "-d" in args else 1.0
rounds = int(args[args.index("-c") + 1]) if "-c" in args else 0
out = sys.stdout
HEADER = %r
def header(blank=False):
    if blank:
        out.write("\n")
    out.write(HEADER + "\n" + "ID\n")
    out.flush()
if mode == "exit":
    sys.stdout.write("Error: Unable to connect to host engine. Host engine connection "
                     "invalid/disconnected.\n")
    sys.exit(255)
if mode in ("prof", "in_use"):
    header()
    msg = {"prof": "-36: Profiling is not supported for this group of GPUs or GPU",
           "in_use": "-34: The requested operation could not be completed because the "
                     "affected resource is in use"}[mode]
    sys.stderr.write(f"Error setting watches. Result: {msg}\n")
    sys.stderr.flush()
    sys.exit(222)
if mode == "hang":
    time.sleep(3600)
if mode == "endless":
    header()
    chunk = "x" * 65536
    while True:
        out.write(chunk)
if mode == "ignore_term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
header()
r = 0
while rounds == 0 or r < rounds:
    if mode == "na":
        out.write("GPU 0     N/A    N/A    N/A    N/A    N/A    N/A    N/A\n")
    else:
        if mode == "garbage":
            out.write("\x00\x01 garbage %%%% \n")
            out.write("GPU zero 1 2 3\n")
            out.write("GPU 0 0.5\n")
        out.write("GPU 0             0.125        0.250        0.500        1000000                     "
                  "2000000                     N/A                         N/A\n")
        if r < 5 or mode == "ignore_term":     # GPU 1 stops reporting after 5 rounds
            out.write("GPU 1             0.750        0.375        0.000        3000                        "
                      "4000                        N/A                         N/A\n")
    out.flush()
    r += 1
    if mode == "early_exit" and r == 4:
        sys.exit(3)
    time.sleep(period)
    if r %% 14 == 0:
        header(blank=(mode == "garbage"))      # DCGM 2.x printed an empty line before it
''' % HEADER


@pytest.fixture
def fake_dcgmi(tmp_path, monkeypatch):
    """Writes the fake dcgmi first on PATH; returns a setter for its mode and its log path."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "dcgmi"
    exe.write_text(f"#!{sys.executable}\n" + FAKE)
    exe.chmod(0o755)
    log = tmp_path / "dcgmi.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_DCGMI_LOG", str(log))
    monkeypatch.setenv("FAKE_DCGMI_MODE", "ok")

    def mode(m: str) -> Path:
        monkeypatch.setenv("FAKE_DCGMI_MODE", m)
        return log
    mode.log = log
    return mode


def _pids(log: Path) -> list[int]:
    return [int(line.split()[0]) for line in log.read_text().splitlines()] if log.exists() else []


def _gone(pid: int) -> bool:
    """No process and no zombie: /proc/PID is gone once the child is reaped."""
    return not Path(f"/proc/{pid}").exists()


def _live_watch(seconds=1.2, hz=20.0, source="auto", gpus=2):
    now = time.time()
    nv = FakeNvml([FakeGpu(util_samples=driver_samples(now - 1, now + 60, lambda t: 60))
                   for _ in range(gpus)], time.time)
    w = W.Watch(W.WatchConfig(hz=hz, duration_s=seconds, source=source), nv=nv)
    t = time.monotonic()
    w.start()
    try:
        w.wait()
    finally:
        w.stop()
    return w, w.data(), time.monotonic() - t


# --- the parser, on recorded lines ----------------------------------------------------------
def test_parser_reads_the_dmon_layout_exactly():
    p = D.Parser()
    assert p.feed(HEADER + "\n")[0] == "header"
    assert p.columns == ("SMACT", "SMOCC", "DRAMA", "PCITX", "PCIRX", "NVLTX", "NVLRX")
    assert p.feed("ID\n") == ("units",)
    assert p.feed("GPU 3   0.125  0.250  N/A  123456789012  0  N/A  55\n") == \
        ("row", 3, (0.125, 0.25, None, 123456789012.0, 0.0, None, 55.0))
    # DCGM 2.x header and units, an empty line before a repeated header
    assert p.feed("# Entity  SMACT  SMOCC  DRAMA  PCITX  PCIRX  NVLTX  NVLRX")[0] == "header"
    assert p.feed("      Id") == ("units",)
    assert p.feed("") == ("blank",)
    # a cell cut by dmon ("..."), a ratio out of range, a negative byte count: None, counted
    assert p.feed("GPU 0  1.000  1.0004  2.5  12345...  -1  0  0")[2] == \
        (1.0, 1.0, None, None, None, 0.0, 0.0)
    assert p.bad_cells == 3
    assert p.feed("Error setting watches. Result: -36: Profiling is not supported for this "
                  "group of GPUs or GPU")[0] == "error"
    assert p.feed("GPU 0 0.5")[0] == "skip" and p.feed("garbage")[0] == "skip"
    assert p.feed("GPU-I 0  0.1 0.1 0.1 1 1 1 1")[0] == "skip"       # MIG entities: not ours


def test_parser_needs_a_header_for_the_fields_asked():
    p = D.Parser()
    assert p.feed("GPU 0  0.1 0.1 0.1 1 1 1 1")[0] == "skip"          # before any header
    p.feed("#Entity  SMACT  SMOCC")
    assert p.feed("GPU 0  0.1 0.1 0.1 1 1 1 1")[0] == "skip"          # a header for 2 fields


def test_command_line():
    assert D.command("dcgmi", 100) == ["dcgmi", "dmon", "-e", "1002,1003,1005,1009,1010,1011,"
                                       "1012", "-d", "100"]
    assert D.command("dcgmi", 250, (0, 2), 40)[-4:] == ["-i", "0,2", "-c", "40"]
    assert D.period_ms(10) == 100 and D.period_ms(50) == 100 and D.period_ms(2) == 500


def test_align_rows_mean_hold_and_staleness():
    # ticks every 100 ms; rows at 40, 90 (two in the first tick), 150, then none until 520
    ticks = [100, 200, 300, 400, 500, 600]
    rows = [(40, 0.25), (90, 0.75), (150, 0.125), (520, None), (590, 0.5)]
    # tick 300: last row 150 is 150 old (<= 200): held; tick 400: 250 old: None; tick 600:
    # an N/A and a value in the window: the value
    assert D.align_rows(ticks, rows, 200) == [0.5, 0.125, 0.125, None, None, 0.5]
    assert D.align_rows([100, 200], [(150, None)], 200) == [None, None]


# --- the record, rows fed with a fake clock: exact -------------------------------------------
def test_rows_land_on_ticks_exactly_in_the_record():
    clock = FakeClock(T0)
    nv = FakeNvml([FakeGpu(), FakeGpu()], clock)
    w = W.Watch(W.WatchConfig(hz=10.0), nv=nv, clock=clock)
    w.open()
    w.dcgm_period_ms = 100
    w.dmon = D.Dmon(["dcgmi", "dmon"], clock=clock, gpus=(0, 1))
    us = lambda s: round((T0 + s) * 1e6)
    w.dmon.feed(HEADER, us(0.0))
    w.dmon.feed(UNITS, us(0.0))
    feed = [(0.05, "GPU 0  0.125  0.250  0.500  1000000  2000000  N/A  N/A"),
            (0.05, "GPU 1  0.750  0.375  0.000  3000  4000  N/A  N/A"),
            (0.15, "GPU 0  0.375  0.250  0.500  3000000  2000000  N/A  N/A"),
            (0.18, "GPU 0  0.625  0.250  N/A  3000000  2000000  N/A  N/A"),
            (0.15, "GPU 1  N/A  N/A  N/A  N/A  N/A  N/A  N/A")]
    for t, line in feed:
        w.dmon.feed(line, us(t))
    for i in range(4):              # ticks at 0.1 .. 0.4 s
        clock.t = T0 + 0.1 * (i + 1)
        w.step()
    d = w.data()
    g0, g1 = d.gpus
    # tick 0.2: mean of 0.375 and 0.625; DRAM: N/A beside 0.5 -> 0.5; tick 0.3: the newest
    # row held (0.12 s old, within two periods), for DRAM its N/A; tick 0.4: 0.22 s old: None
    assert g0.sm_active == (0.125, 0.5, 0.625, None)
    assert g0.dram_active == (0.5, 0.5, None, None)
    assert g0.pcie_tx_bytes_per_s == (1e6, 3e6, 3e6, None)
    assert g0.nvlink_tx_bytes_per_s == (None,) * 4
    assert g1.sm_active == (0.75, None, None, None)   # its N/A row at 0.15 s: DCGM had none
    assert g0.dcgm_rows == 3 and g1.dcgm_rows == 2
    assert d.source.dcgm == ("sm_active", "sm_occupancy", "dram_active", "pcie_tx_bytes_per_s",
                             "pcie_rx_bytes_per_s")
    assert d.source.dcgm_unavailable == ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")
    assert d.source.nvml[0] == "util_pct" and d.dcgm_note is None and d.dcgm_used
    assert from_json(WatchData, to_json(d)) == d


def test_old_record_without_dcgm_loads_with_defaults():
    old = {"source": "nvml", "requested_hz": 10, "duration_s": 0.2, "ticks": 2,
           "dcgm_note": None, "gpus": [{"index": 0, "t_s": [0.1, 0.2], "util_pct": [1, 2],
                                       "mem_util_pct": [0, 0], "power_w": [100, 100],
                                       "sm_mhz": [1980, 1980], "pcie_tx_gbps": [None, None],
                                       "pcie_rx_gbps": [None, None]}]}
    d = from_json(WatchData, old)
    assert d.source == WatchSource() and not d.dcgm_used
    assert d.gpus[0].sm_active == () and d.gpus[0].dcgm_rows == 0
    s = S.summarize(d)
    assert s.busy_source == "nvml util" and s.label == "observed (NVML)"


# --- the subprocess -----------------------------------------------------------------------------
def test_live_dcgmi_values_land_and_it_is_reaped(fake_dcgmi):
    log = fake_dcgmi("ok")
    w, d, took = _live_watch(seconds=1.2)
    assert took < 4
    [line] = log.read_text().splitlines()
    pid, argv = int(line.split()[0]), line.split()[1:]
    # both GPUs watched: no -i; a watch of known length: -c as a backstop
    assert argv[:5] == ["dmon", "-e", "1002,1003,1005,1009,1010,1011,1012", "-d", "100"] \
        and "-i" not in argv and argv[argv.index("-c") + 1] == "312"
    assert _gone(pid)
    assert d.dcgm_used and d.dcgm_note is None
    g0, g1 = d.gpus
    got0 = [v for v in g0.sm_active if v is not None]
    # every value GPU 0 printed is exact in the record; only the first tick(s) before the
    # first row may be None
    assert got0 and set(got0) == {0.125} and len(got0) >= len(g0.t_s) - 8
    assert {v for v in g0.pcie_rx_bytes_per_s if v is not None} == {2e6}
    assert set(g0.nvlink_tx_bytes_per_s) == {None}
    # GPU 1 stopped after 5 rounds (~0.5 s): values first, then None to the end
    got1 = [v for v in g1.sm_active]
    assert 0.75 in got1 and got1[-1] is None and set(got1[-5:]) == {None}
    assert any(n.startswith("GPU 1: DCGM rows stopped at") for n in d.notes)
    assert d.source.dcgm_command[:2] == ("dcgmi", "dmon") and d.source.dcgm_rows >= 10
    assert d.source.dcgm_errors == () and d.source.dcgm_exit_code is not None
    assert "dcgm" in d.cpu_s


def test_nvml_source_never_starts_dcgmi(fake_dcgmi):
    log = fake_dcgmi("ok")
    w, d, _ = _live_watch(seconds=0.3, source="nvml")
    assert not log.exists() and w.dmon is None
    assert d.dcgm_note == "DCGM not asked for (--watch-source nvml)"
    assert d.source.dcgm == () and d.gpus[0].sm_active == ()


@pytest.mark.parametrize("mode,why", [
    ("exit", "dcgmi: Error: Unable to connect to host engine"),
    ("prof", "dcgmi: Error setting watches. Result: -36: Profiling is not supported"),
    ("in_use", "dcgmi: Error setting watches. Result: -34: The requested operation could not "
               "be completed because the affected resource is in use"),
])
def test_dcgmi_errors_fall_back_to_nvml_with_one_line(fake_dcgmi, mode, why):
    log = fake_dcgmi(mode)
    w, d, took = _live_watch(seconds=0.6)
    assert took < 4 and all(_gone(p) for p in _pids(log))
    assert d.dcgm_note.startswith(f"DCGM not used: {why}") and "\n" not in d.dcgm_note
    assert not d.dcgm_used and d.gpus[0].sm_active == ()
    assert d.ticks >= 8 and all(v == 60 for v in d.gpus[0].util_pct)   # NVML went on
    assert d.source.dcgm_errors and d.source.dcgm_exit_code not in (None, 0)


def test_only_na_is_not_used(fake_dcgmi, monkeypatch):
    monkeypatch.setattr(D, "FIRST_VALUE_S", 0.4)
    log = fake_dcgmi("na")
    w, d, took = _live_watch(seconds=1.0, gpus=1)
    assert d.dcgm_note == "DCGM not used: dcgmi gave only N/A"
    assert not d.dcgm_used and all(_gone(p) for p in _pids(log)) and took < 4


def test_hanging_dcgmi_is_stopped_at_its_deadline(fake_dcgmi, monkeypatch):
    monkeypatch.setattr(D, "FIRST_VALUE_S", 0.3)
    w = W.Watch(W.WatchConfig(hz=20.0, duration_s=5.0), nv=FakeNvml([FakeGpu()], time.time))
    w.open()
    log = fake_dcgmi("hang")
    w.start_dcgm()
    t = time.monotonic()
    while not w.dmon.eof and time.monotonic() - t < 10:
        time.sleep(0.05)
    # stopped at max(FIRST_VALUE_S, 20 periods) = 2 s, not after the hour it would sleep
    assert w.dmon.eof and time.monotonic() - t < 5
    w.stop()
    assert _gone(_pids(log)[0])
    assert w.data().dcgm_note == "DCGM not used: dcgmi gave no data row within 2 s"


def test_garbage_lines_are_skipped_and_counted(fake_dcgmi):
    fake_dcgmi("garbage")
    w, d, _ = _live_watch(seconds=0.8)
    assert d.dcgm_used and {v for v in d.gpus[0].sm_active if v is not None} == {0.125}
    assert d.source.dcgm_skipped_lines >= 3 * 4


def test_endless_line_is_capped_and_dcgmi_stopped(fake_dcgmi, monkeypatch):
    monkeypatch.setattr(D, "TOTAL_CAP", 2 * 2**20)
    log = fake_dcgmi("endless")
    w, d, took = _live_watch(seconds=1.0)
    assert took < 5 and _gone(_pids(log)[0])
    assert d.dcgm_note == f"DCGM not used: dcgmi printed over {2 * 2**20} bytes; stopped"
    assert w.dmon.bytes_read <= 2 * 2**20 + 2 * D.LINE_CAP


def test_dcgmi_ending_mid_watch_is_noted(fake_dcgmi):
    fake_dcgmi("early_exit")
    w, d, _ = _live_watch(seconds=1.2)
    assert d.dcgm_used and d.source.dcgm_exit_code == 3
    assert any(n.startswith("dcgmi ended by itself at") and "(exit code 3)" in n
               for n in d.notes)
    assert d.gpus[0].sm_active[-1] is None


def test_dcgmi_ignoring_sigterm_is_killed(fake_dcgmi):
    log = fake_dcgmi("ignore_term")
    w, d, took = _live_watch(seconds=0.4)
    assert took < 4 and _gone(_pids(log)[0]) and d.dcgm_used
    assert d.source.dcgm_exit_code == -9


def test_only_the_watched_gpus_are_asked_for(fake_dcgmi):
    log = fake_dcgmi("ok")
    nv = FakeNvml([FakeGpu(), FakeGpu(), FakeGpu()], time.time)
    w = W.Watch(W.WatchConfig(hz=20.0, duration_s=0.3, gpus=(0, 1)), nv=nv)
    w.start()
    w.wait()
    w.stop()
    argv = log.read_text().split()
    assert argv[argv.index("-i") + 1] == "0,1"


# --- the CLI ------------------------------------------------------------------------------------
_args = sglang_args


@pytest.fixture
def fake_pynvml(monkeypatch):
    nv = two_gpus()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv


def test_cli_dcgm_without_dcgmi_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    from reports.cli import main
    monkeypatch.setenv("PATH", str(tmp_path))          # no dcgmi here
    rc = main(["sglang", "--watch", "1", "--watch-source", "dcgm",
               "--json", str(tmp_path / "s.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "dcgmi is not on PATH" in err
    assert not (tmp_path / "watch.json").exists()


def test_cli_record_and_trace_carry_dcgm(fake_dcgmi, fake_pynvml, tmp_path, capsys):
    import json
    a = _args(["--watch", "0.8", "--watch-hz", "20", "--json", str(tmp_path / "sglang.json")])
    assert sglang_cli.run(a) == 0
    d = read_record(tmp_path / "watch.json").payload
    assert d.dcgm_used and "sm_active" in d.source.dcgm
    tr = json.loads((tmp_path / "watch.trace.json").read_text())
    names = {(e["pid"], e["name"]) for e in tr["traceEvents"] if e["ph"] == "C"}
    assert (0, "SM active (DCGM)") in names and (0, "PCIe RX (DCGM)") in names
    assert (0, "NVLink TX (DCGM)") not in names        # N/A throughout: no event
    assert tr["otherData"]["source"] == "ppscope watch (NVML + DCGM dmon)"
    out = capsys.readouterr().out
    assert "GPU watch (NVML + DCGM dmon): 2 GPU(s)" in out and "SM active mean %" in out


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_cli_ctrl_c_or_a_failing_load_ends_dcgmi(fake_dcgmi, fake_pynvml, tmp_path, monkeypatch,
                                                 exc):
    log = fake_dcgmi("ok")

    def load(args):
        time.sleep(0.4)
        raise exc("stop")
    monkeypatch.setattr(sglang_cli, "run_evidence", load)
    a = _args(["--url", "http://127.0.0.1:1", "--watch", "--watch-hz", "20",
               "--json", str(tmp_path / "s.json")])
    with pytest.raises(exc):
        sglang_cli.run(a)
    assert _gone(_pids(log)[0])
    rec = read_record(tmp_path / "watch.json")
    assert rec.status == "partial" and rec.payload.dcgm_used


# --- the summary: SM active preferred, never mixed ----------------------------------------------
def _dcgm_data(util, sm, pcie=None, nvlink=None, tick=0.1):
    from reports.base.payloads.watch import GpuSeries
    n = len(util[0])
    gpus = []
    for i, (u, a) in enumerate(zip(util, sm)):
        none = (None,) * n
        gpus.append(GpuSeries(
            index=i, name="G", util_source="sample_buffer", pcie_gen_max=5, pcie_width_max=16,
            t_s=tuple(round(tick * k, 4) for k in range(n)), util_pct=tuple(u),
            mem_util_pct=none, power_w=(100.0,) * n, sm_mhz=none, pcie_tx_gbps=(1.0,) * n,
            pcie_rx_gbps=(1.0,) * n, sm_active=tuple(a), sm_occupancy=none, dram_active=none,
            pcie_tx_bytes_per_s=tuple(pcie or none), pcie_rx_bytes_per_s=none,
            nvlink_tx_bytes_per_s=tuple(nvlink or none), nvlink_rx_bytes_per_s=none))
    return WatchData(requested_hz=1 / tick, gpus=tuple(gpus), load="test load",
                     source=WatchSource(dcgm=("sm_active",), dcgm_period_ms=100))


def test_summary_prefers_sm_active_for_busy_and_lag():
    # NVML says both GPUs 100% (NCCL spin); SM active shows a wave: GPU 1 two ticks behind
    n = 64
    sm = [[0.9 if (t - 2 * i) % 8 in (0, 1) else 0.1 for t in range(n)] for i in range(2)]
    s = S.summarize(_dcgm_data([[100.0] * n] * 2, sm))
    assert s.busy_source == "dcgm sm_active" and s.label == "observed (DCGM)"
    assert [x.lag_ticks for x in s.lags] == [2]
    assert s.k_busy_frac == (0.5, 0.5, 0.0)
    assert "SM active" in s.caveat and "100 ms here" in s.caveat and "not NVML" in s.caveat
    h = {x.name: x for x in s.hints}
    assert h["wave"].label == "observed (DCGM)"
    assert h["one_busy"].numbers["sm_active_pct"]["ratio"] == 1.0
    assert s.gpus[0].sm_active_pct.mean == pytest.approx(30.0)


def test_summary_never_mixes_sources():
    n = 20
    sm = [[0.5] * n, [0.5] * 5 + [None] * 15]          # GPU 1 has SM active at 25% of ticks
    s = S.summarize(_dcgm_data([[100.0] * n, [10.0] * n], sm))
    assert s.busy_source == "nvml util" and s.label == "observed (NVML)"
    assert s.k_busy_frac == (0.0, 1.0, 0.0)
    assert any("busy figures use NVML utilization" in x for x in s.notes)


def test_summary_pcie_and_nvlink_bytes_from_dcgm():
    n = 4
    d = _dcgm_data([[50.0] * n], [[0.5] * n], pcie=[6.3e9, 6.3e9, None, 6.3e9],
                   nvlink=[100e9] * n)
    g = S.summarize(d).gpus[0]
    assert g.pcie_source == "dcgm" and g.pcie_tx_gbps.mean == pytest.approx(6.3)
    # Gen5 x16 datasheet: 63.015 GB/s one way; NVLink against a given link only
    assert g.pcie_pct_of_link == pytest.approx(100 * 6.3 / S.pcie_link_gbps(5, 16))
    assert g.nvlink_tx_gbps.mean == pytest.approx(100.0) and g.nvlink_pct_of_link is None
    g = S.summarize(d, link_gbps=400.0).gpus[0]
    assert g.nvlink_pct_of_link == pytest.approx(25.0)
    from reports.render.watch_plot import watch_table
    head, rows, num = watch_table(to_json(S.summarize(d)))
    assert "SM active mean %" in head and len(head) == len(rows[0]) == len(num)
    assert rows[0][head.index("SM active mean %")] == "50.0"


def test_dcgm_series_are_empty_or_parallel():
    from reports.base.payloads.watch import GpuSeries
    from reports.base.schema import SchemaError
    with pytest.raises(SchemaError, match="sm_active: 1 values for 2 ticks"):
        GpuSeries(index=0, t_s=(0.0, 0.1), util_pct=(1.0, 1.0), mem_util_pct=(1.0, 1.0),
                  power_w=(1.0, 1.0), sm_mhz=(1.0, 1.0), pcie_tx_gbps=(None, None),
                  pcie_rx_gbps=(None, None), sm_active=(0.5,))
    assert len(DCGM_SERIES) == 7
