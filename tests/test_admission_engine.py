"""One admission engine (reports/base/slots.py `run_loop`), held against SGLang.

- The lab's logs (tests/fixtures/sglang_lab/, SGLang 0.5.23's PP2 CPU server at
  `--decode-log-interval 1`): bench_serving's first burst replayed as the log admitted it, the
  engine gives back the groups the log decodes in the next generation and the last prompts'
  `Prefill batch` line (`#new-seq`, `#running-req`).
- SGLang's own `get_num_allocatable_reqs` (tier `sglang`, as tests/test_sglang_oracle.py) and the
  source lines the chunking and the successor rule mirror.
- No second admission implementation: no module but slots.py compares a per-slot cap and a
  prefill budget inside one loop.
"""
from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import pytest

from reports.base.slots import REISSUE_VISITS, SlotConfig, Successor, Wave, admit, run_loop
from reports.model.observed.bursts import wave_visits

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "tests" / "fixtures" / "sglang_lab"
_LINE = re.compile(r"\[[^]]* PP0\] (Prefill|Decode) batch, (?:#new-seq: (\d+), .*?)?"
                   r"#running-req: (\d+)")


def _pp0(log: Path) -> list[tuple[str, int, int]]:
    """Rank 0's batch lines in order: ("P", #new-seq, #running-req) or ("D", 0, #running-req)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _LINE.search(line)
        if m:
            out.append((m.group(1)[0], int(m.group(2) or 0), int(m.group(3))))
    return out


def _bench_prefills(lines) -> list[list[tuple[int, int]]]:
    """The prefill lines of each burst: runs of prefill lines with no decode line between."""
    runs, cur = [], []
    for kind, n, r in lines:
        if kind == "P":
            cur.append((n, r))
        elif cur:
            runs.append(cur)
            cur = []
    return runs + ([cur] if cur else [])


# (case, depth, prompts): bench_serving's 2C + 2 prompts of 64 tokens, 128 out, depth 0
CASES = [("bursts/wr-base-c16.1", 16, 34), ("whatif/wl-base-c16.1", 16, 34),
         ("whatif/wl-base-c8.1", 8, 18)]


def _replayed(case: str, C: int, prompts: int):
    lines = _pp0(LAB / case / "server.log")
    first = next(w for w in _bench_prefills(lines) if sum(n for n, _ in w) == C)
    cfg = SlotConfig(2, 0, 1024, None, 4096)
    visits = wave_visits(first, cfg.slots)
    run = run_loop(cfg, [Wave(n, v) for (n, _), v in zip(first, visits)], Successor(prompts),
                   prompt_len=64, output_len=lambda: 128)
    return lines, first, run


@pytest.mark.parametrize("case,C,prompts", CASES)
def test_the_engine_keeps_the_groups_the_log_decodes(case, C, prompts):
    lines, first, run = _replayed(case, C, prompts)
    assert run.prefills[:len(first)] == tuple(first)      # the burst as the log admitted it
    # the groups of the first generation, and of the second after its successors arrived:
    # SGLang's decode lines show the same two groups again (successors together), never
    # merged into one slot
    decoded = {r for k, _, r in lines if k == "D"}
    groups = sorted(n for n in _groups(first) if n)
    assert set(groups) <= decoded and C not in decoded
    gen = {tuple(sorted(s for s in snap if s)) for snap in run.series if sum(snap) == C}
    assert gen == {tuple(groups)}


def _groups(waves) -> list[int]:
    sizes = [0, 0]
    for (n, _), v in zip(waves, wave_visits(waves, 2)):
        sizes[v % 2] += n
    return sizes


@pytest.mark.parametrize("case,C,prompts", CASES)
def test_the_last_prompts_join_an_emptied_slot_as_logged(case, C, prompts):
    # bench_serving's last 2 prompts, successors of the group that finished first: the log's
    # last prefill admits both into an empty slot (#running-req 0), after the other group's
    # last decode: they reached the scheduler REISSUE_VISITS visits after rank 0 processed
    # the finished tokens, not at the next visit (where the other group still ran)
    lines, _, run = _replayed(case, C, prompts)
    last = [(n, r) for k, n, r in lines if k == "P"]
    assert (2, 0) in last and run.prefills[-1] == (2, 0)


def test_successors_arrive_reissue_visits_after_the_processing():
    # 2 slots, a visit lasting 1, prompts of 3 tokens out: prefill at visit 0 (first token),
    # decodes at visits 2 and 4; rank 0 processes the last one at 4 + S - 1 = 5, the next
    # prompt is admitted at 5 + 2 = 7 (slot 1), decodes at 9 and 11, processed at 12
    cfg = SlotConfig(2, 0, 8)
    run = run_loop(cfg, [Wave(1)], Successor(2), round_us=lambda sizes: 2.0,
                   output_len=lambda: 3)
    assert REISSUE_VISITS == 2
    assert run.prefills == ((1, 0), (1, 0))
    assert run.end_us == pytest.approx(13.0)     # the end of visit 12


def test_a_prompt_over_the_budget_is_chunked_across_visits():
    # PrefillAdder, budget 100: visit 0 prefills the first 60-token prompt and the second's
    # first 40 tokens (chunked); visit 1 (slot 1) its last 20 and the third whole, and the
    # chunked prompt joins slot 1, the slot of its last chunk. Whole prompts only would
    # prefill one per visit (1, 1, 1)
    cfg = SlotConfig(2, 0, 8, None, 100)
    run = run_loop(cfg, [Wave(3)], Successor(3), prompt_len=60, output_len=lambda: 2)
    assert run.prefills == ((2, 0), (2, 0))
    assert run.series[0] == (1, 2)


# ---- SGLang's own code (tier `sglang`) ----

def _src(rel: str) -> Path:
    import importlib.util
    return Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / rel


def _function(rel: str, name: str, glb: dict):
    tree = ast.parse(_src(rel).read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    ns = dict(glb)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(_src(rel)), "exec"), ns)
    return ns[name]


@pytest.mark.sglang
@pytest.mark.parametrize("cap,rows,sizes,slot", [
    (4, None, (0, 0, 0, 0), 0), (4, None, (3, 0, 0, 0), 0), (4, None, (4, 0, 0, 0), 0),
    (4, 6, (3, 0, 0, 0), 1), (4, 6, (4, 2, 0, 0), 2), (16, 20, (5, 5, 5, 0), 3),
    (256, 2048, (0,) * 16, 7)])
def test_the_per_slot_limit_is_get_num_allocatable_reqs(cap, rows, sizes, slot):
    pytest.importorskip("sglang")
    from typing import Optional
    par = types.SimpleNamespace(pp_max_micro_batch_size=cap)
    fn = _function("srt/managers/scheduler.py", "get_num_allocatable_reqs",
                   {"get_parallel": lambda: par, "Optional": Optional, "ScheduleBatch": object})
    free = (rows - sum(sizes)) if rows else 1 << 20
    me = types.SimpleNamespace(
        running_batch=None,
        req_to_token_pool=types.SimpleNamespace(available_size=lambda: free),
        beam_coordinator=types.SimpleNamespace(pending_member_rows=lambda b: 0))
    cfg = SlotConfig(len(sizes) // 2, len(sizes) - len(sizes) // 2, cap, rows)
    theirs = max(0, fn(me, sizes[slot]))
    assert admit(1 << 16, sizes, slot, cfg) == theirs


@pytest.mark.sglang
def test_the_chunking_and_the_successor_rule_are_sglangs_lines():
    pytest.importorskip("sglang")
    policy = _src("srt/managers/schedule_policy.py").read_text()
    sched = _src("srt/managers/scheduler.py").read_text()
    loop = _src("srt/managers/scheduler_pp_mixin.py").read_text()
    # PrefillAdder truncates a prompt over the rest of the budget to whole pages and keeps
    # it as the one chunked request, which the scheduler (not a slot) holds and continues
    assert "extend_len = chunk_tokens_limit // self.page_size * self.page_size" in policy
    assert "self.new_chunked_req = req" in policy
    assert "self.chunked_req = adder.add_chunked_req(self.chunked_req)" in sched
    # event_loop_pp: rank 0 processes slot k+1's result last in its visit of slot k; the next
    # visit's ingest_requests follows at once (no request can have come back in between)
    body = loop[loop.index("def event_loop_pp(self"):loop.index("def event_loop_pp_disagg")]
    assert "next_mb_id = (mb_id + 1) % self.pp_loop_size" in body
    tail = body[body.index("self._pp_process_batch_result("):]
    assert "ingest_requests" not in tail and "recv_requests" not in tail


# ---- one engine ----

CAP = {"cap", "cap_now", "max_micro_batch", "pp_max_micro_batch_size"}
BUDGET = {"budget", "chunk_budget", "chunked_prefill_size", "max_prefill_tokens", "rem_chunk"}


def _names(node) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _admission_loops(path: Path) -> list[int]:
    """Lines of loops that compare a per-slot cap and a prefill budget: an admission rule."""
    hits = []
    for loop in ast.walk(ast.parse(path.read_text())):
        if not isinstance(loop, (ast.For, ast.While)):
            continue
        compared = set()
        for n in ast.walk(loop):
            if isinstance(n, ast.Compare) or (isinstance(n, ast.Call) and isinstance(
                    n.func, ast.Name) and n.func.id in ("min", "max")):
                compared |= _names(n)
        if compared & CAP and compared & BUDGET:
            hits.append(loop.lineno)
    return hits


def test_no_second_admission_implementation():
    slots = ROOT / "reports" / "base" / "slots.py"
    assert _admission_loops(slots)     # the scan sees the one engine
    others = {}
    for top in ("reports", "microbench", "topology"):
        for p in sorted((ROOT / top).rglob("*.py")):
            if p != slots and (lines := _admission_loops(p)):
                others[str(p.relative_to(ROOT))] = lines
    assert not others, f"admission re-implemented outside reports/base/slots.py: {others}"
