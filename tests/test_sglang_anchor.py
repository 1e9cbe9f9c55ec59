"""microbench/stage_cost/sglang_anchor.py without SGLang or a GPU: SGLang's split cap as integers, and the
command's one-line errors (exit 2) where it cannot run."""
from __future__ import annotations

import sys

import pytest

from microbench.stage_cost import sglang_anchor as A


@pytest.mark.parametrize("sms, ctx, want", [
    (132, 262144, 256),     # H200, Kimi K2's 256K context: the SM count, to a power of two
    (188, 131072, 256),     # RTX PRO 6000 (188 SMs)
    (132, 2048, 64),        # a 2048-token server: 64 blocks of 32 rows
    (132, 100, 8),          # 4 blocks: the base of 8 splits wins
    (16, 262144, 16),
    (0, 262144, 8),         # no SM count: the base
])
def test_split_cap_follows_sglang_rule(sms, ctx, want):
    assert A.max_kv_splits(sms, ctx) == want


def test_split_cap_base_is_the_server_flag():
    assert A.max_kv_splits(132, 100, base=16) == 16
    assert A.max_kv_splits(132, 262144, base=512) == 512


def _hide_sglang(monkeypatch):
    """Make `import sglang...` fail, also where an earlier test imported it."""
    for name in [n for n in sys.modules if n.startswith(("sglang.", "sgl_kernel"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "sglang", None)
    monkeypatch.setitem(sys.modules, "sgl_kernel", None)


def _main(capsys, argv):
    rc = A.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err


def test_not_an_mla_model(capsys):
    rc, err = _main(capsys, ["--model", "llama-3-70b"])
    assert rc == 2 and len(err) == 1 and "no MLA attention" in err[0]


def test_unknown_model(capsys):
    rc, err = _main(capsys, ["--model", "no-such-model"])
    assert rc == 2 and len(err) == 1 and "no-such-model" in err[0]


def test_context_too_short(capsys):
    rc, err = _main(capsys, ["--context-len", "1"])
    assert rc == 2 and "--context-len" in err[0]


def test_bad_batches_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        A.main(["--batches", "0,8"])
    assert e.value.code == 2
    assert "positive integers" in capsys.readouterr().err


def test_without_gpu_or_sglang_a_waived_record_never_over_a_good_one(capsys, monkeypatch,
                                                                     tmp_path):
    torch = pytest.importorskip("torch")
    from reports.base.records import make_record, read_record, save_record
    _hide_sglang(monkeypatch)
    out = tmp_path / "sglang_anchor.json"
    rc, err = _main(capsys, ["--json", str(out)])
    assert rc == 2 and len(err) == 1
    why = "does not import" if torch.cuda.is_available() else "needs a CUDA GPU"
    assert why in err[0] and "waived record" in err[0]
    rec = read_record(out)
    assert rec.probe == "sglang_anchor" and rec.status == "waived" and why in rec.reason
    # a good record stays; the waived one goes beside it
    save_record(make_record("sglang_anchor", {"rows": [{"b": 1}]}), out)
    rc, err = _main(capsys, ["--json", str(out)])
    assert rc == 2 and read_record(out).status == "ok"
    assert read_record(tmp_path / "sglang_anchor.waived.json").status == "waived"


def test_sglang_missing_is_a_reason_not_an_error(monkeypatch):
    _hide_sglang(monkeypatch)
    why = A.sglang_kernels()
    assert isinstance(why, str) and "does not import" in why


def test_help_names_the_kernel_and_the_floor(capsys):
    with pytest.raises(SystemExit) as e:
        A.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "decode_attention_fwd" in out and "Floor" in out


def test_forced_split_count_is_checked_and_recorded():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    q_lat, q_rope = torch.zeros(4, 2, 16), torch.zeros(2, 4, 8)
    with pytest.raises(ValueError, match="outside 1..8"):
        A.sglang_attention(None, None, q_lat, q_rope, 40, 0.1, cap=8, sms=4, fixed=9)
    # a forced count never asks SGLang's scheduler rule (None here would fail if called)
    call = A.sglang_attention(None, None, q_lat, q_rope, 40, 0.1, cap=8, sms=4, fixed=3)
    assert call.splits == [3]
