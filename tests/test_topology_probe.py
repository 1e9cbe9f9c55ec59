"""Hop classification, record building from a canned discovery, CLI paths (no GPU needed)."""
from __future__ import annotations

import pytest

from reports.base.payloads.topology import HopCost, P2PCopy, TopoGpu
from reports.base.records import make_record, read_record, save_record
from reports.cli import main
from topology import probe
from topology.discover import mask_to_cpulist, sysfs_bus_id
from topology.links import hop_class, pipeline_pairs
from topology.render import render_text


@pytest.mark.parametrize("link,cls", [("NV18", "nvlink"), ("NV4", "nvlink"),
                                      ("PIX", "same-switch"), ("PXB", "same-switch"),
                                      ("PHB", "same-socket"), ("NODE", "same-socket"),
                                      ("SYS", "cross-socket"), ("SOC", "cross-socket")])
def test_hop_class(link, cls):
    assert hop_class(link) == cls


def test_hop_class_rejects_self_and_junk():
    for bad in ("X", "NV", "nvlink", ""):
        with pytest.raises(ValueError):
            hop_class(bad)


def test_pipeline_pairs():
    assert pipeline_pairs([0, 1]) == [(0, 1), (1, 0)]
    assert pipeline_pairs([2, 0, 5]) == [(2, 0), (0, 5), (5, 2)]
    assert pipeline_pairs([3]) == []


def test_discovery_helpers():
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert mask_to_cpulist([0b1111_0000_1111, 1]) == "0-3,8-11,64"
    assert mask_to_cpulist([0]) is None


def _hop(src, dst, b, us):
    return HopCost(src=src, dst=dst, batch=b, bytes=2 * b * 7168 * 2, tensors=2,
                   nccl_us=us / 2, sendrecv_us=us, gloo_meta_us=40.0, hop_us=us)


def test_build_data_from_canned_discovery(fake_discovery):
    hops = [_hop(0, 1, 1, 60.0), _hop(1, 2, 1, 90.0), _hop(2, 0, 1, 95.0),
            _hop(0, 1, 8, 70.0)]  # b=8 lacks the 1->2 hop: no per-step total for it
    d = probe.build_data(fake_discovery, [0, 1, 2], hops=hops, hidden=7168, tensors=2, mode="default")
    assert [(h.src, h.dst, h.link, h.hop_class, h.carries)
            for h in d.pipeline_hops] == [(0, 1, "PIX", "same-switch", "hidden_states"),
                                          (1, 2, "SYS", "cross-socket", "hidden_states"),
                                          (2, 0, "SYS", "cross-socket", "tokens")]
    assert d.hops[1].hop_class == "cross-socket" and d.hops[0].link == "PIX"
    assert d.decode_step_hop_us == {"1": 150.0}
    assert d.gpus[2].numa_node == 1 and d.sockets == 2
    assert d.links == fake_discovery.links


def test_record_renders_and_round_trips(tmp_path, fake_discovery):
    p2p = [P2PCopy(src=0, dst=1, op="write", direction="uni", p2p=True, bandwidth_gbps=53.5),
           P2PCopy(src=1, dst=2, op="write", direction="uni", p2p=True, status="waived",
                   reason="no P2P")]
    d = probe.build_data(fake_discovery, [0, 1, 2], p2p=p2p, hops=[_hop(0, 1, 1, 60.0)], hidden=7168,
                         tensors=2, mode="quick")
    rec = make_record("topology", d, argv=["ppscope", "topology"])
    save_record(rec, tmp_path / "t.json")
    back = read_record(tmp_path / "t.json")
    assert back.payload == d and back.payload.p2p[0].bandwidth_gbps == 53.5
    text = render_text(back)
    assert "53.50" in text and "WAIVED" in text and "same-switch" in text
    assert "60.0 (30.0)" in text


def test_cli_from_nvidia_smi_writes_record_and_png(fixtures, tmp_path, capsys):
    out = tmp_path / "r" / "topology.json"
    rc = main(["topology", "--from-nvidia-smi", str(fixtures / "topo" / "five_gpu_two_numa.txt"),
               "--json", str(out)])
    assert rc == 0
    d = read_record(out).payload
    assert d.source == "nvidia-smi" and d.mode == "offline" and d.hidden is None
    assert d.links["1-2"] == "PHB" and len(d.links) == 10
    assert d.gpus[0] == TopoGpu(index=0, cpu_affinity="8-15,24-31", numa_node=1)
    assert [h.hop_class for h in d.pipeline_hops] == [
        "cross-socket", "same-socket", "same-socket", "same-socket", "cross-socket"]
    assert (tmp_path / "r" / "topology.png").stat().st_size > 1000
    assert "NODE" in capsys.readouterr().out


def test_cli_pp_limits_the_pipeline(fixtures, tmp_path):
    out = tmp_path / "t.json"
    assert main(["topology", "--from-nvidia-smi", str(fixtures / "topo" / "rtxpro6000x8_pcie.txt"),
                 "--json", str(out), "--pp", "4", "--no-png"]) == 0
    d = read_record(out).payload
    assert d.pipeline == (0, 1, 2, 3) and len(d.links) == 28


@pytest.mark.parametrize("args,words", [
    (["--from-nvidia-smi", "MISSING"], "cannot read"),
    (["--from-nvidia-smi", "BAD"], "line 2: row GPU0 has unknown link 'QQQ'"),
    (["--from-nvidia-smi", "/dev/zero"], "a character device"),
    (["--from-nvidia-smi", "DIR"], "a directory"),
    (["--from-nvidia-smi", "GOOD", "--pp", "9"], "--pp 9 but the file lists 2 GPUs"),
    (["--from-nvidia-smi", "GOOD", "--gpus", "0,x"], "comma-separated integers"),
    (["--from-nvidia-smi", "GOOD", "--gpus", "0,5"], "GPU 5 is not in the file"),
])
def test_cli_errors_one_line_exit_2(tmp_path, capsys, args, words):
    (tmp_path / "GOOD").write_text("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPIX\t0-7\n"
                                   "GPU1\tPIX\t X \t0-7\n")
    (tmp_path / "BAD").write_text("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tQQQ\t0-7\n")
    (tmp_path / "DIR").mkdir()
    args = [str(tmp_path / a) if a in ("MISSING", "BAD", "GOOD", "DIR") else a for a in args]
    rc = main(["topology", *args, "--json", str(tmp_path / "o.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and "\n" not in err and "Traceback" not in err


def test_cli_live_without_gpu_explains_and_leaves_waived_record(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("microbench.kit.gpus.nvml_gpu_count", lambda: 0)
    out = tmp_path / "t.json"
    rc = main(["topology", "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "needs NVIDIA GPUs" in err and "--from-nvidia-smi" in err
    rec = read_record(out)
    assert rec.status == "waived" and "--from-nvidia-smi" in rec.reason


def test_hidden_size_from_model_or_flag():
    from topology.topology_cli import hidden_size
    assert hidden_size("kimi-k2", 4096) == 4096
    assert hidden_size("kimi-k2", None) == 7168


def test_run_orchestration_with_fake_bench(tmp_path, fake_machine):
    cfg = probe.TopologyConfig(json_path=tmp_path / "t.json", hop=False, mode="quick")
    rec, note = probe.run(cfg)
    d = rec.payload
    assert rec.status == "ok" and note is None and read_record(tmp_path / "t.json").status == "ok"
    # 3 pairs; P2P pairs: 2x(write, read) + bidir = 5 on + 3 off; the waived pair: 5 + 3
    assert len(d.p2p) == 24 and len(d.latency) == 12 and len(d.host) == 6
    waived = [e for e in d.p2p if e.status == "waived"]
    assert {(e.src, e.dst) for e in waived} == {(1, 2), (2, 1)}
    assert "chipset not supported" in waived[0].reason
    off = [e for e in d.p2p if (e.src, e.dst) == (1, 2) and not e.p2p]
    assert off and all(e.status == "ok" for e in off)  # host-staged numbers still there
    # ring 0->1->2->0 falls back to P2P off because 1-2 has no P2P; alone = P2P-off writes
    assert d.ring.p2p is False and d.ring.pairs[0].ratio == 25.0 / 50.0
    # every P2P-off measurement is run as host-staged (no spin blocker, more samples)
    ok = [e for e in d.p2p if e.status == "ok"]
    assert all(e.spin_blocked == e.p2p for e in ok) and len(ok) == 19
    lat = [e for e in d.latency if e.status == "ok"]
    assert all((e.latency_us > 100) == (not e.p2p) for e in lat) and len(lat) == 10
    assert set(d.run_time_s) == {"start", "host", "pairs", "ring", "total"}
    assert d.projected_run_time_s["8"] >= d.projected_run_time_s["4"] > 0


def test_staged_copies_skip_the_spin_and_take_more_samples():
    from topology.p2p import Bench, P2PConfig

    b = object.__new__(Bench)  # no CUDA: only the sampling policy of _timed is exercised
    b.cfg, b.slow_enqueues, calls = P2PConfig(samples=2), 0, []
    b._warmup = lambda dev, enqueue: 1
    times_ms = iter([4.0, 5.0, 6.0, 0.5, 0.4])

    def sample(dev, enqueue, block=True):
        calls.append(block)
        return next(times_ms)
    b._sample = sample
    staged = b._timed(0, None, reps=5, nbytes=1000, samples=2, staged=True)
    assert calls == [False] * 3 and staged["samples"] == 3 and not staged["spin_blocked"]
    assert staged["time_samples_us"] == [800.0, 1000.0, 1200.0]
    assert staged["time_us"] == 1000.0 and staged["bandwidth_gbps"] == 1000 / 1000.0 / 1e3
    copy = b._timed(0, None, reps=5, nbytes=1000, samples=2)
    assert calls[3:] == [True, True] and copy["samples"] == 2 and copy["spin_blocked"]
    assert copy["time_us"] == 90.0
    # what Bench returns is exactly a P2PCopy's measurement fields
    e = P2PCopy(src=0, dst=1, op="write", direction="uni", p2p=False, **staged)
    assert list(e.time_samples_us) == [800.0, 1000.0, 1200.0] and e.spin_blocked is False


def test_run_refuses_more_stages_than_gpus(tmp_path, monkeypatch, fake_discovery):
    import topology.discover as disc_mod
    monkeypatch.setattr(disc_mod, "discover", lambda: fake_discovery)   # 3 GPUs
    cfg = probe.TopologyConfig(json_path=tmp_path / "t.json", hop=False, mode="quick", pp=8)
    with pytest.raises(ValueError, match="--pp 8 but this machine has 3 GPU"):
        probe.run(cfg)
