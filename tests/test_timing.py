import pytest

from microbench.kit.timing import summarize


def test_summary_statistics_exact():
    t = summarize([5.0, 1.0, 4.0, 2.0, 3.0])
    # numpy linear interpolation over sorted [1,2,3,4,5]: p20 = 1.8, p50 = 3, p80 = 4.2
    assert t.median_us == 3.0
    assert t.p20_us == pytest.approx(1.8)
    assert t.p80_us == pytest.approx(4.2)
    assert (t.min_us, t.max_us, t.n) == (1.0, 5.0, 5)
    assert t.samples_us == (5.0, 1.0, 4.0, 2.0, 3.0)  # raw order kept


def test_scaled_divides_every_statistic():
    t = summarize([10.0, 20.0, 30.0]).scaled(10)
    assert (t.min_us, t.median_us, t.max_us) == (1.0, 2.0, 3.0)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_rejects_empty_and_nonfinite(bad):
    with pytest.raises(ValueError):
        summarize(bad)


def test_timing_module_imports_without_cuda():
    import subprocess, sys
    code = "import sys, microbench.kit.timing; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_graph_copies_only_when_a_call_outruns_the_l2_cache():
    from microbench.kit.timing import GRAPH_COPIES, graph_copies

    l2 = 50 * 2 ** 20
    assert graph_copies(2 * l2, l2) == GRAPH_COPIES > 1
    assert graph_copies(2 * l2 - 1, l2) == 1        # a call could find the last one's bytes
    assert graph_copies(10 ** 12, 0) == 1           # L2 size unknown: one call per graph
