"""Paged attention for decoding in Triton: one query per (sequence, head) reads its keys and values where they lie
in the pool, block by block through its block table, with an online softmax. It replaces the reference path's
gather of every sequence's keys/values into a padded tensor (40 % of a decode step's GPU time at batch 2,048 in
bench/gpu_streams.py's profile). Only on CUDA; ``PagedKV`` falls back to the reference path elsewhere, and the
benchmark checks the two agree before it uses this one.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU build: the reference path only
    triton = None


def available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


if triton is not None:

    @triton.jit
    # triton reads a kernel's annotations itself (a tl.constexpr one is a compile-time constant; a pointer's or
    # scalar's type comes from the argument at launch): its other parameters stay unannotated
    def _paged_decode(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, stride_qb, stride_qh,  # type: ignore[no-untyped-def]
                      stride_slot, stride_kh, stride_tb, stride_ob, stride_oh, scale,
                      BLOCK: tl.constexpr, D: tl.constexpr):
        b = tl.program_id(0)
        h = tl.program_id(1)
        length = tl.load(lens_ptr + b)
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b * stride_qb + h * stride_qh + d).to(tl.float32)
        offs = tl.arange(0, BLOCK)
        m = tl.full((), float("-inf"), tl.float32)
        denom = tl.full((), 0.0, tl.float32)
        acc = tl.zeros((D,), tl.float32)
        for j in range(0, tl.cdiv(length, BLOCK)):
            block = tl.load(tables_ptr + b * stride_tb + j)
            valid = j * BLOCK + offs < length
            rows = (block * BLOCK + offs)[:, None] * stride_slot + h * stride_kh + d[None, :]
            k = tl.load(k_ptr + rows, mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.where(valid, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m - m_new)
            v = tl.load(v_ptr + rows, mask=valid[:, None], other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            denom = denom * alpha + tl.sum(p, axis=0)
            m = m_new
        out = acc / denom
        tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty))


def paged_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: torch.Tensor, lengths: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """``q`` [batch, heads, head_dim]; ``k``/``v`` one layer's pool [slots, heads, head_dim]; ``tables`` [batch,
    blocks] (int64); ``lengths`` [batch] -> [batch, heads, head_dim]."""
    batch, heads, dim = q.shape
    q = q.contiguous()
    out = torch.empty_like(q)
    _paged_decode[(batch, heads)](q, k, v, tables, lengths, out, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                  tables.stride(0), out.stride(0), out.stride(1), dim ** -0.5, BLOCK=block_size, D=dim)
    return out
