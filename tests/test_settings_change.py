"""One settings-change vocabulary (reports/model/settings_change.py): a change is an SGLang flag
and a value applied to ServerSettings; both what-if sides list their candidates as such changes
and report one row type."""
import pytest

from reports.base.server_settings import ServerSettings
from reports.model.observed import bench_run as ow
from reports.model.observed import whatifs as sw
from reports.model.settings_change import (KNOBS, OTHER_KNOBS, SERVER_FLAGS, Change, apply,
                                           check)


def test_a_change_sets_the_server_setting_under_sglang_name():
    s = ServerSettings(pp_size=2, max_running_requests=2048, chunked_prefill_size=8192)
    t = apply(s, (Change("--pp-async-batch-depth", 2), Change("--chunked-prefill-size", 512)))
    assert (t.pp_async_batch_depth, t.chunked_prefill_size, t.slots) == (2, 512, 4)
    # rows move SGLang's default cap with them (rows // pp); an explicit cap stays
    assert apply(s, (Change("--max-running-requests", 8),)).max_micro_batch == 4
    capped = apply(s, (Change("--pp-max-micro-batch-size", 3),))
    assert apply(capped, (Change("--max-running-requests", 8),)).max_micro_batch == 3
    # knobs that are not server settings leave the settings alone
    assert apply(s, (Change("SGLANG_PP_LAYER_PARTITION", "30,31"),)) == s


def test_the_knob_lists_are_one_list_with_the_server_flags_apart():
    assert set(SERVER_FLAGS) | set(OTHER_KNOBS) == set(KNOBS)
    assert not set(SERVER_FLAGS) & set(OTHER_KNOBS)
    assert all(hasattr(ServerSettings(1), f) for f in SERVER_FLAGS.values())
    with pytest.raises(ValueError, match="unknown setting"):
        check(Change("--tp-size", 2))


def test_the_observed_side_speaks_the_same_vocabulary():
    server = ow.observed_settings(pp=2, depth=0, rows=2048, chunk=8192)
    assert isinstance(server, ServerSettings)
    load = ow.Load(concurrency=8, prompts=18, output_len=128, prompt_len=64)
    run = ow.Run(100.0, 18.0, 8.0, (7, 1), 10)
    for cand in sw.candidates(server, load, run):
        assert cand.knob in KNOBS and len(cand.changes) == 1
        after, _ = ow.apply(server, load, cand.changes[0])
        if cand.changes[0].server:
            assert after == apply(server, cand.changes)
