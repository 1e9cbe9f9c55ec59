"""The causes of a slow pipeline, named once: the scenario attribution, the observed diagnosis,
the verdicts, the what-ifs and every renderer use these names and labels.

A cause is one effect the pipeline model can switch off (its `reference`: what "off" means).
The scenario model (reports/model/scenario/loop_builder.py) switches all of them; the model of an
observed loop (reports/model/observed/deployment.py) the ones its evidence can tell apart
(`OBSERVED`). Each of the user's hypotheses is settled by one cause (`HYPOTHESES`), so a
verdict always cites that cause's row.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    name: str
    label: str          # the row label in every table
    reference: str      # the cause switched off
    term: str           # the glossary entry


CAUSES: dict[str, Cause] = {c.name: c for c in (
    Cause("slow_stage", "slow stage (layer split, embedding/lm_head extras, a slower rank)",
          "every stage as fast as the mean stage (scenario) or the lower-median rank (observed)",
          "a stage whose forward takes longer than the others': the whole pipeline runs at "
          "its pace"),
    Cause("kernel_efficiency", "kernel efficiency (below the roofline floor)",
          "every kernel at the roofline floor",
          "the fraction of the roofline floor the layer's kernels reach"),
    Cause("launch_gaps", "launch gaps (eager forwards / CUDA-graph padding or fallback)",
          "each forward as long as its kernels, no graph padding",
          "time between kernels when a forward runs eager (not from a CUDA graph), or the "
          "padding of a batch to the captured graph size"),
    Cause("hop", "hops between stages (hidden-state transfer, NCCL latency)",
          "hops cost nothing, nothing waits on communication",
          "sending one micro-batch's hidden states and residual to the next stage"),
    Cause("host", "host work on the critical path (scheduling, launch, result processing)",
          "no CPU time on the critical path",
          "the scheduler's CPU work per slot visit (get_next_batch_to_run, run_batch, "
          "process_batch_result) while no forward runs"),
    Cause("relay", "rank chaining (request list relayed rank to rank over gloo)",
          "the request list relayed without blocking",
          "rank r > 0 receives the request list from rank r-1 over the CPU (gloo) group before "
          "it can schedule: the ranks' host work runs one after another"),
    Cause("token_return", "SGLang's token return (held outputs, per-rank sync)",
          "tokens straight back to rank 0",
          "the last rank holds each micro-batch's sampled tokens for `async depth` iterations "
          "before sending them back; every rank syncs on them"),
    Cause("herd", "thundering herd (requests in too few or uneven micro-batches)",
          "the same requests in equal micro-batches (one per occupied slot, at least "
          "min(C, pp)), evenly spaced over the slots",
          "requests that arrive together are admitted into one slot (micro-batch) and stay "
          "there, so fewer micro-batches than stages are in flight and the GPUs take turns"),
    Cause("routing_skew", "expert-routing skew",
          "uniform expert routing",
          "an MoE router sending more tokens to some experts than others"),
)}
# The scenario model times the relay's gloo messages inside `host` (one CPU estimate per
# message: no trace tells them apart there); `relay` is its own row where traces time it.
SCENARIO = ("slow_stage", "kernel_efficiency", "launch_gaps", "hop", "host", "token_return",
            "herd", "routing_skew")
OBSERVED = ("slow_stage", "host", "relay", "herd", "launch_gaps", "hop")

# The user's hypotheses and the cause that settles each (bandwidth is judged by the hop row and
# the link's utilisation; "holds" there means bandwidth is NOT the limit).
# the words of a verdict (reports/model/verdicts.py)
HOLDS, MINOR, NOT, UNKNOWN = "holds", "minor", "does not hold", "not enough evidence"
# the evidence was read, and its interval straddles a threshold (reports/model/observed/resample.py)
NOISE = "within noise"
HERD = "thundering herd / uneven split"
BANDWIDTH = "bandwidth is not the limit"
GRAPHS = "CUDA-graph fallback"
NUMA = "cross-socket NUMA"
ROUTING = "MoE routing imbalance"
STAGES = "stage imbalance"
HYPOTHESES: dict[str, str] = {HERD: "herd", BANDWIDTH: "hop", GRAPHS: "launch_gaps",
                              NUMA: "hop", ROUTING: "routing_skew", STAGES: "slow_stage"}


def label(name: str) -> str:
    return CAUSES[name].label if name in CAUSES else name
