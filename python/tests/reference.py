"""A float64 reference of what kvattn computes, written from SEMANTICS.md in numpy (it never calls
kvattn), and the tolerances the tests hold the library to.

Tolerances (the argument of tests/support/compare.h, restated for these tests):
  * Inputs are compared as stored: the reference reads the decoded q/k/v values (f16, bf16 and
    fp8 inputs are widened to float64 exactly), so an input dtype adds no error of its own.
  * The library accumulates in f32. The logit has an error of a few f32 ulps of
    sum_e |q_e k_e| * scale (~1e-5 for the |q|, |k| <= 2 and head dims <= 128 used here); a
    weight inherits it as a relative error and the weighted sum adds its own rounding, so an
    output's error before rounding is below ACCUMULATION * mag, mag = sum_j |w_j v_j| (10x margin;
    a layout, mask or scaling mistake moves an output by O(mag)).
  * The output is rounded once to its dtype (round to nearest even): relative error at most the
    unit roundoff u = 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16) plus half the subnormal spacing; we
    allow 2u.
  * LSE (f32, base 2): |error| <~ 2e-5 for these magnitudes; we allow 2e-4 + 1e-6 |lse|. A row
    that sees no key must give exactly -inf (and o = 0).
"""

import math

import numpy as np

ACCUMULATION = 1e-4
LSE_ABS, LSE_REL = 2e-4, 1e-6

# (rtol, atol) of the output rounding, per kvattn dtype name.
OUTPUT_TOLERANCE = {
    "f32": (2 * 2.0**-24, 2.0**-149),
    "f16": (2 * 2.0**-11, 2.0**-25),
    "bf16": (2 * 2.0**-8, 2.0**-133),
}

LOG2E = 1.0 / math.log(2.0)


# ---- the variant, as plain values ---------------------------------------------------------------
class UserHooks:
    """A user variant's hooks in float64 (docs/VARIANTS.md has the contract; the C++ reference's
    ref::UserHooks). None is a hook the variant does not define. Each hook is called once per
    request with numpy arrays that broadcast against each other: `batch` is the request's index
    (an int; 0 for block-sparse), positions are absolute (query i of a request at kv_len - qo_len
    + i, key j at j), kv_head = qo_head // (Hq / Hkv):
      logits_transform(logit, batch, qo_pos, kv_pos, qo_head, kv_head) -> logit, after sm_scale,
          soft-cap and ALiBi (logit [Hq, qo, kv], qo_pos [1, qo, 1], kv_pos [1, 1, kv],
          qo_head and kv_head [Hq, 1, 1]); its value on hidden pairs is not used
      logits_mask(batch, qo_pos, kv_pos, qo_head, kv_head) -> visible, ANDed with the built-in masks
      output_transform(value, batch, qo_pos, qo_head, dim) -> value, on the final output
          (value [qo, Hq, Dv], qo_pos [qo, 1, 1], qo_head [1, Hq, 1], dim [1, 1, Dv])
      sink_logit(batch, qo_head) -> logit whose e^logit joins the softmax denominator only
          (qo_head [Hq]); the LSE includes it
    use_softmax=False: the weights are the transformed logits, summed without normalisation, and
    there is no LSE."""

    def __init__(self, logits_transform=None, logits_mask=None, output_transform=None,
                 sink_logit=None, use_softmax=True):
        self.logits_transform = logits_transform
        self.logits_mask = logits_mask
        self.output_transform = output_transform
        self.sink_logit = sink_logit
        self.use_softmax = use_softmax


class Var:
    """The variant's parameters for the reference (independent of kvattn.Variant). `user`: a
    UserHooks on top of the built-in switches."""

    def __init__(self, causal=False, window_left=-1, soft_cap=0.0, alibi=False, sigmoid=False,
                 sigmoid_bias=0.0, rope=None, sm_scale=None, q_scale=1.0, k_scale=1.0,
                 v_scale=1.0, mask=None, user=None):
        self.causal = causal
        self.window_left = window_left
        self.soft_cap = soft_cap
        self.alibi = alibi
        self.sigmoid = sigmoid
        self.sigmoid_bias = sigmoid_bias
        self.rope = rope  # dict(theta, scale, interleave, llama31=None | dict)
        self.sm_scale = sm_scale
        self.q_scale, self.k_scale, self.v_scale = q_scale, k_scale, v_scale
        self.mask = mask  # callable (request, i, j) -> bool, or None
        self.user = user  # UserHooks, or None

    def has_lse(self):
        """False where the weights are not a softmax (sigmoid, a user variant's use_softmax=False)."""
        return not self.sigmoid and (self.user is None or self.user.use_softmax)


def alibi_slope(h, n_heads):
    """2^(-8 (h+1) / n) for the first n = largest power of two <= H heads, then
    2^(-4 (2k+1) / n), k = 0, 1, ..."""
    n = 1
    while 2 * n <= n_heads:
        n *= 2
    if h < n:
        return 2.0 ** (-8.0 * (h + 1) / n)
    return 2.0 ** (-4.0 * (2 * (h - n) + 1) / n)


def rope_frequencies(dim, theta=1e4, scale=1.0, llama31=None):
    """f_t = theta^(-2t/d) / rope_scale, t < d/2, with Llama 3.1's wavelength rule when given."""
    t = np.arange(dim // 2, dtype=np.float64)
    f = theta ** (-2.0 * t / dim) / scale
    if llama31 is None:
        return f
    factor = llama31.get("factor", 8.0)
    low = llama31.get("low_freq_factor", 1.0)
    high = llama31.get("high_freq_factor", 4.0)
    orig = llama31.get("original_max_position", 8192.0)
    wavelength = 2.0 * math.pi / f
    g = (orig / wavelength - low) / (high - low)
    mid = (1.0 - g) * f / factor + g * f
    return np.where(wavelength < orig / high, f, np.where(wavelength > orig / low, f / factor, mid))


def rope(x, pos, theta=1e4, scale=1.0, interleave=False, llama31=None, rotary_dim=None):
    """x [n, H, D] float64 rotated at positions pos [n]: pairs (x[t], x[t + d/2]) (or (x[2t],
    x[2t+1]) interleaved) of the first rotary_dim elements; the rest unchanged."""
    x = np.array(x, dtype=np.float64)
    d = x.shape[-1] if not rotary_dim else rotary_dim
    f = rope_frequencies(d, theta, scale, llama31)
    a = np.asarray(pos, dtype=np.float64)[:, None] * f[None, :]  # [n, d/2]
    cos, sin = np.cos(a)[:, None, :], np.sin(a)[:, None, :]
    if interleave:
        i0, i1 = np.arange(0, d, 2), np.arange(1, d, 2)
    else:
        i0, i1 = np.arange(d // 2), np.arange(d // 2, d)
    y = x.copy()
    y[..., i0] = x[..., i0] * cos - x[..., i1] * sin
    y[..., i1] = x[..., i1] * cos + x[..., i0] * sin
    return y


# ---- attention ------------------------------------------------------------------------------------
def attention_one(q, k, v, var, request=0, head_offset_pos=None):
    """One request. q [qo_len, Hq, D], k [kv_len, Hkv, D], v [kv_len, Hkv, Dv], float64.
    Returns (o [qo_len, Hq, Dv], lse [qo_len, Hq] base 2 (None without a softmax), mag like o).
    Query i sits at p(i) = kv_len - qo_len + i; query head h reads KV head h // (Hq / Hkv).
    A user variant (var.user) as tests/reference/reference.cpp: its mask ANDed with the others,
    its transform after soft-cap and ALiBi, its sink in the denominator only, use_softmax=False
    weights = the transformed logits, its output transform last (mag scaled by its slope)."""
    qo_len, hq, dqk = q.shape
    kv_len, hkv, dvo = v.shape
    group = hq // hkv
    pos_q = kv_len - qo_len + np.arange(qo_len)
    pos_k = np.arange(kv_len)
    if var.rope is not None:
        r = var.rope
        q = rope(q, pos_q, r.get("theta", 1e4), r.get("scale", 1.0), r.get("interleave", False),
                 r.get("llama31"))
        k = rope(k, pos_k, r.get("theta", 1e4), r.get("scale", 1.0), r.get("interleave", False),
                 r.get("llama31"))
    sm_scale = var.sm_scale if var.sm_scale is not None else 1.0 / math.sqrt(dqk)
    scale = sm_scale * var.q_scale * var.k_scale
    kx = np.repeat(k, group, axis=1)  # [kv_len, Hq, D]
    vx = np.repeat(v, group, axis=1)
    s = np.einsum("ihd,jhd->hij", q, kx) * scale  # [Hq, qo_len, kv_len]
    if var.soft_cap > 0:
        s = var.soft_cap * np.tanh(s / var.soft_cap)
    if var.alibi:
        slopes = np.array([alibi_slope(h, hq) for h in range(hq)])
        s = s + slopes[:, None, None] * (pos_k[None, None, :] - pos_q[None, :, None])
    visible = np.ones((qo_len, kv_len), dtype=bool)
    if var.causal:
        visible &= pos_k[None, :] <= pos_q[:, None]
    if var.window_left >= 0:
        visible &= pos_k[None, :] >= pos_q[:, None] - var.window_left
    if var.mask is not None:
        m = np.array([[var.mask(request, i, j) for j in range(kv_len)] for i in range(qo_len)],
                     dtype=bool).reshape(qo_len, kv_len)
        visible &= m
    vis = np.broadcast_to(visible[None], s.shape)
    user = var.user
    if user is not None:
        heads = np.arange(hq)[:, None, None]
        hooks = (request, pos_q[None, :, None], pos_k[None, None, :], heads, heads // group)
        if user.logits_mask is not None:
            vis = vis & np.broadcast_to(np.asarray(user.logits_mask(*hooks), dtype=bool), s.shape)
        if user.logits_transform is not None:
            with np.errstate(all="ignore"):  # hidden pairs' values are not used
                s = np.broadcast_to(np.asarray(user.logits_transform(s, *hooks), dtype=np.float64),
                                    s.shape)
    softmax = var.has_lse()
    sink = None
    if softmax and user is not None and user.sink_logit is not None:
        sink = np.broadcast_to(np.asarray(user.sink_logit(request, np.arange(hq)), dtype=np.float64),
                               (hq,))[:, None, None]
    if var.sigmoid:
        w = np.where(vis, 1.0 / (1.0 + np.exp(-(s + var.sigmoid_bias))), 0.0)
        lse = None
    elif not softmax:  # a user variant without softmax: the transformed logits are the weights
        w = np.where(vis, s, 0.0)
        lse = None
    else:
        smax = np.where(vis, s, -np.inf).max(axis=2, keepdims=True, initial=-np.inf)
        if sink is not None:
            smax = np.maximum(smax, sink)
        smax = np.where(np.isfinite(smax), smax, 0.0)
        e = np.where(vis, np.exp(s - smax), 0.0)
        den = e.sum(axis=2, keepdims=True)
        if sink is not None:
            den = den + np.exp(sink - smax)
        w = np.where(den > 0, e / np.where(den > 0, den, 1.0), 0.0)
        with np.errstate(divide="ignore"):
            lse = np.where(den[..., 0] > 0, (np.log(np.where(den[..., 0] > 0, den[..., 0], 1.0))
                                             + smax[..., 0]) * LOG2E, -np.inf)  # [Hq, qo_len]
        lse = lse.T
    wv = var.v_scale * np.einsum("hij,jhd->ihd", w, vx)
    mag = abs(var.v_scale) * np.einsum("hij,jhd->ihd", np.abs(w), np.abs(vx))
    if user is not None and user.output_transform is not None:
        out = (request, pos_q[:, None, None], np.arange(hq)[None, :, None],
               np.arange(dvo)[None, None, :])
        f = lambda x: np.broadcast_to(np.asarray(user.output_transform(x, *out), dtype=np.float64),
                                      x.shape)
        # The transform's local slope scales the accumulated rounding error (compare.h).
        eps = 1e-6 * np.maximum(1.0, np.abs(wv))
        slope = np.abs(f(wv + eps) - f(wv - eps)) / (2 * eps)
        wv = f(wv)
        mag = mag * np.maximum(slope, 1.0)
    return wv, lse, mag


def batch_attention(q, qo_indptr, ks, vs, var):
    """q [nnz_q, Hq, D] ragged by qo_indptr; ks / vs: per-request K [kv_len, Hkv, D] and V.
    Returns o, lse (None without a softmax: sigmoid, use_softmax=False), mag for the whole batch."""
    nnz, hq, _ = q.shape
    dvo = vs[0].shape[-1] if len(vs) else q.shape[-1]
    o = np.zeros((nnz, hq, dvo))
    mag = np.zeros_like(o)
    lse = np.full((nnz, hq), -np.inf)
    for b in range(len(ks)):
        a, e = qo_indptr[b], qo_indptr[b + 1]
        if e == a:
            continue
        ob, lb, mb = attention_one(q[a:e], ks[b], vs[b], var, request=b)
        o[a:e], mag[a:e] = ob, mb
        if lb is not None:
            lse[a:e] = lb
    return o, (lse if var.has_lse() else None), mag


# ---- merging --------------------------------------------------------------------------------------
def merge(o_a, s_a, o_b, s_b):
    """(o, lse) of the union: lse = log2(2^a + 2^b), o = o_a 2^(a - lse) + o_b 2^(b - lse);
    a side with lse = -inf contributes nothing (its o is never read: it may hold NaN); both -inf
    give o = 0 and lse = -inf. Also returns mag = |o_a| w_a + |o_b| w_b for the tolerance."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.logaddexp2(s_a, s_b)
        safe = np.where(np.isneginf(s), 0.0, s)
        wa = np.where(np.isneginf(s_a), 0.0, np.exp2(s_a - safe))[..., None]
        wb = np.where(np.isneginf(s_b), 0.0, np.exp2(s_b - safe))[..., None]
        ta = np.where(wa > 0, o_a * wa, 0.0)
        tb = np.where(wb > 0, o_b * wb, 0.0)
    return ta + tb, s, np.abs(ta) + np.abs(tb)


# ---- paged cache helpers --------------------------------------------------------------------------
def paged_lengths(indptr, last_page_len, page_size):
    """kv_len of each request: page_size * (pages - 1) + last_page_len, 0 without pages."""
    out = []
    for b in range(len(indptr) - 1):
        n = indptr[b + 1] - indptr[b]
        out.append(0 if n == 0 else page_size * (n - 1) + last_page_len[b])
    return out


def gather_paged(cache, layout, indptr, indices, last_page_len, page_size):
    """The K (or V) rows [kv_len, H, D] of each request from a 4-D page array (float64)."""
    rows = []
    for b, n in enumerate(paged_lengths(indptr, last_page_len, page_size)):
        toks = []
        for t in range(n):
            page = indices[indptr[b] + t // page_size]
            slot = t % page_size
            toks.append(cache[page, slot] if layout == "NHD" else cache[page, :, slot])
        h, d = (cache.shape[2], cache.shape[3]) if layout == "NHD" else (cache.shape[1], cache.shape[3])
        rows.append(np.array(toks, dtype=np.float64).reshape(n, h, d))
    return rows
