"""SGLang as the oracle: ppscope's SGLang constants and rules against SGLang's own functions.

Tier `sglang` (pytest -m sglang): runs where `import sglang` works, skipped elsewhere. Checked:
the layer partition (`srt/distributed/utils.py::get_pp_indices`), the decode capture sizes
(`srt/arg_groups/cuda_graph_hook.py::generate_decode_cuda_graph_batch_sizes`), the GPU-memory
defaults for chunked prefill, decode max_bs and mem_fraction_static
(`srt/arg_groups/memory_hook.py::handle_gpu_memory_settings`), the default max_running_requests
(`srt/mem_cache/kv_cache_configurator.py::resolve_max_num_reqs`) and the PP loop's order
(`srt/managers/scheduler_pp_mixin.py`: `_pp_exchange_outputs_before_forward` and the phase order
of `event_loop_pp`), against reports/base and reports/model. The versions these were read from
are in reports/base/sglang_defaults.py (`SGLANG_VERSION`); a failure here means the installed
SGLang changed a rule.

`resolve_max_num_reqs` and `event_loop_pp` live in modules whose import pulls in the whole
server (multimodal processors, kernels); their own source is read from the installed package
and run (the first) or inspected (the second) instead of importing the module.
"""
from __future__ import annotations

import ast
import importlib.util
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
sglang = pytest.importorskip("sglang")

from reports.base import sglang_defaults as sd  # noqa: E402
from reports.base.cuda_graphs import capture_sizes  # noqa: E402
from reports.base.partition import pp_partition  # noqa: E402


def _src(rel: str) -> Path:
    return Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / rel


def _function(rel: str, name: str, glb: dict):
    """SGLang's own function `name` from file `rel`, compiled on its own with `glb`."""
    tree = ast.parse(_src(rel).read_text())
    node = next(n for n in ast.walk(tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)
    node.decorator_list = []
    mod = ast.Module(body=[node], type_ignores=[])
    ns = dict(glb)
    exec(compile(mod, str(_src(rel)), "exec"), ns)
    return ns[name]


def test_version_is_the_one_the_rules_were_read_from():
    v = getattr(sglang, "__version__", None)
    if v != sd.SGLANG_VERSION:
        pytest.xfail(f"installed SGLang {v}, rules read from {sd.SGLANG_VERSION}")


@pytest.mark.parametrize("L,P", [(61, 8), (61, 4), (61, 3), (27, 4), (8, 8), (62, 8)])
@pytest.mark.parametrize("env", [None, "even"])
def test_partition_is_get_pp_indices(L, P, env, monkeypatch):
    from sglang.srt.distributed.utils import get_pp_indices
    override = None
    if env:   # an explicit split: the default one reversed
        counts = [s.num_layers for s in pp_partition(L, P)][::-1]
        override = ",".join(map(str, counts))
        monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", override)
    else:
        monkeypatch.delenv("SGLANG_PP_LAYER_PARTITION", raising=False)
    ours = [(s.first_layer, s.first_layer + s.num_layers) for s in pp_partition(L, P, override)]
    assert ours == [tuple(get_pp_indices(L, r, P)) for r in range(P)]


@pytest.mark.parametrize("max_bs", [1, 8, 10, 48, 100, 160, 256, 300, 512, 640])
def test_decode_capture_sizes(max_bs):
    from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes
    args = types.SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm=None)
    assert capture_sizes(max_bs) == sorted(generate_decode_cuda_graph_batch_sizes(args, max_bs))


def _memory_settings(monkeypatch, mem_mib, tp, pp, mrr):
    """SGLang's handle_gpu_memory_settings on its own ServerArgs (defaults, MLA, no VLM), with
    the GPU's memory given instead of asked from nvidia-smi."""
    from sglang.srt.arg_groups import memory_hook
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig
    from sglang.srt.server_args import ServerArgs
    monkeypatch.setattr(memory_hook, "get_device_memory_capacity", lambda device=None: mem_mib)
    monkeypatch.setattr(memory_hook, "use_mla_backend", lambda args: True)
    monkeypatch.setattr(memory_hook, "post_capture_kv_sizing_planned", lambda args: False)
    monkeypatch.setattr(memory_hook, "model_config_of", lambda args: types.SimpleNamespace(
        is_multimodal=False, hf_config=types.SimpleNamespace()))
    args = ServerArgs(model_path="moonshotai/Kimi-K2", tp_size=tp, pp_size=pp, device="cuda",
                      max_running_requests=mrr)
    args.cuda_graph_config = CudaGraphConfig()
    args.cuda_graph_config.prefill.backend = "disabled"  # off by default under PP
    args._cuda_graph_config_locked = set()
    memory_hook.handle_gpu_memory_settings(args)
    got = {}
    for _src_name, fields in getattr(args, "_resolved_overrides", []):
        got.update(fields)
    cfg = got.get("cuda_graph_config", args.cuda_graph_config)
    return got.get("chunked_prefill_size"), cfg.decode.max_bs, got.get("mem_fraction_static")


@pytest.mark.parametrize("mem_gb", [16, 24, 48, 80, 96, 141, 192])
@pytest.mark.parametrize("tp,mrr", [(1, None), (4, None), (1, 64)])
def test_gpu_memory_defaults(mem_gb, tp, mrr, monkeypatch):
    mem = sd.gpu_mem_mib(mem_gb)
    chunk, max_bs, mfs = _memory_settings(monkeypatch, mem, tp, 8, mrr)
    assert chunk == sd.default_chunked_prefill_size(mem)
    assert max_bs == sd.default_decode_max_bs(mem, tp, mrr)
    assert mfs == pytest.approx(sd.default_mem_fraction_static(mem, chunk, max_bs, tp, 8),
                                abs=1e-9)


@pytest.mark.parametrize("capacity,ctx", [(683105, 262144), (5_927_150, 262144),
                                          (100_000, 8192), (3000, 4096), (50_000_000, 4096)])
@pytest.mark.parametrize("given", [None, 64, 100_000])
def test_default_max_running_requests(capacity, ctx, given):
    schedule = types.SimpleNamespace(max_running_requests=given)
    fn = _function("srt/mem_cache/kv_cache_configurator.py", "resolve_max_num_reqs",
                   {"get_schedule": lambda: schedule, "logger": __import__("logging")})
    me = types.SimpleNamespace(model_config=types.SimpleNamespace(context_len=ctx),
                               attn_dp_size=1, mambaish_config=None)
    assert fn(me, capacity) == sd.resolve_max_running_requests(given, capacity, ctx)


def test_default_cap_divides_by_pp():
    from reports.base.server_settings import default_max_micro_batch
    src = _src("srt/managers/scheduler.py").read_text()
    assert "max(\n                    self.max_running_requests // get_parallel().pp_size, 1\n" \
        in src, "SGLang's default pp_max_micro_batch_size rule moved"
    assert default_max_micro_batch(2048, 8) == 256


def test_loop_order_is_sglangs():
    """The order reports/model/sim/pipeline_model.py and microbench/dispatch/pp_loop.py follow, read from
    SGLang's scheduler_pp_mixin.py (its import pulls in the whole server)."""
    rel = "srt/managers/scheduler_pp_mixin.py"
    before = _function(rel, "_pp_exchange_outputs_before_forward", {})
    assert before(None, False, False, 1) is True      # depth > 0: exchange before the forward
    assert before(None, False, False, 0) is False     # depth 0: after it
    tree = ast.parse(_src(rel).read_text())
    fns = {n.name: ast.get_source_segment(_src(rel).read_text(), n) for n in ast.walk(tree)
           if isinstance(n, ast.FunctionDef)}
    body = fns["event_loop_pp"]
    steps = ["ingest_requests", "_pp_send_pyobj_to_next_stage", "get_next_batch_to_run",
             "_pp_recv_proxy_tensors", "if exchange_outputs_before_forward",
             "_pp_commit_proxy_send_work", "_pp_launch_batch", "d2h_event.synchronize",
             "_pp_process_batch_result", "_pp_send_proxy_to_next_stage"]
    pos = [body.index(s) for s in steps]
    assert pos == sorted(pos)
    assert "mb_id + get_parallel().pp_size" in body          # the last rank's held slot
    send = fns["_pp_send_output_to_next_stage"]
    assert "last_rank_comm_queue.popleft()" in send and "ready_event=q_event" in send
    assert "send_first = (get_parallel().pp_rank % 2) == 0" in \
        fns["_pp_send_recv_and_preprocess_output_tensors"]
    assert "ready_event=self.launch_event" in fns["_pp_send_proxy_to_next_stage"]
