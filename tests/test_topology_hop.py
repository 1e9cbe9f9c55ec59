"""PP hop and NCCL transport: sizes, check pattern, hop decomposition, rendering, run-time
projection (CPU; the torchrun part itself is in the GPU tier)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from microbench.kit.timing import summarize
from reports.base.payloads.topology import HopCost, TopologyData, TransportPoint
from topology import hop, probe
from topology.render import hop_parts_table, transport_table


def test_sizes_match_sendrecv_perf_sweep():
    sizes = hop.parse_sizes("all")  # sendrecv_perf -b 8 -e 128M -f 2
    assert sizes[0] == 8 and sizes[-1] == 128 * 1024 * 1024 and len(sizes) == 25
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert hop.parse_sizes("none") == [] and hop.parse_sizes("8,4096") == [8, 4096]
    # every default/quick size is one sendrecv_perf prints, so rows compare one to one
    for mode in ("quick", "default"):
        assert set(hop.parse_sizes(probe.MODES[mode]["sizes"])) <= set(sizes)
    for bad in ("6", "0", "-8"):
        with pytest.raises(ValueError, match="multiple of 4"):
            hop.parse_sizes(bad)


def test_check_pattern_is_deterministic_nonzero_and_seeded():
    torch = pytest.importorskip("torch")
    a = hop._pattern(16, 1000, "cpu")
    assert a.dtype == torch.int32 and a.tolist() == [40515346, 547467460, 1054419574,
                                                      1561371688]
    assert torch.equal(a, hop._pattern(16, 1000, "cpu"))
    assert not torch.equal(a, hop._pattern(16, 1001, "cpu"))
    assert int(hop._pattern(1 << 20, 7, "cpu").min()) >= 1  # never zero: a dropped copy shows


def _t(us):
    return summarize([us * 0.9, us, us * 1.1])


def test_hop_entry_decomposes_the_hop():
    e = hop.hop_entry(8, 229376, 2, nccl=_t(60.0), transport=_t(20.0), sendrecv=_t(250.0),
                      gloo_meta=_t(100.0), gloo_send=_t(45.0), pickle_t=_t(4.0))
    assert e["hop_us"] == e["sendrecv_us"] == 250.0
    assert e["overhead_us"] == pytest.approx(90.0)  # 250 - 100 gloo - 60 torch send
    assert e["nccl_transport_us"] == 20.0 and e["nccl_busbw_gbps"] == pytest.approx(11.4688)
    assert e["nccl_bandwidth_gbps"] == pytest.approx(229376 / 60.0 / 1e3)
    assert (e["gloo_send_us"], e["pickle_us"]) == (45.0, 4.0)
    assert e["nccl_transport_p20_us"] == pytest.approx(18.8)  # numpy p20 of 18, 20, 22



def test_hop_results_are_checked_like_a_record():
    e = hop.hop_entry(8, 229376, 2, nccl=_t(60.0), transport=_t(20.0), sendrecv=_t(250.0),
                      gloo_meta=_t(100.0), gloo_send=_t(45.0), pickle_t=_t(4.0))
    tr = {"bytes": 8, "nccl_transport_us": 21.5, "nccl_transport_p20_us": 21.0,
          "nccl_transport_p80_us": 22.0, "nccl_busbw_gbps": 0.0004, "per_rank_us": [21.5, 20.9]}
    hops, transport = probe.hop_results({"hops": [{"src": 0, "dst": 1, **e}],
                                         "transport": [tr]})
    assert hops[0].hop_us == 250.0 and hops[0].overhead_us == pytest.approx(90.0)
    assert transport[0].per_rank_us == (21.5, 20.9)
    with pytest.raises(RuntimeError, match=r"hops.json: hops\[0\].batch: expected an integer"):
        probe.hop_results({"hops": [{"src": 0, "dst": 1, **e, "batch": "8"}]})


def test_hop_parts_and_transport_tables():
    def h(src, b, hop_us, nccl_us):
        return HopCost(src=src, dst=1 - src, batch=b, bytes=28672 * b, hop_us=hop_us,
                       gloo_meta_us=100.0, nccl_us=nccl_us, overhead_us=hop_us - 100 - nccl_us,
                       nccl_transport_us=20.0, nccl_busbw_gbps=1.43)
    empty = TopologyData(source="live", gpus=(), links={}, links_source="none", pipeline=(0, 1))
    data = replace(empty, hops=(h(0, 1, 300.0, 60.0), h(1, 1, 200.0, 80.0), h(0, 8, 250.0, 70.0)),
                   nccl_transport=(TransportPoint(bytes=8, nccl_transport_us=21.47,
                                                  nccl_busbw_gbps=0.0),
                                   TransportPoint(bytes=33554432, nccl_transport_us=136.88,
                                                  nccl_busbw_gbps=245.14)))
    parts = hop_parts_table(data).splitlines()
    # b=1: medians of the two hops: hop 250, torch send 70, rest 80
    row1 = next(r for r in parts if r.split()[:2] == ["1", "28672"]).split()
    assert row1[2:] == ["250.0", "100.0", "70.0", "80.0", "20.0", "1.4"]
    tt = transport_table(data)
    assert "over 2 GPUs" in tt and "136.88" in tt and "245.14" in tt
    assert hop_parts_table(empty) == "" and transport_table(empty) == ""


def test_run_time_projection_formula():
    # a 2-GPU run: 1 pair, 2 GPUs, 2 hops; to 8 GPUs: 28 pairs, 8 GPUs, 8 hops
    phases = {"start": 2.0, "host": 0.4, "pairs": 0.8, "ring": 0.1, "torchrun": 8.0,
              "sweep": 0.5, "hops": 0.6}
    assert probe.project_run_time_s(phases, 2, 8) == pytest.approx(
        2.0 + 0.1 + 8.0 + 0.5 + 0.4 * 4 + 0.8 * 28 + 0.6 * 4)
    assert probe.project_run_time_s(phases, 2, 2) == pytest.approx(sum(phases.values()))
    assert probe.project_run_time_s(phases, 1, 8) is None
    assert probe.project_run_time_s({}, 2, 8) is None
