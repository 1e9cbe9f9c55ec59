"""The answer as a table (reports/render/answer_table.py), the herd drawn
(reports/render/timeline_plot.py) and the terminal's answer (reports/render/terminal.py), on the
built-in scenario and on a server's evidence (tests/fixtures/report). Expected values are read
from report.json or worked out from the model's own runs, never typed in."""
import json

import pytest

from reports.cli import main
from reports.model.scenario import loop_builder as lb
from reports.model.causes import HERD, HYPOTHESES
from reports.model.sim.pipeline_model import Span
from reports.model.report_type import Report
from reports.model.scenario.inputs import build_inputs, load_scenario
from reports.render.answer_table import (HEADERS, NOT_RUN, answer_sentences, answer_table,
                                         deciding_number)
from reports.render.timeline_plot import herd_caption, slots_text, window
from reports.report_run import herd_concurrency, model_run


@pytest.fixture(scope="module")
def seed_run():
    inp = build_inputs(load_scenario("seed-pp8"), {})
    return inp, model_run(inp, {}, use_cache=False)


def test_one_row_per_hypothesis_in_the_users_order(seed_run):
    _, run = seed_run
    rep = run.report
    t = answer_table(rep)
    assert t.headers == HEADERS
    assert [r[0] for r in t.rows] == [h for h in HYPOTHESES if
                                      any(v.hypothesis == h for v in rep.verdicts)]
    by = {v.hypothesis: v for v in rep.verdicts}
    for r in t.rows:
        v = by[r[0]]
        assert r[1] == v.verdict and r[2] == deciding_number(v)
    herd = next(r for r in t.rows if r[0] == HERD)
    held = [a.concurrency for a in by[HERD].at if a.verdict == "holds"]
    assert herd[3] == "C=" + ", ".join(map(str, held))
    rec = rep.recommendation          # the herd's fix is the recommended setting here
    best = max(rec.effects, key=lambda e: e.gain)
    assert herd[4] == (f"{rec.knob} {rec.setting}: {best.gain:+.0%} at C={best.concurrency} "
                       f"({NOT_RUN})")


def test_three_sentences_cause_recommendation_arrival(seed_run):
    _, run = seed_run
    rep = run.report
    s = answer_sentences(rep)
    assert len(s) == 3
    assert s[0].startswith("Biggest cause: ") and s[1].startswith(
        f"Recommended: {rep.recommendation.knob} {rep.recommendation.setting}")
    C = herd_concurrency(rep)[0]
    row = next(r for r in rep.arrival.by_concurrency if r.concurrency == C)
    assert f"{row.tok_per_s['trickle']:.1f}" in s[2] and f"{row.tok_per_s['burst']:.1f}" in s[2]


def test_herd_pair_is_the_models_own_runs(seed_run):
    inp, run = seed_run
    rep, pair = run.report, run.herd
    herd = next(v for v in rep.verdicts if v.hypothesis == HERD)
    top = max((a for a in herd.at if a.share is not None), key=lambda a: a.share)
    assert (pair.concurrency, pair.share) == (top.concurrency, top.share)
    C = pair.concurrency
    lvl = next(c for c in rep.concurrency if c.concurrency == C)
    assert pair.before.tok_per_s == pytest.approx(lvl.predicted)
    assert pair.before.slot_sizes == lvl.slot_sizes
    rec = rep.recommendation
    eff = next(e for e in rec.effects if e.concurrency == C)
    assert pair.after.tok_per_s == pytest.approx(eff.predicted_tok_per_s)
    st = rec.changes
    assert pair.after.spans == lb.run(inp, C, keep_spans=True, changes=st).spans
    assert {s.rank for s in pair.before.spans} == set(range(inp.pp))
    cap = herd_caption(pair, "src")
    assert f"{pair.before.tok_per_s:.1f} tok/s" in cap and f"{pair.after.tok_per_s:.1f} tok/s" in cap


def test_window_keeps_a_steady_stretch_shifted_and_clipped():
    # rank 0: 4 ms forwards every 10 ms for 100 ms; rank 1: 6 ms ones, 5 ms behind; a 20 ms
    # window from the middle: (101 - 20) / 2 = 40.5 ms -> the rank-0 forward at 40 ms
    spans = tuple(Span(r, 0, 1, (t + 5 * r) * 1e3, (t + 5 * r + 4 + 2 * r) * 1e3)
                  for t in range(0, 100, 10) for r in (0, 1))
    w = window(spans, 20.0)
    assert [(s.start_us, s.end_us) for s in w if s.rank == 0] == [(0.0, 4e3), (10e3, 14e3)]
    # 35-41 ms clipped to 40-41, 55-61 to 55-60
    assert [(s.start_us, s.end_us) for s in w if s.rank == 1] == \
        [(0.0, 1e3), (5e3, 11e3), (15e3, 20e3)]
    assert window((), 5.0) == () and window(spans, 0.0) == ()
    assert slots_text((8, 0, 0)) == "1 slot of 8" and slots_text((2, 2, 0, 2)) == "3 slots of 2"
    assert slots_text((3, 0, 1)) == "slots of 3 1"


@pytest.mark.parametrize("results", ["none", "fixture"])
def test_terminal_answer_fits_25_lines_at_100_columns(tmp_path, capsys, fixtures, results):
    src = fixtures / "report" if results == "fixture" else tmp_path / "none"
    src.mkdir(exist_ok=True)
    assert main(["report", "--results", str(src), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    rep = Report.from_json(json.loads((tmp_path / "report.json").read_text()))
    assert out[0].startswith("every ")     # what the figures rest on (names the folder)
    table = answer_table(rep)
    assert out[1].split() == " ".join(table.headers).split()
    answer = out[1:next(k for k, line in enumerate(out) if line.startswith("wrote "))]
    assert max(map(len, answer)) <= 100
    assert len(out) <= 25
    assert any(line.startswith("Recommended: ") for line in out)


def test_report_md_and_html_open_with_the_table_and_the_herd(tmp_path):
    (tmp_path / "none").mkdir()
    assert main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    assert md.index("## The answer") < md.index("| hypothesis") < md.index(
        "](report.herd.png)") < md.index("*The herd at C=") < md.index("### In detail") < \
        md.index("## Throughput")
    png = (tmp_path / "report.herd.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    a = html.index('<h2 id="answer"')
    assert a < html.index("<th>hypothesis</th>") < html.index('alt="The herd at C=') < \
        html.index("<h3>In detail</h3>") < html.index('<h2 id="throughput"')
    import base64
    assert base64.b64encode(png).decode() in html
