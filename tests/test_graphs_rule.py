from microbench.graphs.probe import GraphsConfig, graph_path, run
from reports.base.cuda_graphs import capture_sizes as sglang_capture_sizes, default_max_bs
from reports.base.records import read_record


def test_capture_sizes_rule():
    s = sglang_capture_sizes(256)
    assert s[:8] == [1, 2, 4, 8, 12, 16, 24, 32]
    assert s[-1] == 256 and len(s) == 5 + 31   # 16..256 step 8 = 31 sizes
    s512 = sglang_capture_sizes(512)
    assert s512[-3:] == [480, 496, 512] and 272 in s512 and 264 not in s512
    assert sglang_capture_sizes(640)[-4:] == [544, 576, 608, 640]
    # SGLang appends max_bs itself, and clamps to the request pool (max_running_requests)
    assert sglang_capture_sizes(10) == [1, 2, 4, 8, 10]
    assert sglang_capture_sizes(256, 100) == [1, 2, 4, 8, 12] + list(range(16, 97, 8)) + [100]


def test_padding_and_eager():
    assert graph_path(3, 256) == {"sglang_path": "graph", "padded_to": 4, "padding_waste": 0.25}
    assert graph_path(17, 256)["padded_to"] == 24
    assert graph_path(257, 256) == {"sglang_path": "eager", "padded_to": None,
                                    "padding_waste": 0.0}
    assert graph_path(300, 512)["padded_to"] == 304
    assert default_max_bs(141) == 256 and default_max_bs(96, tp=4) == 512
    assert default_max_bs(80) == 256 and default_max_bs(48) == 32 and default_max_bs(192) == 512
    assert default_max_bs(141, max_running_requests=64) == 64


def test_plan_record_flags_user_batches(tmp_path):
    out = tmp_path / "graphs.json"
    rec, note = run(GraphsConfig(plan=True, batches=(1, 5, 300), user_batches=(5, 300),
                                 max_bs=256, out=out))
    assert rec.status == "ok" and note is None and read_record(out).payload == rec.payload
    d = rec.payload
    assert d.stage_layers == (7, 7, 7, 8, 8, 8, 8, 8)
    assert d.off_graph_user_batches == (300,)
    assert [r.sglang_path for r in d.by_batch] == ["graph", "graph", "eager"]
    assert d.by_batch[1].padded_to == 8 and d.by_batch[1].padding_waste == 3 / 8
    assert all(r.eager_us is None for r in d.by_batch)     # the rule alone, nothing timed
    assert any("300 > max_bs 256" in f for f in d.flags)
    assert any("micro-batch 5 replays the graph for 8" in f for f in d.flags)
