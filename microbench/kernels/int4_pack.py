"""INT4 W4A16 weights as Kimi K2 ships them: quantise, pack, unpack, dequantise (pure torch).

Format (compressed-tensors `pack-quantized`, symmetric, `strategy: group`, group 32):
- A weight [..., N, K] (out x in) is cut along K (the input dimension) into groups of 32.
  Each group has one scale, s = max|w| / 7.5, stored in bf16: scales are [..., N, K/32].
- Each weight becomes q = clamp(round(w / s), -8, 7), a signed 4-bit integer.
- Packing: q + 8 (0..15, offset binary) is one nibble. Eight consecutive inputs share one
  int32 word: word c of a row holds inputs 8c .. 8c+7, input 8c+i in bits 4i .. 4i+3 (the
  first input in the least significant nibble). Packed weights are int32 [..., N, K/8], so K
  stays the contiguous dimension, as in the bf16 layout.
- Dequantised weight: (nibble - 8) * s, rounded once to bf16 (q * s is exact in fp32: a 4-bit
  integer times an 8-bit mantissa).

Bytes per [N, K] matrix: N*K/2 (packed) + 2*N*K/32 (scales), what
`reports.base.model_config.matrix_bytes(N, K, "int4")` counts.
No GPU needed; every function works on any device and leading batch dims (experts).
"""
from __future__ import annotations

GROUP = 32          # inputs per scale
PACK = 8            # int4 values per int32 word
QMIN, QMAX = -8, 7
SCALE_DIV = 7.5     # (QMAX - QMIN) / 2: symmetric range of compressed-tensors


def _check_k(k: int) -> None:
    if k % GROUP:
        raise ValueError(f"input dimension {k} is not a multiple of the group size {GROUP}")


def quantize(w):
    """w [..., N, K] float -> (q int8 [..., N, K] in -8..7, scales bf16 [..., N, K/32])."""
    import torch

    _check_k(w.shape[-1])
    g = w.float().unflatten(-1, (-1, GROUP))                         # [..., N, K/32, 32]
    s = (g.abs().amax(-1) / SCALE_DIV).clamp_min(torch.finfo(torch.float32).tiny)
    s = s.to(torch.bfloat16)                                         # stored scale
    q = torch.round(g / s.float()[..., None]).clamp_(QMIN, QMAX)
    return q.flatten(-2).to(torch.int8), s


def pack(q):
    """int8 [..., K] in -8..7 -> int32 [..., K/8]: input 8c+i in bits 4i..4i+3 of word c."""
    import torch

    if q.shape[-1] % PACK:
        raise ValueError(f"last dimension {q.shape[-1]} is not a multiple of {PACK}")
    if q.numel() and (int(q.min()) < QMIN or int(q.max()) > QMAX):
        raise ValueError("values outside the int4 range -8..7")
    u = (q.to(torch.int64) - QMIN).unflatten(-1, (-1, PACK))          # [..., K/8, 8] 0..15
    shifts = torch.arange(0, 4 * PACK, 4, device=q.device)
    words = (u << shifts).sum(-1)                                    # 0 .. 2^32-1
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def unpack(p):
    """int32 [..., K/8] -> int8 [..., K] in -8..7 (inverse of `pack`)."""
    import torch

    shifts = torch.arange(0, 4 * PACK, 4, device=p.device, dtype=torch.int32)
    nib = (p[..., None] >> shifts) & 0xF                             # [..., K/8, 8]
    return (nib.flatten(-2) + QMIN).to(torch.int8)


def dequantize(p, s, dtype=None):
    """Packed int32 [..., N, K/8] and bf16 scales [..., N, K/32] -> [..., N, K] (bf16 unless
    `dtype`): (nibble - 8) * scale, rounded once."""
    import torch

    q = unpack(p).float()
    _check_k(q.shape[-1])
    w = (q.unflatten(-1, (-1, GROUP)) * s.float()[..., None]).flatten(-2)
    return w.to(dtype or torch.bfloat16)


def quantize_pack(w):
    """w [..., N, K] -> (packed int32 [..., N, K/8], scales bf16 [..., N, K/32])."""
    q, s = quantize(w)
    return pack(q), s


def random_packed(shape, scale: float, gen, device):
    """Random INT4 weights of logical shape [..., N, K] without a float copy: uniform nibbles
    (never all zero) and scales ~ scale * (1 + 0.1 N(0, 1)) / 4.6 in bf16, so the dequantised
    weights have about `scale` standard deviation (uniform -8..7 has std 4.6)."""
    import torch

    *lead, n, k = shape
    _check_k(k)
    words = torch.randint(-2 ** 31, 2 ** 31 - 1, (*lead, n, k // PACK), generator=gen,
                          device=device, dtype=torch.int32)
    s = torch.randn((*lead, n, k // GROUP), generator=gen, device=device)
    s = (1.0 + 0.1 * s).abs_().add_(0.05).mul_(scale / 4.6).to(torch.bfloat16)
    return words, s
