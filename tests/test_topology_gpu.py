"""GPU tier: small live runs of the copy benchmarks and the torchrun hop (skipped without GPUs)."""
from __future__ import annotations

import json

import pytest

from reports.cli import main


@pytest.mark.gpu
def test_host_device_bandwidth_is_plausible():
    pytest.importorskip("cupy")
    from topology.p2p import Bench, P2PConfig
    b = Bench([0], P2PConfig(nbytes=16_000_000, samples=2))
    h2d, d2h = b.host(0)
    for r in (h2d, d2h):
        assert 1.0 < r["bandwidth_gbps"] < 200.0 and r["samples"] == 2


@pytest.mark.multigpu
def test_pair_bandwidth_latency_and_ring():
    pytest.importorskip("cupy")
    from topology.p2p import Bench, P2PConfig, can_access_peer, peer_access
    b = Bench([0, 1], P2PConfig(nbytes=16_000_000, samples=2))
    with peer_access([(0, 1)], on=can_access_peer(0, 1)):
        w = b.unidirectional(0, 1)
        bi = b.bidirectional(0, 1)
        lat = b.latency(0, 1)
        ring = b.ring([(0, 1), (1, 0)])
    assert w["bandwidth_gbps"] > 1.0 and bi["bytes"] == 32_000_000
    assert 0.1 < lat["latency_us"] < 1000.0
    assert len(ring) == 2 and all(r["bandwidth_gbps"] > 1.0 for r in ring)


@pytest.mark.multigpu
def test_live_quick_run_writes_full_record(tmp_path):
    pytest.importorskip("cupy")
    out = tmp_path / "topology.json"
    assert main(["topology", "--quick", "--pp", "2", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    d = rec["data"]
    assert rec["status"] == "ok", rec["reason"]
    assert {h["batch"] for h in d["hops"]} == {1, 8, 64, 256}
    assert all(h["hop_us"] > 0 and h["hop_class"] for h in d["hops"])
    for h in d["hops"]:  # the parts add up by construction; transport beats one torch send
        assert h["hop_us"] == pytest.approx(h["gloo_meta_us"] + h["nccl_us"] + h["overhead_us"])
        assert 0 < h["nccl_transport_us"] and h["gloo_send_us"] > 0
    assert [t["bytes"] for t in d["nccl_transport"]] == [8, 32768, 8388608]
    assert all(t["nccl_busbw_gbps"] > 0 for t in d["nccl_transport"])
    staged = [e for e in d["p2p"] if not e["p2p"] and e["status"] == "ok"]
    assert staged and all(not e["spin_blocked"] for e in staged)
    assert d["projected_run_time_s"]["8"] > d["run_time_s"]["total"] * 0.5
    assert (tmp_path / "topology.png").exists()
