"""Whether SGLang's Rust radix-tree core runs with this interpreter's torch (run by the lab in its
Python, never imported: `microbench/sglang_lab/tree_core.py` reads the last line it prints).

SGLang 0.5.23 selects its TreeCore by `SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND` (default "rust",
sglang/srt/environ.py) and falls back to the Python core only for the gaps it knows
(`_rust_fallback_reason`, mem_cache/unified_cache/tree_core_registry.py): a torch outside 2.11 to
2.14 (rust_extensions/torch_build.py), no extension, no toolchain. The bundled extension
(mem_cache/rust_tree_core/mem_cache*.so) is built against the torch SGLang pins (torch==2.14.1 in
its metadata), and under torch 2.11, inside that range, it loads and then panics at the first
insert ("Rust TreeCore panicked: ... UnknownKind(20)"), which kills the scheduler. So the core is
tried here as the scheduler uses it (mem_cache/rust_tree_core/adapter.py): the extension loaded,
a core made, a 4-token key inserted with its int64 values, matched again, its values read back.

Prints `rust ok` when every step worked and the values came back, else `rust fails: <why>`;
a panic may also kill this process, which the lab reads as a failure.
"""
import sys


def _probe() -> str:
    from array import array

    import torch
    from sglang.srt.mem_cache.rust_tree_core.extension import bindings as b
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    core = b.RustUnifiedTreeCoreBinding(
        b.TreeCoreInitParamsBinding(
            eviction_policy="lru", slru_protected_threshold=2, tlru_tail_budget=0,
            tlru_float_config=None, page_size=1, is_write_back=False, enable_hicache=False,
            write_through_threshold=256, device="cpu", swa_sliding_window_size=None,
            swa_req_ring=True, enable_kv_cache_events=False, dynamo_kv_event_format=False,
            mamba_cache_chunk_size=None, mamba_max_states_per_path=None),
        [int(ComponentType.FULL)])
    key = array("q", [11, 12, 13, 14])
    values = torch.tensor([40, 41, 42, 43], dtype=torch.int64)
    core.begin_insert(b.InsertParamsBinding(
        key=key, value=values, extra_key=None, cache_salt=None, session_id=None,
        mamba_value=None, prev_prefix_len=0, swa_evicted_seqlen=0, swa_branching_seqlen=None,
        inserted_len=0, priority=0, track_adopted_ranges=False, rotation_base=None))
    while core.has_ongoing_insert():
        core.resume_insert()
    core.end_insert()
    match = core.match_prefix(b.MatchParamsBinding(key=key, extra_key=None, cache_salt=None))
    if match.device_prefix_len != 4:
        return f"rust fails: inserted 4 tokens, matched {match.device_prefix_len}"
    got = core.collect_full_device_indices(match.last_device_node_id,
                                           core.root_node_handle(None))
    got = [int(x) for x in got.flatten().tolist()]
    if got != [40, 41, 42, 43]:
        return f"rust fails: inserted the values [40, 41, 42, 43], read back {got}"
    return "rust ok"


def main() -> int:
    try:
        line = _probe()
    except BaseException as e:      # a Rust panic reaches Python as a BaseException
        text = " ".join(str(e).split()) or "no message"
        line = f"rust fails: {type(e).__name__}: {text[:240]}"
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
