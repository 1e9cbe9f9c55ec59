"""SGLang's server settings in one type, the scenario file read once, the rank configuration's
wire form: the derivations, the one-line errors, the old scenario names still read."""
from __future__ import annotations

import json

import pytest

from microbench.dispatch import probe as D
from microbench.dispatch.rank_config import RankConfig
from reports.base.errors import CliError
from reports.base.server_settings import ServerSettings, default_max_micro_batch, slot_count
from reports.base.slots import SlotConfig
from reports.model.scenario.inputs import build_inputs
from reports.model.scenario.file import load_scenario, read_scenario


def test_slots_and_default_cap_are_sglangs():
    s = ServerSettings(8, 8, max_running_requests=2048)
    assert s.slots == slot_count(8, 8) == 16
    assert s.max_micro_batch == default_max_micro_batch(2048, 8) == 256   # // pp, not // slots
    assert s.max_micro_batch_upper == 256
    assert ServerSettings(8, 8, 2048, pp_max_micro_batch_size=3).max_micro_batch == 3
    assert ServerSettings(2).max_micro_batch is None            # no rows known, no cap
    assert ServerSettings(2, chunked_prefill_size=-1).chunk_budget is None
    cfg = SlotConfig.of(ServerSettings(2, 2, 64, chunked_prefill_size=4096))
    assert cfg == SlotConfig(2, 2, 32, 64, 4096) and cfg.slots == 4


@pytest.mark.parametrize("kw, field", [
    ({"pp_size": 0}, "pp_size"), ({"pp_size": 2, "pp_async_batch_depth": -1},
                                  "pp_async_batch_depth"),
    ({"pp_size": 2, "max_running_requests": 0}, "max_running_requests"),
    ({"pp_size": 2, "pp_max_micro_batch_size": 0}, "pp_max_micro_batch_size")])
def test_impossible_settings_are_one_line_errors(kw, field):
    with pytest.raises(ValueError, match=f"^{field} must be >= ") as e:
        ServerSettings(**kw)
    assert "\n" not in str(e.value)


def test_the_scenario_reads_the_old_context_names(tmp_path):
    new = load_scenario("seed-pp8")
    assert new.mean_context_tokens == 1500 and new.max_context_length is None
    d = json.loads(json.dumps(dict(new)))   # the file form, new names
    d["context_len"] = d.pop("mean_context_tokens")
    d["context_length"] = 32768
    old = read_scenario(d)
    assert old.mean_context_tokens == 1500 and old.max_context_length == 32768
    inp = build_inputs(new, {})
    assert inp.context_len == inp.mean_context_tokens == 1500
    assert inp.slots == inp.server.slots == 16 and inp.max_micro_batch == inp.server.max_micro_batch
    d["mean_context_tokens"] = 1000
    with pytest.raises(CliError, match="name the same quantity"):
        read_scenario(d)


def test_the_scenario_file_form_reads_back_the_same():
    sc = load_scenario("seed-pp8")
    assert read_scenario(dict(sc)) == sc


def test_rank_config_wire_form_round_trips():
    rc = D.rank_config_of(D.DispatchConfig(pp=4, max_running_requests=64, concurrency=(1, 8)))
    assert rc.server.slots == 8 and rc.max_micro_batch == 16
    wire = json.loads(json.dumps(rc.to_wire()))
    assert RankConfig.from_wire(wire) == rc and wire == D.loop_config(
        D.DispatchConfig(pp=4, max_running_requests=64, concurrency=(1, 8)))
