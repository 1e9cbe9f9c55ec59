"""The GPU watch on a fake NVML (tests/fake_nvml.py): sampling rate, the driver's sample buffer vs
the instantaneous reading, a GPU lost mid-run, unsupported counters, the record round trip, the
CLI, and the summary's numbers on synthetic series worked out by hand."""
from __future__ import annotations

import datetime
import json
import sys
import time

import pytest

from fake_nvml import FakeClock, FakeGpu, FakeNvml, driver_samples, sglang_args, two_gpus
from microbench.sglang import cli as sglang_cli
from microbench.watch import cli as WC
from microbench.watch import sampler as W
from reports.base.errors import CliError
from reports.base.payloads.watch import GpuSeries, WatchData
from reports.base.records import RecordError, read_record
from reports.base.schema import SchemaError, to_json
from reports.model.observed import watch_summary as S

T0 = 1_700_000_000.0


def _watch(gpus, hz=10.0, clock=None, **cfg):
    clock = clock or FakeClock(T0)
    nv = FakeNvml(gpus, clock)
    w = W.Watch(W.WatchConfig(hz=hz, **cfg), nv=nv, clock=clock)
    w.open()
    return w, nv, clock


def _drive(w, clock, ticks, period=0.1, buffers_every=None):
    """Tick at T0 + period * (i + 1); read the driver buffer every `buffers_every` ticks and once
    at the end, as the sampler's thread does."""
    for i in range(ticks):
        clock.t = T0 + period * (i + 1)
        w.step()
        if buffers_every and (i + 1) % buffers_every == 0:
            w.read_buffers()
    w.read_buffers()
    w.t_end_us = int(clock.t * 1e6)


# --- the sampler --------------------------------------------------------------------------------
def test_sample_buffer_path_aligns_driver_windows_to_ticks():
    # driver windows every 200 ms; one from before the watch seeds the first tick
    util = driver_samples(T0 - 0.4, T0 + 2.0, lambda t: round((t - T0) * 100) % 100 + 1)
    mem = driver_samples(T0 - 0.4, T0 + 2.0, lambda t: 7)
    w, nv, clock = _watch([FakeGpu(util_samples=util, mem_samples=mem)])
    _drive(w, clock, 10, buffers_every=3)
    g = w.data().gpus[0]
    assert g.util_source == "sample_buffer" and g.util_period_ms == 200.0
    # ticks at 0.1..1.0 s; windows end at 0.0 (value 1), 0.2 (21), 0.4 (41), ...: a tick holds
    # the newest window that ended at or before it
    assert g.util_pct == (1, 21, 21, 41, 41, 61, 61, 81, 81, 1)
    assert g.mem_util_pct == (7,) * 10
    # lastSeenTimeStamp bookkeeping: each read asks only for what is newer than the last sample
    asked = [a[1] for c, h, a in nv.calls if c == "samples" and a[0] == 1]
    assert asked[0] == 0 and asked == sorted(asked)
    assert asked[1] == round((T0 - 0.0) * 1e6)      # newest pre-watch sample
    assert "utilization" not in [c for c, *_ in nv.calls]   # buffer path: no instantaneous call


def test_buffer_means_several_windows_between_ticks():
    # a driver sampling faster than the ticks: a tick gets the mean of the windows since the last
    util = driver_samples(T0 + 0.05, T0 + 1.0, lambda t: 10 if round((t - T0) / 0.05) % 2 else 30,
                          period_s=0.05)
    w, _, clock = _watch([FakeGpu(util_samples=util)])
    _drive(w, clock, 4, period=0.2)
    g = w.data().gpus[0]
    # (0, 0.2]: windows at .05 .10 .15 .20 -> 10 30 10 30 -> 20
    assert g.util_pct == (20, 20, 20, 20) and g.util_period_ms == 50.0


def test_buffer_overrun_leaves_the_dropped_windows_unknown():
    # a driver keeping 5 samples (1 s); the watch reads it at 0.3 s and then only at 3.0 s
    util = driver_samples(T0 - 0.4, T0 + 5.0, lambda t: 50)
    w, _, clock = _watch([FakeGpu(util_samples=util, buffer_len=5)])
    before = w.buffer_every_s
    for i in range(30):
        clock.t = T0 + 0.1 * (i + 1)
        w.step()
        if i == 2:
            w.read_buffers()
    w.read_buffers()
    d = w.data()
    # seen up to 0.2 s; the next sample returned is 2.2 s: 0.4 .. 2.1 s unknown
    assert d.gpus[0].util_pct == (50,) * 3 + (None,) * 18 + (50,) * 9
    assert any("overran" in n for n in d.notes) and w.buffer_every_s == before / 2


def test_watch_starts_when_started_not_when_opened():
    util = driver_samples(T0 - 0.4, T0 + 10.0, lambda t: round(t - T0))
    w, _, clock = _watch([FakeGpu(util_samples=util)])
    clock.t = T0 + 5.0          # readers / load set-up between open() and start()
    w._rebase()
    clock.t = T0 + 5.1
    w.step()
    w.read_buffers()
    g = w.data().gpus[0]
    assert g.t_s == (0.1,) and g.util_pct == (5,)     # the window that ended at 5.0 s


def test_instantaneous_path_when_driver_has_no_buffer():
    gpu = FakeGpu(util_samples=None, mem_samples=None,
                  util_now=lambda t: (round((t - T0) * 10) * 10 % 100, 3))
    w, nv, clock = _watch([gpu])
    _drive(w, clock, 5)
    g = w.data().gpus[0]
    assert g.util_source == "instantaneous" and g.util_period_ms is None
    assert g.util_pct == (10, 20, 30, 40, 50) and g.mem_util_pct == (3,) * 5
    assert g.unsupported == {"util_samples": "Not Supported", "mem_samples": "Not Supported"}
    # recorded once: the buffer is not asked again
    assert sum(1 for c, *_ in nv.calls if c == "samples") == 2


def test_unsupported_counter_recorded_once_not_an_error():
    gpu = FakeGpu(power_mw=None, pcie_kbs=None)
    w, nv, clock = _watch([gpu])
    for i in range(4):
        clock.t = T0 + 0.1 * (i + 1)
        w.read_pcie(w.gpus[0])
        w.step()
    g = w.data().gpus[0]
    assert g.power_w == (None,) * 4 and g.pcie_tx_gbps == (None,) * 4
    assert g.unsupported == {"power": "Not Supported", "pcie_tx": "Not Supported",
                             "pcie_rx": "Not Supported"}
    assert g.errors == {}
    assert sum(1 for c, *_ in nv.calls if c == "power") == 1
    assert sum(1 for c, *_ in nv.calls if c == "pcie") == 2
    assert g.sm_mhz == (1980,) * 4


def test_transient_error_is_counted_and_the_tick_keeps_going():
    w, _, clock = _watch([FakeGpu(fail={"sm_clock": [T0 + 0.2]})])
    _drive(w, clock, 3)
    g = w.data().gpus[0]
    assert g.sm_mhz == (1980, None, 1980) and g.errors == {"sm_clock": 1} and not g.unsupported


def test_gpu_lost_mid_run_others_go_on():
    gpus = [FakeGpu(), FakeGpu(lost_at=T0 + 0.55), FakeGpu(lost_at=T0 + 0.75, lost_code=999)]
    w, _, clock = _watch(gpus)
    _drive(w, clock, 10)
    d = w.data()
    g0, g1, g2 = d.gpus
    assert len(g0.t_s) == 10 and len(g1.t_s) == 5 and len(g2.t_s) == 7
    assert (g1.lost_at_s, g1.lost_reason) == (0.6, "GPU is lost")
    assert (g2.lost_at_s, g2.lost_reason) == (0.8, "Unknown Error")
    assert d.lost_gpus == {1: 0.6, 2: 0.8}
    s = S.summarize(d)
    assert s.n_gpus == 1 and any("GPU 1 lost at 0.6 s" in n for n in s.notes)


def test_pcie_reading_lands_on_the_next_tick_in_gbps():
    w, _, clock = _watch([FakeGpu(pcie_kbs=(1_000_000, 500_000))])
    clock.t = T0 + 0.1
    w.step()
    w.read_pcie(w.gpus[0])
    clock.t = T0 + 0.2
    w.step()
    clock.t = T0 + 0.3
    w.step()
    g = w.data().gpus[0]
    # NVML KB/s taken as 1024 bytes; GB = 1e9 bytes
    assert g.pcie_tx_gbps == (None, 1.024, None) and g.pcie_rx_gbps == (None, 0.512, None)


def test_processes_kept_when_the_set_changes():
    procs = lambda t: ([] if t < T0 + 0.25 else
                       [type("P", (), {"pid": 4242, "usedGpuMemory": 2**30})()])
    w, _, clock = _watch([FakeGpu(procs=procs)])
    for i in range(5):
        clock.t = T0 + 0.1 * (i + 1)
        w.read_processes()
    snaps = w.data().gpus[0].processes
    assert [(s.t_s, [p.pid for p in s.processes]) for s in snaps] == [(0.1, []), (0.3, [4242])]
    assert snaps[1].processes[0].used_mib == 1024.0


def test_threads_reach_the_requested_rate_and_measure_their_cost():
    gpus = [FakeGpu(util_samples=driver_samples(time.time() - 1, time.time() + 5, lambda t: 50))
            for _ in range(8)]
    nv = FakeNvml(gpus, time.time)
    w = W.Watch(W.WatchConfig(hz=50, duration_s=0.6, pcie_every_s=0.1, source="nvml"), nv=nv)
    w.start()
    w.wait()
    w.stop()
    d = w.data()
    assert 0.55 <= d.duration_s <= 0.9
    assert d.ticks >= 0.75 * 50 * 0.6 and d.achieved_hz >= 0.75 * 50
    assert all(len(g.t_s) == d.ticks for g in d.gpus)
    assert d.cpu_pct_of_core is not None and set(d.cpu_s) == {"sampling", "pcie", "writes"}
    assert {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetSamples",
            "nvmlDeviceGetPcieThroughput"} <= set(d.call_us)
    assert any(v is not None for v in d.gpus[0].pcie_tx_gbps)
    assert all(v == 50 for g in d.gpus for v in g.util_pct)


def test_visible_indices_follow_cuda_visible_devices():
    nv = FakeNvml([FakeGpu() for _ in range(4)], FakeClock())
    assert W.visible_indices(nv, {}) == ((0, 1, 2, 3), None)
    assert W.visible_indices(nv, {"CUDA_VISIBLE_DEVICES": "2,0"}) == ((2, 0), None)
    idx, note = W.visible_indices(nv, {"CUDA_VISIBLE_DEVICES": "GPU-00000003,7"})
    assert idx == (3,) and "7" in note


# --- the record -----------------------------------------------------------------------------
def _small_record(tmp_path):
    util = driver_samples(T0 - 0.2, T0 + 1.0, lambda t: 40)
    w, _, clock = _watch([FakeGpu(util_samples=util, pcie_kbs=(1000, 2000)), FakeGpu()])
    w.read_pcie(w.gpus[0])
    _drive(w, clock, 5)
    d = w.data()
    dest, note = WC.save(d, tmp_path / "watch.json", argv=["ppscope", "sglang", "--watch", "1"])
    return d, dest


def test_record_round_trip_and_trace(tmp_path):
    d, dest = _small_record(tmp_path)
    rec = read_record(dest)
    assert rec.probe == "watch" and rec.status == "ok" and rec.payload == d
    tr = json.loads((tmp_path / "watch.trace.json").read_text())
    names = {(e["pid"], e["name"]) for e in tr["traceEvents"] if e["ph"] == "C"}
    assert (0, "util") in names and (1, "power") in names and (0, "PCIe TX") in names
    util0 = [e for e in tr["traceEvents"] if e["ph"] == "C" and e["pid"] == 0
             and e["name"] == "util"]
    # constant 40%: the step function needs its first and last point only
    assert [(e["ts"], e["args"]) for e in util0] == [(1e5, {"%": 40}), (5e5, {"%": 40})]


def test_the_trace_is_committed_with_its_record(tmp_path, disk_full_for):
    d, dest = _small_record(tmp_path)
    before = dest.read_bytes(), (tmp_path / "watch.trace.json").read_bytes()
    # the trace cannot be written: the record is not replaced either (one write_files)
    disk_full_for("watch.trace.json")
    with pytest.raises(OSError):
        WC.save(d, dest, argv=["ppscope", "sglang", "--watch", "2"])
    assert (dest.read_bytes(), (tmp_path / "watch.trace.json").read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["watch.json", "watch.trace.json"]
    # a failed run kept beside the good record gets its own trace beside it
    disk_full_for(None)
    dest2, note = WC.save(d, dest, status="partial", reason="interrupted")
    assert dest2.name == "watch.partial.json" and "kept the ok record" in note
    assert (tmp_path / "watch.partial.trace.json").exists()
    assert (dest.read_bytes(), (tmp_path / "watch.trace.json").read_bytes()) == before


def test_record_wrong_field_fails_with_one_line(tmp_path):
    _, dest = _small_record(tmp_path)
    raw = json.loads(dest.read_text())
    raw["data"]["gpus"][0]["util_pct"][1] = 150
    dest.write_text(json.dumps(raw))
    with pytest.raises(RecordError) as e:
        read_record(dest)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.endswith("data.gpus[0].util_pct[1]: expected a number <= 100, got 150")
    raw["data"]["gpus"][0]["util_pct"] = [40]
    dest.write_text(json.dumps(raw))
    with pytest.raises(RecordError, match=r"util_pct: 1 values for 5 ticks"):
        read_record(dest)


def test_series_must_be_parallel():
    with pytest.raises(SchemaError):
        GpuSeries(index=0, t_s=(0.0, 0.1), util_pct=(1.0,))


# --- the CLI ------------------------------------------------------------------------------------
_args = sglang_args


@pytest.fixture
def fake_pynvml(monkeypatch):
    nv = two_gpus()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setattr(W.D, "dcgmi_path", lambda: None)   # NVML alone, even where DCGM is
    return nv


def test_cli_watch_alone_writes_record_and_trace(fake_pynvml, tmp_path, capsys):
    a = _args(["--watch", "0.4", "--watch-hz", "20", "--json", str(tmp_path / "sglang.json")])
    assert sglang_cli.run(a) == 0
    rec = read_record(tmp_path / "watch.json")
    assert rec.status == "ok" and rec.payload.requested_hz == 20 and rec.payload.ticks >= 5
    assert (tmp_path / "watch.trace.json").exists() and not (tmp_path / "sglang.json").exists()
    out = capsys.readouterr().out
    assert "GPU watch (NVML): 2 GPU(s)" in out and "not SM occupancy" in out


def test_cli_watch_covers_the_live_load(fake_pynvml, tmp_path, monkeypatch):
    seen = {}

    def load(args):
        seen["start"] = time.time()
        time.sleep(0.35)
        seen["end"] = time.time()
        return 0
    monkeypatch.setattr(sglang_cli, "run_evidence", load)
    a = _args(["--url", "http://127.0.0.1:1", "--watch", "--watch-hz", "20",
               "--json", str(tmp_path / "sglang.json")])
    assert sglang_cli.run(a) == 0
    rec = read_record(tmp_path / "watch.json")
    d = rec.payload
    base = datetime.datetime.fromisoformat(d.started_utc).timestamp()   # ms resolution
    g = d.gpus[0]
    # first tick before the load began, last one after it ended
    assert g.t_s[0] <= seen["start"] - base + 0.002 and g.t_s[-1] >= seen["end"] - base - 0.002
    assert d.load == "live probe of http://127.0.0.1:1"


def test_cli_ctrl_c_keeps_what_was_sampled(fake_pynvml, tmp_path, monkeypatch):
    def load(args):
        time.sleep(0.25)
        raise KeyboardInterrupt
    monkeypatch.setattr(sglang_cli, "run_evidence", load)
    a = _args(["--url", "http://127.0.0.1:1", "--watch", "--json", str(tmp_path / "s.json")])
    with pytest.raises(KeyboardInterrupt):
        sglang_cli.run(a)
    rec = read_record(tmp_path / "watch.json")
    assert rec.status == "partial" and rec.reason.startswith("interrupted after")
    assert rec.payload.ticks >= 2


def test_cli_partial_saves_keep_an_older_ok_record(fake_pynvml, tmp_path, monkeypatch):
    import functools

    from reports.base import records
    _, old = _small_record(tmp_path)                  # an earlier finished watch
    writes = []
    real = records.write_json_atomic
    monkeypatch.setattr(records, "write_json_atomic",
                        lambda path, obj: writes.append(str(path)) or real(path, obj))
    monkeypatch.setattr(W, "WatchConfig", functools.partial(W.WatchConfig, save_every_s=0.05))

    def load(args):
        time.sleep(0.5)
        raise KeyboardInterrupt
    monkeypatch.setattr(sglang_cli, "run_evidence", load)
    with pytest.raises(KeyboardInterrupt):
        sglang_cli.run(_args(["--url", "http://127.0.0.1:1", "--watch", "--watch-hz", "50",
                              "--json", str(tmp_path / "sglang.json")]))
    beside = tmp_path / "watch.partial.json"
    # snapshots at ~0.05, 0.1, 0.2 (0.4) s went beside the ok record, then the Ctrl-C one
    assert writes.count(str(beside)) >= 4 and str(old) not in writes
    assert read_record(old).status == "ok" and read_record(old).payload.ticks == 5
    rec = read_record(beside)
    assert rec.status == "partial" and rec.reason.startswith("interrupted")


def test_cli_watch_needs_seconds_without_url():
    with pytest.raises(CliError, match="--watch needs SECONDS"):
        sglang_cli.run(_args(["--watch"]))
    with pytest.raises(CliError, match="--watch-hz"):
        sglang_cli.run(_args(["--watch", "5", "--watch-hz", "0"]))


def test_cli_without_nvml_leaves_a_waived_record(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert sglang_cli.run(_args(["--watch", "1", "--json", str(tmp_path / "s.json")])) == 0
    rec = read_record(tmp_path / "watch.json")
    assert rec.status == "waived" and "not installed" in rec.reason


# --- the summary, on synthetic series -------------------------------------------------------
def _data(util: list[list[float]], power=None, tick=0.1, **gpu_kw) -> WatchData:
    n = len(util[0])
    gpus = []
    for i, u in enumerate(util):
        p = power[i] if power else [100.0] * n
        gpus.append(GpuSeries(index=i, name="G", util_source="sample_buffer",
                              t_s=tuple(round(tick * k, 4) for k in range(n)),
                              util_pct=tuple(u), mem_util_pct=(None,) * n, power_w=tuple(p),
                              sm_mhz=(None,) * n, pcie_tx_gbps=(None,) * n,
                              pcie_rx_gbps=(None,) * n, **gpu_kw))
    return WatchData(requested_hz=1 / tick, gpus=tuple(gpus), load="test load")


def test_distribution_exact():
    d = _data([[10.0 * k for k in range(11)]])
    u = S.summarize(d).gpus[0].util_pct
    assert (u.mean, u.p10, u.p50, u.p90, u.max, u.n) == (50, 10, 50, 90, 100, 11)
    assert S.percentile([1, 2, 3, 4], 50) == 2.5


def test_k_busy_fractions_exact():
    # 3 GPUs, 10 ticks; busy = util >= 50. Busy counts per tick: 0,1,1,2,3,3,3,0,1,2
    a = [0, 60, 0, 60, 60, 60, 60, 0, 0, 60]
    b = [0, 0, 50, 70, 70, 70, 70, 0, 55, 49]
    c = [10, 0, 0, 0, 90, 90, 90, 0, 0, 90]
    s = S.summarize(_data([a, b, c]))
    assert s.k_busy_frac == (0.2, 0.3, 0.2, 0.3)
    assert s.mean_busy_gpus == pytest.approx(1.6)
    assert s.ticks_used == 10 and s.tick_s == pytest.approx(0.1)


def test_wave_lag_recovered_and_hint_holds():
    # 4 GPUs, a pulse of 2 ticks every 8 ticks, each GPU 2 ticks behind the previous one:
    # exactly one GPU busy at any tick
    n = 64
    util = [[100.0 if (t - 2 * i) % 8 in (0, 1) else 0.0 for t in range(n)] for i in range(4)]
    s = S.summarize(_data(util))
    assert [x.lag_ticks for x in s.lags] == [2, 2, 2]
    assert [x.lag_s for x in s.lags] == [0.2, 0.2, 0.2]
    assert all(x.r > 0.9 for x in s.lags)
    assert s.k_busy_frac == (0.0, 1.0, 0.0, 0.0, 0.0)
    h = {x.name: x for x in s.hints}
    assert h["wave"].holds is True and h["wave"].label == "observed (NVML)"
    assert h["wave"].numbers["half_idle_share"] == 1.0
    assert h["one_busy"].holds is False and h["all_low"].holds is False


def test_one_busy_exact():
    n = 20
    util = [[30.0] * n, [90.0] * n, [30.0] * n, [20.0] * n]
    s = S.summarize(_data(util))
    h = {x.name: x for x in s.hints}["one_busy"]
    # NVML alone never decides it (sgl-project/sglang#10489): the numbers, not a verdict
    assert h.holds is None
    assert h.numbers["util_pct"] == {"gpu": 1, "mean": 90.0, "others_median": 30.0, "ratio": 3.0}
    assert "GPU 1 reads 90%" in h.text and "#10489" in h.text
    # by power alone: flat utilization (NCCL waits read 100%), one GPU drawing 1.5x
    s = S.summarize(_data([[100.0] * n] * 3, power=[[300.0] * n, [450.0] * n, [300.0] * n]))
    h = {x.name: x for x in s.hints}["one_busy"]
    assert h.holds is None and h.numbers["power_w"]["ratio"] == 1.5
    assert h.numbers["util_pct"]["ratio"] == 1.0


def test_a_pp_rank_waiting_in_a_receive_is_never_called_busy_from_nvml():
    """sgl-project/sglang#10489: PP rank 1 idles in an NCCL receive at ~100% utilization and
    high power while rank 0 computes at 55%: NVML cannot tell the two apart."""
    n = 20
    s = S.summarize(_data([[55.0] * n, [100.0] * n], power=[[250.0] * n, [420.0] * n]))
    h = {x.name: x for x in s.hints}["one_busy"]
    assert h.holds is None and "stands out" not in h.text, h.text
    assert "SM active" in h.text and "--traces" in h.text


def test_all_low_exact():
    util = [[0.0] * 6 + [80.0] * 4, [5.0] * 6 + [10.0] * 4]
    s = S.summarize(_data(util))
    h = {x.name: x for x in s.hints}["all_low"]
    assert s.all_low_frac == 0.6 and h.holds is True
    assert h.numbers == {"all_low_share": 0.6, "mean_util_pct": 19.5, "mean_power_w": 100.0}
    assert "while the live load ran" in h.text


def test_too_few_ticks_says_so():
    s = S.summarize(_data([[100.0] * 4, [0.0] * 4]))
    assert all(h.holds is None and h.text == "only 4 ticks with every GPU's utilization "
               "(needs 10)" for h in s.hints if h.name != "shared")
    from reports.render.watch_plot import watch_lines
    assert "all_low [observed (NVML)]: not enough samples: only 4 ticks" in \
        "\n".join(watch_lines(to_json(s)))


def test_pcie_against_link_exact():
    n = 4
    d = _data([[0.0] * n], pcie_gen_max=4, pcie_width_max=16)
    g = d.gpus[0]
    d = WatchData(gpus=(GpuSeries(**{**{f: getattr(g, f) for f in g.__dataclass_fields__},
                                     "pcie_tx_gbps": (1.024, None, 1.024, None),
                                     "pcie_rx_gbps": (0.512, 0.512, None, None)}),))
    st = S.summarize(d).gpus[0]
    assert S.pcie_link_gbps(4, 16) == pytest.approx(31.507692307692)   # 16 GT/s x16, 128b/130b
    assert S.pcie_link_gbps(5, 16) == pytest.approx(63.015384615385)
    assert st.pcie_tx_gbps.mean == 1.024 and st.pcie_rx_gbps.mean == 0.512
    assert st.link_source == "datasheet (Gen4 x16)"
    assert st.pcie_pct_of_link == pytest.approx(3.25)
    st = S.summarize(d, link_gbps=2.048).gpus[0]
    assert (st.link_gbps, st.link_source, st.pcie_pct_of_link) == (2.048, "given", 50.0)


def test_caveat_and_render(tmp_path):
    n = 64
    util = [[100.0 if (t - 2 * i) % 8 in (0, 1) else 0.0 for t in range(n)] for i in range(2)]
    d = _data(util)
    s = to_json(S.summarize(d))
    assert "not SM occupancy" in s["caveat"]
    from reports.render.watch_plot import watch_lines, watch_table
    head, rows, num = watch_table(s)
    assert len(rows) == 2 and len(head) == len(rows[0]) == len(num)
    lines = watch_lines(s)
    assert any(line.startswith("wave [observed (NVML)]: holds") for line in lines)


def test_shared_gpu_from_the_process_list():
    from dataclasses import replace as rep
    from reports.base.payloads.watch import GpuProcess, ProcessSnapshot
    d = _data([[50.0] * 20, [50.0] * 20])
    rank = GpuProcess(pid=100, used_mib=80000.0, name="python3")
    other = GpuProcess(pid=200, used_mib=2048.0, name="hog")
    # GPU 1: its rank alone 0-3 s, a second process 3-6 s, alone again to the end (10 s)
    g0 = rep(d.gpus[0], processes=(ProcessSnapshot(0.0, (rank,)),))
    g1 = rep(d.gpus[1], processes=(ProcessSnapshot(0.0, (rank,)),
                                   ProcessSnapshot(3.0, (rank, other)),
                                   ProcessSnapshot(6.0, (rank,))))
    s = S.summarize(rep(d, gpus=(g0, g1), duration_s=10.0))
    h = {x.name: x for x in s.hints}["shared"]
    assert h.holds is True and h.numbers["1"] == {"max_processes": 2, "shared_share": 0.3,
                                                  "pids": [100, 200]}
    assert h.numbers["0"]["shared_share"] == 0.0
    assert "GPU 1 ran 2 compute processes at once for 30%" in h.text and "pid 200 (hog)" in h.text
    # a second process for under 10% of the watch is not a shared GPU; no list: no verdict
    g1 = rep(g1, processes=(ProcessSnapshot(0.0, (rank, other)), ProcessSnapshot(0.5, (rank,))))
    h = {x.name: x for x in S.summarize(rep(d, gpus=(g0, g1), duration_s=10.0)).hints}["shared"]
    assert h.holds is False and h.numbers["1"]["shared_share"] == 0.05
    h = {x.name: x for x in S.summarize(rep(d, duration_s=10.0)).hints}["shared"]
    assert h.holds is None
