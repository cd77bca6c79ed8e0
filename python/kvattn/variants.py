"""Constructors of the built-in attention variants (kvattn::variants in kvattn/variant.h).

Each returns a new kvattn.Variant; compose them with the Variant's with_* methods::

    kvattn.variants.sliding_window(4096).with_soft_cap(30)

and with a user variant (C++ hooks compiled at plan(); docs/VARIANTS.md)::

    kvattn.variants.causal().with_custom(source, name="doc_mask", tensors={"doc_ids": ids})
"""

from typing import Any, Mapping, Optional

from ._kvattn import RopeConfig, Variant, _builtin_variant_sources

__all__ = ["plain", "causal", "sliding_window", "soft_cap", "alibi", "custom_mask", "sigmoid", "rope",
           "custom", "learned_sinks", "streaming_sinks"]


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


def learned_sinks(sinks: Any) -> Variant:
    """gpt-oss attention sinks: `sinks` (float32 [num_qo_heads], on the plan's device) holds one
    logit per query head whose e^sink joins that head's softmax denominator only (the LSE includes
    it; a row with no visible key gets o = 0). A user variant of kvattn's own
    (kvattn::variants::learned_sinks); compose it with with_causal(), with_window(), ..."""
    return Variant.custom(_builtin_variant_sources["learned_sinks"], name="learned_sinks", tensors={"sinks": sinks})


def streaming_sinks(num_sink: int, window: int) -> Variant:
    """StreamingLLM: keys at positions < num_sink stay visible to every query, the others within
    the last `window` positions before it (kv_pos >= q_pos - window), causal
    (kvattn::variants::streaming_sinks)."""
    for arg, value in (("num_sink", num_sink), ("window", window)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"streaming_sinks: {arg} = {value!r} is not a non-negative int")
    return Variant.custom(_builtin_variant_sources["streaming_sinks"], name="streaming_sinks",
                          scalars={"num_sink": num_sink, "window": window})
