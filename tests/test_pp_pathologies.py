"""PP pathologies that SGLang's issues report, timed from the per-rank traces
(microbench/sglang/cpu_steps.py `pathologies`), on the lab's PP2 CPU recording of SGLang 0.5.23
(tests/fixtures/sglang_lab/clean-c8/traces) and on hand-made loop profiles."""
from __future__ import annotations

from pathlib import Path

import pytest

from microbench.sglang import steps, trace
from microbench.sglang.cpu_steps import pathologies

LAB = Path(__file__).parent / "fixtures" / "sglang_lab" / "clean-c8" / "traces"


@pytest.fixture(scope="module")
def loop():
    files = trace.find_traces(str(LAB))
    paths = {int(trace._NAME_RE.search(p.name).group("pp")): p for p in files}
    return steps.read_loop(paths, no_gpu_events=True)


def test_per_tensor_receives_and_metadata_chains_are_timed(loop):
    """#19582: rank 1 receives its input as separate tensors, waited one at a time (SGLang's
    recv_tensor_dict); #18715: the metadata objects each iteration exchanges."""
    r1 = loop.ranks["1"]
    assert r1.input_recvs_per_forward == pytest.approx(4.0)
    assert r1.input_wait_per_recv_us_mean > 0
    assert r1.metadata_recvs_per_iteration >= 1
    lines = loop.pathologies
    assert any("one tensor at a time" in x and "#19582" in x and "4.0 receives" in x
               for x in lines), lines
    assert any(x.startswith("rank 0's CPU metadata") and "#18715" in x for x in lines), lines


def _profile(hop_us: float, fwd_us: float) -> dict:
    return {"ranks": {"0": {"forward_us_p50": fwd_us}, "1": {"forward_us_p50": fwd_us}},
            "hops": {"1->0": {"mean_us": hop_us}, "0->1": {"mean_us": 100.0}}}


def test_a_token_return_longer_than_the_forward_is_named():
    """#10865: with decode graphs the last rank's token send back to rank 0 took ~100 ms
    against ~3 ms without."""
    lines = pathologies(_profile(hop_us=100e3, fwd_us=3e3))
    assert lines == ["token return 1->0 takes 100.00 ms, longer than the slowest decode forward "
                     "(3.00 ms): rank 0 waits on the last rank's outputs (sgl-project/sglang#10865)"]
    assert pathologies(_profile(hop_us=1e3, fwd_us=3e3)) == []


def test_the_lab_token_return_is_not_named(loop):
    # the lab's CPU forwards (ms) are longer than its 1->0 hop
    assert not any("#10865" in x for x in loop.pathologies)
