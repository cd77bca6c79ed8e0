"""flashinfer.rope: the RoPE family over kvattn.apply_rope, apply_rope_ragged and
apply_rope_with_cos_sin_cache."""

from typing import Optional

import kvattn as _kv
from kvattn.flashinfer._common import _framework, _positions_i32


def _rope(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, inplace, llama31=None):
    kw = dict(rotary_dim=int(rotary_dim or 0), interleave=bool(interleave),
              rope_scale=float(rope_scale), rope_theta=float(rope_theta), llama31=llama31)
    if inplace:
        _kv.apply_rope(q, k, pos_ids, q_out=q, k_out=k, **kw)
        return None
    return _kv.apply_rope(q, k, pos_ids, **kw)


def _rope_ragged(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, inplace,
                 llama31=None):
    """The (indptr, offsets) forms through kvattn's apply_rope_ragged: row i of segment b at
    offsets[b] + i - indptr[b], computed by the library (on the GPU by the kernel, so a CUDA call
    reads nothing back and can be captured in a CUDA graph)."""
    kw = dict(rotary_dim=int(rotary_dim or 0), interleave=bool(interleave),
              rope_scale=float(rope_scale), rope_theta=float(rope_theta), llama31=llama31)
    ind, off = _positions_i32(indptr, "indptr"), _positions_i32(offsets, "offsets")
    if inplace:
        _kv.apply_rope_ragged(q, k, ind, off, q_out=q, k_out=k, **kw)
        return None
    return _kv.apply_rope_ragged(q, k, ind, off, **kw)


def _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len):
    """FlashInfer's Llama 3.1 arguments as kvattn's: its rope_scale is the scaling factor (the
    plain frequencies are not divided by it)."""
    return _kv.Llama31Scaling(factor=float(rope_scale), low_freq_factor=float(low_freq_factor),
                              high_freq_factor=float(high_freq_factor),
                              original_max_position=float(old_context_len))


def apply_rope(q, k, indptr, offsets, rotary_dim: Optional[int] = None, interleave: bool = False,
               rope_scale: float = 1, rope_theta: float = 1e4):
    """RoPE of a ragged batch: q [nnz, Hq, D], k [nnz, Hk, D], row i of segment b (indptr [B+1])
    at position offsets[b] + i - indptr[b]; the first rotary_dim (None: all) elements of each
    head, rotate-half or interleaved, f_t = theta^(-2t/rotary_dim) / rope_scale. Returns (q_rope,
    k_rope), new tensors in q's framework."""
    return _rope_ragged(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta,
                        False)


def apply_rope_inplace(q, k, indptr, offsets, rotary_dim: Optional[int] = None,
                       interleave: bool = False, rope_scale: float = 1,
                       rope_theta: float = 1e4) -> None:
    """apply_rope into q and k."""
    _rope_ragged(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, True)


def apply_rope_pos_ids(q, k, pos_ids, rotary_dim: Optional[int] = None, interleave: bool = False,
                       rope_scale: float = 1, rope_theta: float = 1e4):
    """RoPE of q [nnz, Hq, D] and k [nnz, Hk, D] at pos_ids [nnz] (int32 or int64). Returns
    (q_rope, k_rope)."""
    return _rope(q, k, _positions_i32(pos_ids, "pos_ids"), rotary_dim, interleave, rope_scale,
                 rope_theta, False)


def apply_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 1,
                               rope_theta: float = 1e4) -> None:
    """apply_rope_pos_ids into q and k."""
    _rope(q, k, _positions_i32(pos_ids, "pos_ids"), rotary_dim, interleave, rope_scale,
          rope_theta, True)


def apply_llama31_rope(q, k, indptr, offsets, rotary_dim: Optional[int] = None,
                       interleave: bool = False, rope_scale: float = 8, rope_theta: float = 5e5,
                       low_freq_factor: float = 1, high_freq_factor: float = 4,
                       old_context_len: int = 8192):
    """apply_rope with Llama 3.1's frequencies: f_t kept where its wavelength is below
    old_context_len / high_freq_factor, divided by rope_scale above old_context_len /
    low_freq_factor, blended between. Returns (q_rope, k_rope)."""
    return _rope_ragged(q, k, indptr, offsets, rotary_dim, interleave, 1.0, rope_theta, False,
                        _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len))


def apply_llama31_rope_inplace(q, k, indptr, offsets, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 8,
                               rope_theta: float = 5e5, low_freq_factor: float = 1,
                               high_freq_factor: float = 4, old_context_len: int = 8192) -> None:
    """apply_llama31_rope into q and k."""
    _rope_ragged(q, k, indptr, offsets, rotary_dim, interleave, 1.0, rope_theta, True,
                 _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len))


def apply_llama31_rope_pos_ids(q, k, pos_ids, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 8,
                               rope_theta: float = 5e5, low_freq_factor: float = 1,
                               high_freq_factor: float = 4, old_context_len: int = 8192):
    """apply_rope_pos_ids with Llama 3.1's frequencies. Returns (q_rope, k_rope)."""
    return _rope(q, k, _positions_i32(pos_ids, "pos_ids"), rotary_dim, interleave, 1.0, rope_theta,
                 False, _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len))


def apply_llama31_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim: Optional[int] = None,
                                       interleave: bool = False, rope_scale: float = 8,
                                       rope_theta: float = 5e5, low_freq_factor: float = 1,
                                       high_freq_factor: float = 4,
                                       old_context_len: int = 8192) -> None:
    """apply_llama31_rope_pos_ids into q and k."""
    _rope(q, k, _positions_i32(pos_ids, "pos_ids"), rotary_dim, interleave, 1.0, rope_theta, True,
          _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len))


def _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, inplace):
    """query [nnz, Hq * head_size] (or [nnz, Hq, head_size]) and key alike, viewed as 3-D
    without a copy (in place writes through the views)."""
    head_size = int(head_size)

    def heads(x, name):
        if not hasattr(x, "shape") or len(x.shape) not in (2, 3):
            raise _kv.Error(f"{name} must be [nnz, num_heads * head_size] or [nnz, num_heads, "
                            f"head_size], got {getattr(x, 'shape', type(x).__name__)}")
        width = int(x.shape[-1]) * (int(x.shape[1]) if len(x.shape) == 3 else 1)
        if head_size <= 0 or width % head_size:
            raise _kv.Error(f"{name} has {width} elements per token, not a multiple of head_size = "
                            f"{head_size}")
        shape = (int(x.shape[0]), width // head_size, head_size)
        v = x.view(*shape) if _framework(x) == "torch" else x.reshape(shape)
        if inplace and _framework(x) != "torch":
            import numpy as np

            if v.size and not np.shares_memory(v, x):
                raise _kv.Error(f"{name} cannot be viewed as {list(shape)} without a copy, so it "
                                "cannot be rotated in place")
        return v

    q3, k3 = heads(query, "query"), heads(key, "key")
    pos = _positions_i32(positions, "positions")
    if inplace:
        _kv.apply_rope_with_cos_sin_cache(q3, k3, pos, cos_sin_cache, q_out=q3, k_out=k3,
                                          interleave=not is_neox)
        return None
    qo, ko = _kv.apply_rope_with_cos_sin_cache(q3, k3, pos, cos_sin_cache, interleave=not is_neox)
    return qo.reshape(tuple(query.shape)), ko.reshape(tuple(key.shape))


def apply_rope_with_cos_sin_cache(positions, query, key, head_size: int, cos_sin_cache,
                                  is_neox: bool = True):
    """RoPE with a precomputed table (vLLM's / SGLang's form): row p of cos_sin_cache
    [max_position, rotary_dim] (float32) is cos of the rotary_dim / 2 frequencies at position p,
    then their sin. query [nnz, Hq * head_size], key [nnz, Hk * head_size] (3-D also taken),
    positions [nnz] (int32 or int64); is_neox: rotate-half pairs (x[t], x[t + rotary_dim / 2]),
    else interleaved (x[2t], x[2t + 1]). Returns (query_out, key_out), shaped like the inputs."""
    return _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, False)


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size: int, cos_sin_cache,
                                          is_neox: bool = True) -> None:
    """apply_rope_with_cos_sin_cache into query and key."""
    _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, True)
