"""The twin's tables (`ppscope twin`, docs/BENCHMARKS.md): per setting and concurrency, the
twin's TPOT and decode tok/s (undilated) beside the model's and the user's, with the
micro-batches SGLang formed, and the model of that very run (its logged admission, prefill and
the warm-up prompt's cache hit included: reports/model/sim/bench_transient.py); then each
setting's change against the default, predicted by the model and measured on the twin."""
from __future__ import annotations

from tabulate import tabulate


def _pct(a: float, b: float) -> str:
    return f"{a / b - 1:+.0%}" if a and b else "-"


def render(data: dict) -> str:
    cal = data.get("calibration") or {}
    head = (f"twin of {data['scenario']} (PP{data['pp']}) on SGLang's own scheduler; every forward, "
            f"hop and host visit emulated x k = {cal.get('k', 0):g}, figures divided by k")
    if "host_share" in cal:
        head += (f"; calibration: this machine's own step {cal['host_tpot_ms']:.0f} ms at C=1, "
                 f"{cal['host_share']:.0%} of the emulated step")
    head += (f"\nprompts of {data['prompt_len']} tokens, {data['output_len']} output tokens "
             "(decode TPOT compared; decode tok/s = C / TPOT)")
    observed = {int(c): v for c, v in data.get("observed") or []}
    rows = []
    for r in data["rows"]:
        C = r["concurrency"]
        run = r.get("run_model_tpot_ms")
        rows.append([r["setting"], C, f"{r['twin_tpot_ms']:.1f}", f"{r['model_tpot_ms']:.1f}",
                     _pct(r["model_tpot_ms"], r["twin_tpot_ms"]),
                     f"{run:.1f} ({_pct(run, r['twin_tpot_ms'])})" if run else "-",
                     f"{r['twin_decode_tok_per_s']:.1f}", f"{r['model_tok_per_s']:.1f}",
                     f"{observed[C]:.1f}" if r["setting"] == "default" and C in observed else "-",
                     " ".join(map(str, r["waves"])) or "-",
                     " ".join(map(str, r["model_slots"]))])
    t1 = tabulate(rows, headers=["setting", "C", "twin TPOT ms", "model TPOT ms", "model vs twin",
                                 "model of this run ms",
                                 "twin tok/s", "model tok/s", "observed tok/s",
                                 "SGLang admitted (#new-seq)", "model micro-batches"])
    base = {r["concurrency"]: r for r in data["rows"] if r["setting"] == "default"}
    wi = []
    for r in data["rows"]:
        b = base.get(r["concurrency"])
        if r["setting"] == "default" or b is None:
            continue
        wi.append([r["setting"], " ".join(r["flags"][-2:]), r["concurrency"],
                   _pct(r["model_tok_per_s"], b["model_tok_per_s"]),
                   _pct(r["twin_decode_tok_per_s"], b["twin_decode_tok_per_s"]),
                   _pct(r["twin_output_tok_per_s"], b["twin_output_tok_per_s"])])
    out = head + "\n\n" + t1
    if wi:
        out += "\n\n" + tabulate(wi, headers=["what-if", "flag", "C", "model: tok/s change",
                                              "twin: decode tok/s change",
                                              "twin: bench output tok/s change"])
    return out
