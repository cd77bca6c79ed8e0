"""What the FlashInfer-compatible wrappers share: tensor and dtype helpers, the variant of FlashInfer's
variant arguments, the NotImplementedError for what kvattn does not support, mask packing and the
wrappers' plan/run base."""

from typing import Any, List, Optional

import kvattn as _kv
from kvattn import _kvattn as _native


def _unsupported(name: str, why: str = "") -> None:
    raise NotImplementedError(
        f"kvattn.flashinfer: parameter {name!r} is not supported" + (f" ({why})" if why else ""))


def _require_default(name: str, value: Any, default: Any = None, why: str = "") -> None:
    if value is None and default is None:
        return
    if value is not default and value != default:
        _unsupported(name, why)


def _framework(x) -> str:
    return type(x).__module__.split(".", 1)[0]


def _is_cuda(x) -> bool:
    if x is None:
        return False
    if hasattr(x, "__dlpack_device__"):
        return x.__dlpack_device__()[0] in (2, 13)  # kDLCUDA, kDLCUDAManaged
    return False


def _to_host(x):
    """A host (CPU) array of x: torch .cpu(), cupy .get(); numpy and lists as they are."""
    if x is None or isinstance(x, (list, tuple)):
        return x
    fw = _framework(x)
    if fw == "torch":
        return x if x.device.type == "cpu" else x.cpu()
    if fw == "cupy":
        return x.get()
    return x


def _np(x):
    import numpy as np

    x = _to_host(x)
    if _framework(x) == "torch":
        return x.numpy()
    return np.asarray(x)


_ALIASES = {
    "f32": ("float32", "float", "fp32"), "f16": ("float16", "half", "fp16"),
    "bf16": ("bfloat16",), "e4m3": ("float8_e4m3fn", "fp8_e4m3"), "e5m2": ("float8_e5m2", "fp8_e5m2"),
    "i32": ("int32",), "u8": ("uint8",),
}


def _same_dtype(t, d) -> bool:
    if isinstance(d, _kv.DType):
        return d == t
    s = d if isinstance(d, str) else getattr(d, "__name__", None) or str(d)
    s = s.replace("torch.", "")
    return s == t.name or s in _ALIASES[t.name]


def _kv_dtype_name(d) -> Optional[str]:
    """The kvattn dtype name of a FlashInfer dtype argument (torch dtype or string), or None."""
    if d is None:
        return None
    for t in _kv.DType:
        if _same_dtype(t, d):
            return t.name
    raise _kv.DTypeError(f"dtype {d!r} is not supported by kvattn (float32, float16, bfloat16, "
                         "float8_e4m3fn, float8_e5m2)")


def _variant(*, causal=False, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             sm_scale=None, rope_scale=None, rope_theta=None, q_scale=None, k_scale=None,
             v_scale=None, user=None) -> "_kv.Variant":
    v = _kv.Variant(causal=bool(causal))
    if window_left is not None and window_left >= 0:
        v = v.with_window(int(window_left))
    if logits_soft_cap:
        v = v.with_soft_cap(float(logits_soft_cap))
    mode = pos_encoding_mode
    if mode == "ROPE_LLAMA":
        v = v.with_rope(_kv.RopeConfig(rope_scale=1.0 if rope_scale is None else float(rope_scale),
                                       rope_theta=1e4 if rope_theta is None else float(rope_theta)))
    elif mode == "ALIBI":
        v = v.with_alibi()
    elif mode != "NONE":
        _unsupported("pos_encoding_mode", f"{mode!r}; kvattn takes NONE, ROPE_LLAMA or ALIBI")
    if sm_scale is not None:
        v = v.with_sm_scale(float(sm_scale))
    if q_scale is not None or k_scale is not None or v_scale is not None:
        v = v.with_scales(_scalar(q_scale), _scalar(k_scale), _scalar(v_scale))
    if user is not None:
        v = _with_user_variant(v, user)
    return v


def _with_user_variant(v: "_kv.Variant", user: "_kv.Variant") -> "_kv.Variant":
    """v with the user variant `user` carries (the wrappers' jit_args), its values kept."""
    cv = user.custom_variant
    scalars = {n: ("f32", user.custom_scalars[n]) for n in cv.f32_params}
    scalars.update({n: ("i32", user.custom_scalars[n]) for n in cv.i32_params})
    tensors = {name: user.custom_tensors[name] for name, _, _ in cv.tensor_params}
    return v.with_custom(cv.source, name=cv.name, scalars=scalars, tensors=tensors)


def _scalar(x) -> float:
    if x is None:
        return 1.0
    if hasattr(x, "item"):
        return float(x.item())
    return float(x)


def _workspace(buf):
    """The workspace the native wrapper gets: the buffer on a GPU, none for the CPU backend (a host
    uint8 buffer is used as scratch when large enough). FlashInfer takes a workspace of any dtype
    (its tests pass int8) and uses its bytes: a contiguous buffer of another dtype is seen as bytes."""
    fw = _framework(buf)
    if fw == "torch":
        import torch

        if buf.dtype != torch.uint8 and buf.is_contiguous():
            return buf.reshape(-1).view(torch.uint8)
    elif fw == "numpy":
        import numpy as np

        if buf.dtype != np.uint8 and buf.flags.c_contiguous:
            return buf.reshape(-1).view(np.uint8)
    return buf


def _check_layout(kv_layout: str) -> str:
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout = {kv_layout!r} is not a layout (NHD or HND)")
    return kv_layout


def _copy_into(buf, x, name):
    """buf[:len(x)] = x, in buf's framework (the fixed buffers of CUDA-graph mode)."""
    n = len(x)
    if len(buf) < n:
        raise ValueError(f"{name} holds {len(buf)} elements but the plan needs {n}")
    if _framework(buf) == "torch":
        import torch

        src = x if _framework(x) == "torch" else torch.as_tensor(_np(x))
        buf[:n].copy_(src, non_blocking=True)
    else:
        buf[:n] = _np(x)
    return buf[:n]


def _mask_indptr(qo_indptr, kv_indptr_or_table, paged=False, page_size=1):
    """Byte offsets of each request's packed mask: ceil(qo_len * kv_len / 8) bytes each. The index
    arrays are checked first by the library's own checks (kvattn.Error naming the array), as
    plan() would."""
    import numpy as np

    qo = np.array(_native._indptr_values("qo_indptr", qo_indptr), dtype=np.int64)
    if paged:
        kv_lens = np.array(_native._page_table_lengths(kv_indptr_or_table, page_size), dtype=np.int64)
        what = "the page table"
    else:
        kvp = np.array(_native._indptr_values("kv_indptr", kv_indptr_or_table), dtype=np.int64)
        kv_lens = kvp[1:] - kvp[:-1]
        what = "kv_indptr"
    if len(qo) - 1 != len(kv_lens):
        raise _kv.Error(f"qo_indptr has {len(qo)} elements (batch_size {len(qo) - 1}) but {what} "
                        f"describes batch_size {len(kv_lens)}")
    sizes = (qo[1:] - qo[:-1]) * kv_lens
    return np.concatenate([[0], np.cumsum((sizes + 7) // 8)]).astype(np.int32), sizes


def _pack_mask(custom_mask, packed_custom_mask, qo_indptr, kv, paged=False, page_size=1):
    """(packed mask, mask_indptr) for the native plan: packed_custom_mask as given (the library
    checks its dtype and length; a device tensor, as FlashInfer's callers pass it, is read back to
    the host, where plan() reads masks), or custom_mask (flat bools) packed little-endian."""
    import numpy as np

    if custom_mask is None and packed_custom_mask is None:
        return None, None
    mask_indptr, sizes = _mask_indptr(qo_indptr, kv, paged, page_size)
    if packed_custom_mask is not None:
        return _to_host(packed_custom_mask), mask_indptr
    flat = _np(custom_mask).astype(bool).ravel()
    bit_indptr = np.concatenate([[0], np.cumsum(sizes)])
    if len(flat) != bit_indptr[-1]:
        raise _kv.Error(f"custom_mask has {len(flat)} elements but the batch's qo_len x kv_len "
                        f"sum to {int(bit_indptr[-1])}")
    from kvattn.flashinfer.quantization import segment_packbits  # (it imports this module)

    packed, _ = segment_packbits(flat, bit_indptr, bitorder="little")
    return np.asarray(packed, dtype=np.uint8), mask_indptr


class _Planned:
    """The arguments of the last plan(), for the run-time overrides (scales, window_left)."""

    def __init__(self, native_kwargs, variant_kwargs, out_dtype):
        self.native_kwargs = native_kwargs
        self.variant_kwargs = variant_kwargs
        self.out_dtype = out_dtype


class _WrapperBase:
    def _init_common(self, float_workspace_buffer, kv_layout, backend, jit_args):
        _check_backend(backend)
        # jit_args: FlashInfer's arguments of a JIT module; kvattn's form of a custom variant is a
        # kvattn.Variant carrying a user variant (kvattn.Variant.custom, docs/VARIANTS.md), composed
        # with the wrapper's own switches (causal, window, soft-cap, ...) at every plan().
        if jit_args is not None and not (isinstance(jit_args, _kv.Variant) and jit_args.custom_variant is not None):
            _unsupported("jit_args", "FlashInfer's JIT-module arguments; kvattn takes a kvattn.Variant that "
                         "carries a user variant (kvattn.Variant.custom) there")
        self._jit_variant = jit_args
        self._float_workspace_buffer = float_workspace_buffer
        self._kv_layout = _check_layout(kv_layout)
        self._planned: Optional[_Planned] = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        self._native = self._make_native()
        self._planned = None

    def _replan_for(self, **overrides) -> None:
        """Re-plans when run() asks for other scales or window than plan() had."""
        p = self._planned
        vk = dict(p.variant_kwargs)
        changed = False
        for key, val in overrides.items():
            if val is not None and vk.get(key) != val:
                vk[key] = val
                changed = True
        if changed:
            if self._use_cuda_graph:
                _unsupported(", ".join(k for k, v in overrides.items() if v is not None),
                             "a run() override differing from plan() in CUDA-graph mode; "
                             "pass it to plan()")
            self._native.plan(**p.native_kwargs, variant=_variant(**vk))
            self._planned = _Planned(p.native_kwargs, vk, p.out_dtype)

    def _respecify(self, use_fp16_qk_reduction: bool = False, **variant) -> None:
        """FlashInfer's deprecated forward(): its variant arguments, defaults included, replace
        plan()'s (as FlashInfer's forward overwrites them); a differing set re-plans."""
        _require_default("use_fp16_qk_reduction", use_fp16_qk_reduction, False)
        p = self._planned
        if p is None:
            raise RuntimeError(f"{type(self).__name__}.forward() was called before plan()")
        old = {k: val for k, val in p.variant_kwargs.items() if k != "_custom_mask"}
        new = dict(old, **variant)
        if new == old:
            return
        if self._use_cuda_graph:
            _unsupported(", ".join(k for k in variant if new[k] != old.get(k)),
                         "a forward() argument differing from plan() in CUDA-graph mode; pass it to plan()")
        v = _variant(**new)
        custom = p.native_kwargs.get("custom_mask") is not None
        self._native.plan(**p.native_kwargs, variant=v.with_custom_mask() if custom else v)
        if "_custom_mask" in p.variant_kwargs:
            new["_custom_mask"] = p.variant_kwargs["_custom_mask"]
        self._planned = _Planned(p.native_kwargs, new, p.out_dtype)

    def _run(self, q, k, v, out, lse, return_lse):
        if self._planned is None:
            raise RuntimeError(f"{type(self).__name__}.run() was called before plan()")
        if lse is not None:
            return_lse = True
        res = self._native.run(q, k, v, out=out, lse=lse, return_lse=return_lse)
        return res


def _slice(x, n):
    return x[:n]


def _like(a, ref):
    """numpy array a in ref's framework and on its device (torch), else numpy."""
    if ref is not None and _framework(ref) == "torch":
        import torch

        return torch.from_numpy(a).to(ref.device)
    return a


def _check_ndim(x, name: str, ndim: int, what: str) -> None:
    if not hasattr(x, "shape"):
        raise TypeError(f"{name}: expected a tensor (numpy, torch, ...), got {type(x).__name__}")
    if len(x.shape) != ndim:
        raise _kv.Error(f"{name} must be {ndim}-D {what}, got shape {list(x.shape)}")


def _dtype_of(x, name: str) -> str:
    """The kvattn dtype name of tensor x's dtype (DTypeError naming x when kvattn has none)."""
    try:
        return _kv_dtype_name(x.dtype)
    except _kv.DTypeError:
        raise _kv.DTypeError(f"{name} has dtype {x.dtype}, which kvattn does not take (float32, "
                             "float16, bfloat16; float8_e4m3fn, float8_e5m2 for K/V)") from None


_SINGLE_WORKSPACES = {}


def _single_workspace(like):
    """The workspace of a single-request call: none (the CPU backend) for host tensors, else a
    32 MB uint8 buffer on like's device, allocated once per device (FlashInfer's single_*
    functions keep such a buffer too)."""
    if not _is_cuda(like):
        return None
    key = (_framework(like), tuple(like.__dlpack_device__()))
    ws = _SINGLE_WORKSPACES.get(key)
    if ws is None:
        from kvattn import _frameworks

        ws = _SINGLE_WORKSPACES[key] = _frameworks.empty(like, (32 << 20,), "u8")
    return ws


def _host_ints(name: str, x, expected_len: int = -1) -> List[int]:
    """The values of a 1-D int32 array (host or device: copied to the host) or list, checked by the
    library (kvattn.Error naming `name`)."""
    return _native._int32_values(name, _to_host(x), expected_len)


def _host_indptr(name: str, x, expected_len: int = -1) -> List[int]:
    return _native._indptr_values(name, _to_host(x), expected_len)


def _positions_i32(x, name: str):
    """Position ids / offsets / indptr as int32: FlashInfer takes int32 or int64; kvattn reads int32,
    so an int64 array is converted in its own framework: on the host after a range check, on a
    CUDA device without one (the check would read the values back and synchronise; values past
    int32 wrap)."""
    dt = str(getattr(x, "dtype", "")).replace("torch.", "")
    if dt != "int64":
        return x
    if _is_cuda(x):
        if _framework(x) == "torch":
            import torch

            return x.to(torch.int32)
        return x.astype("int32")
    import numpy as np

    host = _np(x)
    if host.size and (host.min() < -(2**31) or host.max() > 2**31 - 1):
        bad = int(host.min()) if host.min() < -(2**31) else int(host.max())
        raise _kv.Error(f"{name} holds {bad}, which does not fit in int32")
    if _framework(x) == "torch":
        import torch

        return x.to(torch.int32)
    return np.asarray(x).astype(np.int32)


def _padded_page_table(qo_lens, pages, last_page_len, page_size, bits=None, pad_page=0):
    """A page table for BatchPrefill in which every request has qo_len <= kv_len, as kvattn
    requires, and the custom mask that gives the same attention as FlashInfer's (which allows
    qo_len > kv_len).

    qo_lens, pages (each request's page ids), last_page_len: the requests. bits: None, or each
    request's [qo_len, kv_len] bool mask (FlashInfer's custom mask). A request with qo_len > kv_len
    gets ceil((qo_len - kv_len) / page_size) full pages of `pad_page` in front of its own, masked
    off: the queries' positions p(i) = kv_len - qo_len + i and the keys' both shift by the padding,
    and causal, window, ALiBi and RoPE depend on key and query positions only through j - p(i), so
    the visible set and the logits stay FlashInfer's (query rows that see no key give o = 0 and
    lse = -inf). Returns (indptr, indices, last_page_len, mask bytes or None, mask_indptr or None)
    as numpy arrays; the mask is None when neither padding nor bits are needed."""
    import numpy as np

    kv_lens = [0 if not p else page_size * (len(p) - 1) + int(l)
               for p, l in zip(pages, last_page_len)]
    pad = [max(0, -(-(q - kv) // page_size)) if q > kv else 0 for q, kv in zip(qo_lens, kv_lens)]
    need_mask = bits is not None or any(pad)
    new_pages, new_last, parts = [], [], []
    for b, (q, kv, p) in enumerate(zip(qo_lens, kv_lens, pages)):
        new_pages.append([pad_page] * pad[b] + list(p))
        new_last.append(int(last_page_len[b]) if p else (page_size if pad[b] else 0))
        if need_mask:
            m = np.zeros((q, pad[b] * page_size + kv), dtype=bool)
            m[:, pad[b] * page_size:] = True if bits is None else np.asarray(bits[b], dtype=bool)
            parts.append(np.packbits(m.ravel(), bitorder="little"))
    indptr = np.concatenate([[0], np.cumsum([len(p) for p in new_pages])]).astype(np.int32)
    indices = np.array([i for p in new_pages for i in p], dtype=np.int32)
    last = np.array(new_last, dtype=np.int32)
    if not need_mask:
        return indptr, indices, last, None, None
    mask_indptr = np.concatenate([[0], np.cumsum([len(x) for x in parts])]).astype(np.int32)
    mask = np.concatenate(parts).astype(np.uint8) if parts else np.zeros(0, np.uint8)
    return indptr, indices, last, mask, mask_indptr


def _require_none(**params) -> None:
    for name, value in params.items():
        if value is not None:
            _unsupported(name, "per-head fp8 scale tensors (kvattn takes scalar q/k/v scales)")


# FlashInfer's own kernel families compute the same attention: asking for one is a hint (kvattn
# chooses its kernels itself). trtllm-gen and cuDNN take other arguments (seq_lens, block_tables).
_SAME_RESULT_BACKENDS = ("auto", "fa2", "fa3")


def _check_backend(backend: str) -> None:
    if backend not in _SAME_RESULT_BACKENDS:
        _unsupported("backend", f"{backend!r}; kvattn chooses its kernels itself ('auto', or the hints "
                                "'fa2' and 'fa3')")


def _to_nhd(x, kv_layout):
    """[kv_len, heads, dim] view of a single request's K or V (HND: the first two axes swapped)."""
    return x if kv_layout == "NHD" else x.swapaxes(0, 1)
