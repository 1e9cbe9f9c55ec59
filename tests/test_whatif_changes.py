"""A what-if row carries the settings changes it applied (`WhatIf.changes`), not only the
strings it is shown by: one candidate's changes, both of a pair's, none for TP instead of PP;
they survive report.json, and a report written before they were kept still reads."""
from __future__ import annotations

import json

import pytest

from reports.base.schema import from_json, to_json
from reports.model.report_type import Report
from reports.model.scenario import loop_builder as lb
from reports.model.scenario import whatifs as wi
from reports.model.scenario.inputs import build_inputs, load_scenario
from reports.model.settings_change import TP_KNOB, Change, WhatIf, effect


@pytest.fixture(scope="module")
def scenario():
    inp = build_inputs(load_scenario("seed-pp8"), {})
    return inp, wi.what_ifs(inp)


def test_each_scenario_row_carries_its_candidates_changes(scenario):
    inp, rows = scenario
    by_shown = {(c.knob, c.shown): c.changes for c in wi.candidates(inp)}
    for w in rows:
        assert w.changes == (() if w.knob == TP_KNOB else by_shown[w.knob, w.setting])
    # the figures are the model run on those very changes
    w = next(w for w in rows if w.knob != TP_KNOB)
    e = w.effects[0]
    assert lb.run(inp, e.concurrency, changes=w.changes).tok_per_s == e.predicted_tok_per_s


def test_the_best_pair_carries_both_settings(scenario):
    inp, rows = scenario
    pair = wi.best_pair(inp, rows)
    assert pair is not None
    assert pair.knob == " + ".join(c.flag for c in pair.changes)
    assert pair.setting == " + ".join(str(c.value) for c in pair.changes)
    singles = {w.changes for w in rows}
    assert pair.changes[:1] in singles and pair.changes[1:] in singles


def _row(**kw) -> WhatIf:
    return WhatIf("--pp-async-batch-depth", "2", (effect(8, 100.0, 110.0),), None, 0.1, 0.1,
                  True, **kw)


def test_changes_survive_report_json_and_an_older_row_reads_without_them():
    w = _row(changes=(Change("--pp-async-batch-depth", 2),))
    back = from_json(WhatIf, json.loads(json.dumps(to_json(w))))
    assert back == w and isinstance(back.changes[0].value, int)
    old = to_json(_row())
    del old["changes"]
    assert from_json(WhatIf, old, lax=True).changes == ()


def test_a_report_written_before_rows_carried_changes_still_reads(scenario):
    from reports.report_run import model_run
    rep = model_run(scenario[0], {}, use_cache=False).report
    d = json.loads(json.dumps(to_json(rep)))
    assert Report.from_json(d).what_ifs == rep.what_ifs
    assert any(w.changes for w in rep.what_ifs)
    for w in d["what_ifs"] + [d["recommendation"], d["best_pair"]]:
        del w["changes"]
    old = Report.from_json(d)
    assert [(w.knob, w.setting, w.gain) for w in old.what_ifs] == \
        [(w.knob, w.setting, w.gain) for w in rep.what_ifs]
    assert all(w.changes == () for w in (*old.what_ifs, old.recommendation, old.best_pair))
