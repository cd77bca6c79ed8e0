"""Constructors of the built-in attention variants (kvattn::variants in kvattn/variant.h).

Each returns a new kvattn.Variant; compose them with the Variant's with_* methods::

    kvattn.variants.sliding_window(4096).with_soft_cap(30)

and with a user variant (C++ hooks compiled at plan(); docs/VARIANTS.md)::

    kvattn.variants.causal().with_custom(source, name="doc_mask", tensors={"doc_ids": ids})
"""

from typing import Any, Mapping, Optional

from ._kvattn import RopeConfig, Variant

__all__ = ["plain", "causal", "sliding_window", "soft_cap", "alibi", "custom_mask", "sigmoid", "rope",
           "custom"]


def plain() -> Variant:
    """No mask, no logit transform: softmax over every key."""
    return Variant()


def causal() -> Variant:
    """Key j is visible to query i iff j <= p(i) = kv_len - qo_len + i (aligned bottom-right)."""
    return Variant().with_causal()


def sliding_window(window_left: int, causal: bool = True) -> Variant:
    """Keys j >= p(i) - window_left (window_left >= 0), causal unless causal=False."""
    return Variant().with_causal(causal).with_window(window_left)


def soft_cap(cap: float) -> Variant:
    """Logits s <- cap * tanh(s / cap) after scaling (Gemma 2); cap > 0."""
    return Variant().with_soft_cap(cap)


def alibi() -> Variant:
    """s <- s + m_h * (j - p(i)) with the standard slopes for num_qo_heads (kvattn.alibi_slope)."""
    return Variant().with_alibi()


def custom_mask() -> Variant:
    """A packed bit mask given to BatchPrefill.plan(custom_mask=..., mask_indptr=...)."""
    return Variant().with_custom_mask()


def sigmoid(bias: float = 0.0) -> Variant:
    """No softmax: o_i = sum_j sigmoid(s(i, j) + bias) v_j; no lse."""
    return Variant().with_sigmoid(bias)


def rope(rope: Optional[RopeConfig] = None) -> Variant:
    """Fused rotary embedding of q (position p(i)) and k (position j); RopeConfig() by default."""
    return Variant().with_rope(rope if rope is not None else RopeConfig())


def custom(source: str, *, name: str = "custom", scalars: Optional[Mapping[str, Any]] = None,
           tensors: Optional[Mapping[str, Any]] = None) -> Variant:
    """A user variant alone (kvattn.Variant.custom): C++ source defining struct Variant with any of
    the hooks logits_transform, logits_mask, output_transform, sink_logit, use_softmax = false;
    scalars {name: int (i32) | float (f32) | ("f32" | "i32", value)} and tensors {name: f32 / i32
    / u8 tensor of 1 to 4 dimensions} declare its parameters and give their values."""
    return Variant.custom(source, name=name, scalars=None if scalars is None else dict(scalars),
                          tensors=None if tensors is None else dict(tensors))
