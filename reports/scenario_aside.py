"""A report on the user's own server is about that server: the built-in scenario steps aside.

`ppscope report` without `--scenario` models the built-in scenario (seed-pp8) beside whatever
evidence results/ holds. Where that evidence is a traced server of another deployment
(`scenario_differs`: another pp, GPU or model), the scenario's sections describe a deployment
the user does not run. Then (`set_aside`):

- the report says so in `scenario_aside` (the scenario named, and why it is not the server),
  and the renderers move the scenario's sections (throughput per C, where the time goes, the
  what-ifs, stage cost, inputs, assumptions) below everything about the server, under
  `ASIDE_TITLE`;
- the banner speaks of the evidence the report rests on (`evidence_banner`), not of the
  scenario's estimates, and the answer's "In detail" no longer explains the scenario (its own
  section does);
- a hypothesis that no evidence of the server decides (its verdict was the scenario model's:
  routing skew of the scenario's MoE model, the scenario's hop share) reads "not enough
  evidence" with what to measure, instead of a verdict on another deployment.

With `--scenario` the user chose the scenario, and the report is as before.
"""
from __future__ import annotations

from dataclasses import replace

from reports.model.causes import UNKNOWN
from reports.model.report_type import Report
from reports.model.verdicts import Verdict

ASIDE_TITLE = "The built-in scenario (another deployment, not your server)"
# the evidence of the user's own server a verdict may rest on (reports/model/verdicts.py)
SERVER_EVIDENCE = ("sglang.json", "topology.json", "/metrics", "metrics")


def scenario_line(rep: Report) -> str:
    d = rep.deployment
    what = f"{d.model} on {d.pp}x {d.gpu}" if d is not None else "another deployment"
    return f"scenario {rep.scenario} ({what})"


def _server_verdict(v: Verdict) -> Verdict:
    """`v` where the server's evidence decides it; else not enough evidence, with what the
    scenario's own verdict lacked (its "no ..." clause) kept as what to measure."""
    if any(s in v.evidence for s in SERVER_EVIDENCE):
        return v
    missing = [c.strip() for c in v.number.split(";") if c.strip().startswith("no ")]
    number = "; ".join(["not measured on your server", *missing])
    return replace(v, verdict=UNKNOWN, number=number, evidence="none from your server",
                   at=tuple(replace(a, verdict=UNKNOWN, number=number) for a in v.at))


def set_aside(rep: Report) -> Report:
    """`rep` with the built-in scenario set aside (module docstring); unchanged where the
    scenario is the server's deployment or nothing says otherwise."""
    if not rep.scenario_differs:
        return rep
    return replace(rep, scenario_aside=(f"the built-in {scenario_line(rep)}: "
                                        f"{rep.scenario_differs}"),
                   verdicts=tuple(_server_verdict(v) for v in rep.verdicts),
                   server=_server_alone(rep.server))


def _server_alone(srv):
    """The "Your server" section without the scenario's modelled busy per rank (another
    deployment's figures beside the server's own) and the note that explained them."""
    if srv is None:
        return None
    return replace(srv, ranks=tuple(replace(r, modelled_busy_pct={}) for r in srv.ranks),
                   notes=tuple(n for n in srv.notes if "the scenario has pp=" not in n))


def evidence_banner(rep: Report) -> str:
    """What the report rests on, when the scenario is set aside."""
    parts = []
    dg = rep.diagnosed
    if dg is not None:
        parts.append(f"the traces of its {dg.deployment.pp} PP ranks at C={dg.concurrency}")
    srv = rep.server
    if srv is not None and srv.sources.log:
        parts.append(f"its log ({srv.sources.log})")
    if srv is not None and srv.bench:
        n = len(srv.bench)
        parts.append(f"{n} bench_serving run{'s' if n != 1 else ''}")
    if srv is not None and srv.sources.metrics:
        parts.append("its /metrics")
    other = [r for r in rep.records_used if r != "sglang.json" and not r.startswith("configs/")]
    said = ", ".join(parts) if parts else "what sglang.json holds"
    tail = f"; also {', '.join(other)}" if other else ""
    return (f"This report is about your server, from its own evidence in sglang.json: {said}"
            f"{tail}.")
