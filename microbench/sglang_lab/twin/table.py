"""The twin's tables (`ppscope twin`, docs/BENCHMARKS.md): per setting and concurrency, the
twin's TPOT and decode tok/s (undilated) beside the model's and the user's, with the
micro-batches SGLang formed, the model of that very run (its logged admission and prefill
included: reports/model/scenario/bench_transient.py) beside bench_serving's TPOT, and the model's
steady loop beside the twin's steady decode (SGLang's log, microbench/sglang_lab/twin/steady.py);
then each setting's change against the default, predicted by the model and measured on the twin
(the steady decode's change is the one the model's figure predicts). With
repetitions: a spread table (median TPOT and range per setting and C), and each change set
against the default's run of the same repetition, as a median with its range."""
from __future__ import annotations

import statistics

from tabulate import tabulate

from reports.base.payloads.twin import TwinData, TwinRow


def _pct(a: float, b: float) -> str:
    return f"{a / b - 1:+.0%}" if a and b else "-"


def render(data: TwinData) -> str:
    cal = data.calibration
    head = (f"twin of {data.scenario} (PP{data.pp}) on SGLang's own scheduler; every forward, "
            f"hop and host visit emulated x k = {cal.k if cal else 0:g}, figures divided by k")
    if cal is not None and cal.host_share is not None:
        head += (f"; calibration: this machine's own step {cal.host_tpot_ms:.0f} ms at C=1, "
                 f"{cal.host_share:.0%} of the emulated step")
    head += (f"\nprompts of {data.prompt_len} tokens, {data.output_len} output tokens; "
             "twin TPOT: bench_serving's median (prefills of later prompts included), beside the "
             "model of that run; twin steady: one decode round with every request decoding "
             "(SGLang's log), beside the model's steady loop; tok/s = C / TPOT; SGLang admitted: "
             "its log's Prefill batch #new-seq")
    observed = dict(data.observed)
    reps = any(r.rep > 1 for r in data.rows)
    rows = []
    for r in data.rows:
        C = r.concurrency
        run, steady = r.run_model_tpot_ms, r.twin_steady_tpot_ms
        rows.append([r.setting] + ([r.rep] if reps else []) + [
                     C, f"{r.twin_tpot_ms:.1f}",
                     f"{run:.1f} ({_pct(run, r.twin_tpot_ms)})" if run else "-",
                     f"{steady:.1f}" if steady else "-", f"{r.model_tpot_ms:.1f}",
                     _pct(r.model_tpot_ms, steady) if steady else "-",
                     f"{r.twin_decode_tok_per_s:.1f}", f"{r.model_tok_per_s:.1f}",
                     f"{observed[C]:.1f}" if r.setting == "default" and C in observed else "-",
                     " ".join(map(str, r.waves)) or "-",
                     " ".join(map(str, r.model_slots))])
    t1 = tabulate(rows, headers=["setting"] + (["run"] if reps else []) + [
                                 "C", "twin TPOT ms", "model of the run",
                                 "twin steady ms", "model ms", "model vs steady",
                                 "twin tok/s", "model tok/s", "observed tok/s",
                                 "SGLang admitted", "model micro-batches"],
                  disable_numparse=True)
    out = head + "\n\n" + t1
    if reps:
        out += "\n\n" + _spread_table(data.rows)
    wi = _what_if_rows(data)
    if wi:
        out += "\n\n" + tabulate(wi, headers=["what-if", "flag", "C", "model: tok/s change",
                                              "twin: steady decode change",
                                              "twin: decode tok/s change (bench TPOT)",
                                              "twin: bench output tok/s change"],
                                   disable_numparse=True)
    return out


def _groups(rows: tuple[TwinRow, ...]) -> dict:
    """(setting, C) -> that setting's runs at C, in run order."""
    out: dict = {}
    for r in rows:
        out.setdefault((r.setting, r.concurrency), []).append(r)
    return out


def _spread_table(rows: tuple[TwinRow, ...]) -> str:
    """Per setting and C over the repetitions: the median TPOT and its range, the model's."""
    t = []
    for (name, C), got in _groups(rows).items():
        tp = [r.twin_tpot_ms for r in got]
        t.append([name, C, len(got), f"{statistics.median(tp):.1f}",
                  f"{min(tp):.1f}-{max(tp):.1f}", f"{(max(tp) - min(tp)) / statistics.median(tp):.0%}",
                  f"{got[0].model_tpot_ms:.1f}"])
    return tabulate(t, headers=["setting", "C", "runs", "twin TPOT ms (median)", "range",
                                "spread", "model TPOT ms"], disable_numparse=True)


def _what_if_rows(data: TwinData) -> list[list]:
    """Each setting's change against the default's run of the same repetition (as the report
    reads a record, `TwinData.with_default`): the median over the repetitions and, with more
    than one, the range."""
    by: dict = {}
    for r, b in data.with_default():
        by.setdefault((r.setting, r.concurrency), []).append((r, b))
    out = []
    for (name, C), pairs in by.items():
        r0, b0 = pairs[0]

        def change(key):
            v = [getattr(r, key) / getattr(b, key) - 1 for r, b in pairs
                 if getattr(r, key) and getattr(b, key)]
            if not v:
                return "-"
            mid = f"{statistics.median(v):+.0%}"
            return mid if len(v) == 1 else f"{mid} ({min(v):+.0%} to {max(v):+.0%})"
        out.append([name, _changed(r0.flags, b0.flags), C,
                    _pct(r0.model_tok_per_s, b0.model_tok_per_s),
                    change("steady_decode_tok_per_s"),
                    change("twin_decode_tok_per_s"), change("twin_output_tok_per_s")])
    return out


def _changed(flags: tuple[str, ...], base: tuple[str, ...]) -> str:
    """The flags a setting changes against the default's, as SGLang flags."""
    b = dict(zip(base[::2], base[1::2]))
    return " ".join(f"{f} {v}" for f, v in zip(flags[::2], flags[1::2]) if b.get(f) != v) or "-"
