"""Stand-in for SGLang's `sgl_kernel` package inside the lab's own venv (never elsewhere).

SGLang's CPU kernels ship in `sglang-kernel`, whose wheels either need AVX512/AMX or pull a CUDA
torch. SGLang's CPU path calls exactly one of them on every batch: `assign_req_to_token_pool_cpu`
(srt/mem_cache/allocation.py), which writes each request's new KV slots into `req_to_token`.
It is re-written here in plain torch, following SGLang's Triton kernel `assign_req_to_token_pool`
(same file): request i's slots are `out_cache_loc[sum(len_j, j < i) : ... + len_i]`, written to
`req_to_token[req_pool_indices[i], start[i]:end[i]]`. Every other name raises when called, so a
code path that would need a real kernel fails loudly instead of computing something else.
"""
import torch  # noqa: F401  (imported first, as the real sgl_kernel does, before its ops)

__version__ = "0.0.0+ppscope-lab-standin"


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                  out_cache_loc, pool_len):
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    off = 0
    for row, s, e in zip(rows, starts, ends):
        n = e - s
        if n > 0:
            req_to_token[row, s:e] = out_cache_loc[off:off + n].to(req_to_token.dtype)
        off += n


class _Missing:
    def __init__(self, name):
        self._name = name

    def __call__(self, *a, **k):
        raise RuntimeError(f"sgl_kernel.{self._name} is not available in the ppscope lab "
                           "(no CPU build here); this code path cannot run on this machine")

    def __getattr__(self, item):
        return _Missing(f"{self._name}.{item}")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(name)
