"""Issue 30's corruptions through the Python layer (the C++ API fuzzer's list, fuzz/*.cpp, and the
regression cases of tests/hardening_test.cpp), on the CPU backend with numpy inputs.

Every case builds a fresh legal call (random values from the `rng` fixture), applies ONE corruption
that makes it illegal by construction, makes the call through the native API (kvattn) and, where
the call has a FlashInfer form, through kvattn.flashinfer, and checks that

  * it raises kvattn.Error (kvattn.DTypeError for dtypes; TypeError for a wrong kind of argument
    or a wrong argument name, which never reach the C++ API),
  * the message names the argument (and the value, where the C++ message names it), and
  * every buffer the call was given (inputs, and the caller's outputs poisoned with NaN) is byte
    for byte what it was: a rejected call corrupts nothing.

numpy cannot express every corruption the C++ fuzzer makes with TensorView (a negative or
overflowing shape, a null data pointer with elements, a tensor on cuda:0): `Raw` below is a DLPack
producer written with ctypes that exports any (data, dtype, shape, strides, device) over the
memory of a numpy array, as a buggy or hostile framework could.

The second half runs randomized legal calls (fresh sizes, dtypes, layouts and variants per seed)
through the same builders and checks them against the float64 reference (reference.py).
"""

import ctypes
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest

import kvattn
import kvattn.flashinfer as fi
import reference as ref
from conftest import FLOAT_DTYPES, cast, check_lse, check_output, f64, np_dtype, page_table, rand

I32_MAX, I32_MIN = 2**31 - 1, -(2**31)
WORKSPACE = np.zeros(1 << 16, np.uint8)
FI_DTYPE = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "e4m3": "float8_e4m3fn",
            "e5m2": "float8_e5m2", "i32": "int32", "u8": "uint8"}


# ---- a DLPack producer that can express what numpy cannot -------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DL_CODES = {"f32": (2, 32), "f16": (2, 16), "bf16": (4, 16), "i32": (0, 32), "u8": (1, 8)}
_DL_NAMES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int32): "i32",
             np.dtype(np.uint8): "u8"}
KDL_CUDA = 2


class Raw:
    """A DLPack producer of any view: `data` (an address; 0 for null), kvattn dtype name, shape and
    strides in elements, (device_type, device_id). Keeps `owner` (the memory) alive. No deleter:
    the structures live as long as this object."""

    def __init__(self, owner, data, dtype, shape, strides, device=(1, 0)):
        self.owner, self.data, self.dl_dtype = owner, data, dtype
        self.shape, self.strides, self.device = list(shape), list(strides), device
        self._alive = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, **_):
        n = len(self.shape)
        shape = (ctypes.c_int64 * n)(*self.shape)
        strides = (ctypes.c_int64 * n)(*self.strides)
        mt = _DLManagedTensor()
        mt.dl_tensor.data = self.data
        mt.dl_tensor.device = _DLDevice(*self.device)
        mt.dl_tensor.ndim = n
        mt.dl_tensor.dtype = _DLDataType(*_DL_CODES[self.dl_dtype], 1)
        mt.dl_tensor.shape = shape
        mt.dl_tensor.strides = strides
        self._alive.append((mt, shape, strides))
        return _capsule_new(ctypes.addressof(mt), b"dltensor", None)


def raw(a, *, shape=None, strides=None, data=None, device=(1, 0)):
    """A Raw view of numpy array `a` with some of its properties replaced."""
    return Raw(a, a.ctypes.data if data is None else data, _DL_NAMES[a.dtype],
               a.shape if shape is None else shape,
               [s // a.itemsize for s in a.strides] if strides is None else strides, device)


# ---- cases ------------------------------------------------------------------------------------------
class Case:
    """One corruption of a call of `api`: `mutate(call)` changes the call's fields; the call must
    raise `exc` with a message matching `match` (re.search). `layers`: "native", "flashinfer"."""

    def __init__(self, api, name, mutate, match, exc=kvattn.Error, layers=("native", "flashinfer")):
        self.api, self.name, self.mutate, self.match, self.exc = api, name, mutate, match, exc
        self.layers = tuple(layers)

    def id(self, layer):
        return f"{self.api}-{layer}-{self.name}"


def named(name):
    """The argument's name as a word of the message (at its start, after a space, '(' or quote)."""
    return rf"(^|[\s('\"]){re.escape(name)}(?=$|[\s.\[:,'\")])"


def setter(field, fn):
    """A mutation that replaces call field `field` by fn(old value, call)."""
    def mutate(call):
        setattr(call.f, field, fn(getattr(call.f, field), call))
    return mutate


def fresh(call, x, shape, fill=None):
    """A new array of x's dtype and `shape` (poisoned like an output when x is all NaN), kept."""
    if fill is None and x.dtype.kind == "f" and np.isnan(f64(x)).all():
        fill = np.nan
    y = cast(np.full(shape, fill) if fill is not None else call.rng.uniform(-1, 1, size=shape),
             _name_of(x.dtype))
    return call.keep(y)


def _name_of(dt):
    names = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int32): "i32",
             np.dtype(np.uint8): "u8"}
    if dt in names:
        return names[dt]
    return {"bfloat16": "bf16", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}[str(dt)]


def with_stride(call, x, dim, stride):
    """x's values in a view whose `dim` has element stride `stride` (> 0: a wider buffer; 0: every
    index of dim reads one element), kept."""
    if stride == 0:
        return np.lib.stride_tricks.as_strided(
            x, strides=tuple(0 if d == dim else s for d, s in enumerate(x.strides)))
    shape = list(x.shape)
    shape[dim] *= stride
    buf = call.keep(np.zeros(shape, x.dtype))
    index = tuple(slice(None, None, stride) if d == dim else slice(None) for d in range(x.ndim))
    view = buf[index]
    view[...] = x
    return view


def _astype(x, dtype):
    with np.errstate(invalid="ignore"):  # NaN (a poisoned output) to an integer dtype
        return x.astype(dtype)


def read_only(call, x):
    y = call.keep(x.copy())
    y.flags.writeable = False
    return y


def tensor_cases(api, field, name, *, exact_dims, output=False, wrong_dtype="f32", layers=None,
                 huge_rows_ok=True, fi_allocates_like=False):
    """fuzz/harness.cpp's tensor_corruptions of one tensor argument, plus what only Python can
    pass (float64, negative strides, a list, a read-only output) and what only a DLPack producer
    can (a negative or overflowing shape, null data, another device). fi_allocates_like:
    kvattn.flashinfer allocates the outputs like this argument, which it cannot do on a device of
    an unknown framework (a TypeError naming the argument)."""
    lay = dict(layers=layers) if layers else {}
    n = named(name)
    cases = [
        Case(api, f"{name}: one more dimension", setter(field, lambda x, c: x[..., None]), n, **lay),
        Case(api, f"{name}: dtype {wrong_dtype}",
             setter(field, lambda x, c: c.keep(_astype(x, np_dtype(wrong_dtype)))), n,
             kvattn.DTypeError, **lay),
        Case(api, f"{name}: dtype float64", setter(field, lambda x, c: c.keep(x.astype(np.float64))),
             n + r".*float64", kvattn.DTypeError, **lay),
        Case(api, f"{name}: head-dim stride 2", setter(field, lambda x, c: with_stride(c, x, x.ndim - 1, 2)),
             n, **lay),
        Case(api, f"{name}: head-dim stride 0", setter(field, lambda x, c: with_stride(c, x, x.ndim - 1, 0)),
             n, **lay),
        Case(api, f"{name}: negative strides", setter(field, lambda x, c: x[::-1]),
             n + r".*stride", **lay),
        Case(api, f"{name}: null data", setter(field, lambda x, c: raw(x, data=0)),
             n + r".*null", **lay),
        Case(api, f"{name}: on cuda:0", setter(field, lambda x, c: raw(x, device=(KDL_CUDA, 0))),
             n + r".*cuda:0|cuda:0.*" + n, **(dict(layers=NATIVE) if fi_allocates_like else lay)),
        Case(api, f"{name}: shape[0] = -1",
             setter(field, lambda x, c: raw(x, shape=[-1] + list(x.shape[1:]))),
             n + r".*shape\[0\] = -1", **lay),
        Case(api, f"{name}: 2^32 per dim",
             setter(field, lambda x, c: raw(x, shape=[2**32] * x.ndim, strides=[0] * x.ndim)),
             n + r".*more elements than int64", **lay),
        Case(api, f"{name}: a list", setter(field, lambda x, c: f64(x).tolist()),
             n + r": expected a tensor", TypeError, **lay),
    ]
    if fi_allocates_like:
        cases.append(Case(api, f"{name}: on cuda:0 (flashinfer)",
                          setter(field, lambda x, c: raw(x, device=(KDL_CUDA, 0))),
                          rf"cannot allocate an output like {name} \(a .*Raw on DLPack device 2:0\)",
                          TypeError, layers=("flashinfer",)))
    if huge_rows_ok:  # (rows - 1) x the row stride past 2^63 bytes
        cases.append(Case(api, f"{name}: row stride past 2^63 bytes in all",
                          setter(field, lambda x, c: raw(x, strides=[2**63 // x.itemsize // max(1, x.shape[0] - 1) + 1]
                                                         + [s // x.itemsize for s in x.strides[1:]])),
                          n + r".*(spans more bytes than int64|past the end of the address space)",
                          **lay))
    for d in exact_dims:
        for delta in (1, -1):
            cases.append(Case(
                api, f"{field}.shape[{d}] {'+' if delta > 0 else '-'} 1",
                setter(field, lambda x, c, d=d, delta=delta: fresh(
                    c, x, tuple(s + delta if i == d else s for i, s in enumerate(x.shape)))),
                n, **lay))
    if output:
        cases.append(Case(api, f"{name}: stride 0 along dim 1",
                          setter(field, lambda x, c: with_stride(c, x, 1, 0)),
                          n + r".*share memory", **lay))
        cases.append(Case(api, f"{name}: stride 0 along dim 0",
                          setter(field, lambda x, c: with_stride(c, x, 0, 0)),
                          n + r".*share memory", **lay))
        cases.append(Case(api, f"{name}: read-only", setter(field, lambda x, c: read_only(c, x)),
                          n + r" is read-only", **lay))
    return cases


def index_cases(api, field, name, *, exact_length, layers=None):
    """fuzz/harness.cpp's index_array_corruptions of a 1-D int32 array, and Python lists."""
    lay = dict(layers=layers) if layers else {}
    n = named(name)
    a32 = lambda x: np.asarray(x, np.int32)  # noqa: E731 (lists, the planner's arguments)

    def stride2(x, c):
        buf = c.keep(np.zeros(2 * len(x), np.int32))
        buf[::2] = x
        return buf[::2]

    cases = [
        Case(api, f"{name}: dtype f32", setter(field, lambda x, c: c.keep(np.asarray(x, np.float32))),
             n + r" has dtype f32", kvattn.DTypeError, **lay),
        Case(api, f"{name}: dtype u8", setter(field, lambda x, c: c.keep(np.asarray(x, np.int64).astype(np.uint8))),
             n + r" has dtype u8", kvattn.DTypeError, **lay),
        Case(api, f"{name}: dtype int64", setter(field, lambda x, c: c.keep(np.asarray(x, np.int64))),
             n + r" has dtype int64", kvattn.DTypeError, **lay),
        Case(api, f"{name}: 2-D", setter(field, lambda x, c: c.keep(a32(x))[:, None]), n + r".*1-D", **lay),
        Case(api, f"{name}: null data", setter(field, lambda x, c: raw(c.keep(a32(x)), data=0)),
             n + r" has a null data pointer", **lay),
        Case(api, f"{name}: on cuda:0",
             setter(field, lambda x, c: raw(c.keep(a32(x)), device=(KDL_CUDA, 0))),
             n + r".*cuda:0", **lay),
        Case(api, f"{name}: shape[0] = -1", setter(field, lambda x, c: raw(c.keep(a32(x)), shape=[-1])),
             n + r".*shape\[0\] = -1", **lay),
        Case(api, f"{name}: an element 2^40 (list)",
             setter(field, lambda x, c: list(map(int, x))[:-1] + [2**40]),
             n + r"\[\d+\] = 1099511627776 does not fit in int32", **lay),
        Case(api, f"{name}: a float element (list)",
             setter(field, lambda x, c: list(map(int, x))[:-1] + [1.5]),
             n + r"\[\d+\] is a float, not an int", kvattn.DTypeError, **lay),
    ]
    cases.append(Case(api, f"{name}: stride 2", setter(field, lambda x, c: stride2(c.keep(a32(x)), c)),
                      n + r" must be contiguous", **lay))
    if exact_length:
        cases += [
            Case(api, f"{name}: one element short", setter(field, lambda x, c: c.keep(a32(x))[:-1]), n, **lay),
            Case(api, f"{name}: one element more",
                 setter(field, lambda x, c: c.keep(np.append(c.keep(a32(x)), c.keep(a32(x))[-1:]).astype(np.int32))),
                 n, **lay),
        ]
    return cases


def indptr_cases(api, field, name, *, layers=None):
    """fuzz/harness.cpp's indptr_corruptions: indptr[0] != 0, a decrease, empty."""
    lay = dict(layers=layers) if layers else {}
    n = re.escape(name)

    def set_first(v):
        return lambda x, c: c.keep(np.concatenate([[v], np.asarray(x)[1:]]).astype(np.int32))

    def decrease(x, c):
        y = c.keep(np.array(x, np.int32))
        y[len(y) - 1] = y[len(y) - 2] - 2
        return y

    cases = [Case(api, f"{name}[0] = {v}", setter(field, set_first(v)), rf"{n}\[0\] = {v}", **lay)
             for v in (1, -1, 7, I32_MIN)]
    cases += [
        Case(api, f"{name} decreasing", setter(field, decrease), rf"{n} is not non-decreasing", **lay),
        Case(api, f"{name}: empty", setter(field, lambda x, c: np.zeros(0, np.int32)),
             rf"{n}.*(at least one element|0 elements)", **lay),
    ]
    return cases


def set_item(field, i, value):
    """Element i of int32 array field set to value (a copy)."""
    def fn(x, c):
        y = c.keep(np.array(x, np.int32))
        y[i if i >= 0 else len(y) + i] = value
        return y
    return setter(field, fn)


def set_attr(**kw):
    def mutate(call):
        for k, v in kw.items():
            setattr(call.f, k, v(call) if callable(v) else v)
    return mutate


class Call:
    """A legal call's fields (call.f) and every array it was built from (snapshotted)."""

    def __init__(self, rng, **fields):
        self.rng = rng
        self.buffers = []
        self.f = SimpleNamespace(**fields)

    def keep(self, x):
        self.buffers.append(x)
        return x

    def snapshot(self):
        return [bytes(np.ascontiguousarray(b).view(np.uint8).ravel()) if b.size else b""
                for b in self.buffers]


# ---- builders of legal calls and their two callers ---------------------------------------------------
HQ, HKV, D, PS = 4, 2, 16, 4


def poisoned(call, shape, dtype):
    return call.keep(cast(np.full(shape, np.nan), dtype))


def build_decode(rng, dtype="f16", layout="NHD", lens=None):
    c = Call(rng)
    lens = list(rng.integers(1, 14, size=3)) if lens is None else lens
    indptr, indices, last, num_pages = page_table(rng, lens, PS)
    shape = (num_pages, PS, HKV, D) if layout == "NHD" else (num_pages, HKV, PS, D)
    c.f = SimpleNamespace(
        indptr=c.keep(indptr), indices=c.keep(indices), last=c.keep(last), page_size=PS, hq=HQ,
        hkv=HKV, dqk=D, dvo=0, q_dtype=dtype, kv_dtype=None, o_dtype=None, variant=None,
        scheduler=None, layout=layout, wrapper_layout=layout, plan_first=True, return_lse=False,
        fi_kw={}, lens=lens,
        q=c.keep(cast(rand(rng, (len(lens), HQ, D)), dtype)),
        k=c.keep(cast(rand(rng, shape), dtype)), v=c.keep(cast(rand(rng, shape), dtype)),
        out=poisoned(c, (len(lens), HQ, D), dtype), lse=poisoned(c, (len(lens), HQ), "f32"))
    return c


def _cache(f):
    return (f.k, f.v) if f.v is not None else f.k


def native_decode(f):
    w = kvattn.BatchDecode(kv_layout=f.wrapper_layout)
    if f.plan_first:
        w.plan(page_table=(f.indptr, f.indices, f.last), page_size=f.page_size, num_qo_heads=f.hq,
               num_kv_heads=f.hkv, head_dim_qk=f.dqk, head_dim_vo=f.dvo, q_dtype=f.q_dtype,
               kv_dtype=f.kv_dtype, o_dtype=f.o_dtype, variant=f.variant, scheduler=f.scheduler)
    return w.run(f.q, _cache(f), out=f.out, lse=f.lse, return_lse=f.return_lse)


def fi_decode(f):
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, f.wrapper_layout)
    if f.plan_first:
        w.plan(f.indptr, f.indices, f.last, f.hq, f.hkv, f.dqk, f.page_size,
               q_data_type=FI_DTYPE[f.q_dtype], kv_data_type=FI_DTYPE[f.kv_dtype or f.q_dtype],
               **f.fi_kw)
    return w.run(f.q, _cache(f), out=f.out, lse=f.lse, return_lse=f.return_lse)


def _indptr(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _pack_masks(masks):
    """Each request's qo_len x kv_len bits, little-endian, from a byte boundary; and mask_indptr."""
    parts = [np.packbits(m.ravel(), bitorder="little") for m in masks]
    mask_indptr = _indptr([len(p) for p in parts])
    packed = np.concatenate(parts).astype(np.uint8) if parts else np.zeros(0, np.uint8)
    return packed, mask_indptr


def build_prefill(rng, paged=False, mask=False, dtype="f16", dvo=None, qo_lens=None, kv_lens=None):
    c = Call(rng)
    kv_lens = list(rng.integers(3, 12, size=2)) if kv_lens is None else kv_lens
    qo_lens = [int(rng.integers(1, n + 1)) for n in kv_lens] if qo_lens is None else qo_lens
    dvo = D if dvo is None else dvo
    qo_indptr = _indptr(qo_lens)
    f = SimpleNamespace(
        qo_indptr=c.keep(qo_indptr), kv_indptr=None, indptr=None, indices=None, last=None,
        page_size=0, hq=HQ, hkv=HKV, dqk=D, dvo=dvo, q_dtype=dtype, kv_dtype=None, o_dtype=None,
        variant=None, scheduler=None, layout="NHD", wrapper_layout="NHD", plan_first=True,
        return_lse=False, fi_kw={}, custom_mask=None, mask_indptr=None, paged=paged,
        plan_kv_indptr=not paged, plan_page_table=paged, run_paged=paged, masks=None,
        qo_lens=qo_lens, kv_lens=kv_lens,
        q=c.keep(cast(rand(rng, (int(qo_indptr[-1]), HQ, D)), dtype)),
        out=poisoned(c, (int(qo_indptr[-1]), HQ, dvo), dtype),
        lse=poisoned(c, (int(qo_indptr[-1]), HQ), "f32"))
    if paged:
        indptr, indices, last, num_pages = page_table(rng, kv_lens, PS)
        f.indptr, f.indices, f.last, f.page_size = c.keep(indptr), c.keep(indices), c.keep(last), PS
        f.k = c.keep(cast(rand(rng, (num_pages, PS, HKV, D)), dtype))
        f.v = c.keep(cast(rand(rng, (num_pages, PS, HKV, dvo)), dtype))
    else:
        kv_indptr = _indptr(kv_lens)
        f.kv_indptr = c.keep(kv_indptr)
        f.k = c.keep(cast(rand(rng, (int(kv_indptr[-1]), HKV, D)), dtype))
        f.v = c.keep(cast(rand(rng, (int(kv_indptr[-1]), HKV, dvo)), dtype))
    if mask:
        f.masks = [rng.random((a, b)) < 0.6 for a, b in zip(qo_lens, kv_lens)]
        packed, mask_indptr = _pack_masks(f.masks)
        f.custom_mask, f.mask_indptr = c.keep(packed), c.keep(mask_indptr)
        f.variant = kvattn.variants.custom_mask()
    c.f = f
    return c


def native_prefill(f):
    w = kvattn.BatchPrefill(kv_layout=f.wrapper_layout)
    if f.plan_first:
        w.plan(qo_indptr=f.qo_indptr, kv_indptr=f.kv_indptr if f.plan_kv_indptr else None,
               page_table=(f.indptr, f.indices, f.last) if f.plan_page_table else None,
               page_size=f.page_size, custom_mask=f.custom_mask, mask_indptr=f.mask_indptr,
               num_qo_heads=f.hq, num_kv_heads=f.hkv, head_dim_qk=f.dqk, head_dim_vo=f.dvo,
               q_dtype=f.q_dtype, kv_dtype=f.kv_dtype, o_dtype=f.o_dtype, variant=f.variant,
               scheduler=f.scheduler)
    if f.run_paged:
        return w.run(f.q, _cache(f), out=f.out, lse=f.lse, return_lse=f.return_lse)
    return w.run(f.q, f.k, f.v, out=f.out, lse=f.lse, return_lse=f.return_lse)


def fi_prefill(f):
    kw = dict(q_data_type=FI_DTYPE[f.q_dtype], kv_data_type=FI_DTYPE[f.kv_dtype or f.q_dtype],
              head_dim_vo=f.dvo, **f.fi_kw)
    if f.custom_mask is not None:
        kw["packed_custom_mask"] = f.custom_mask
    if f.paged:
        w = fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, f.wrapper_layout)
        if f.plan_first:
            w.plan(f.qo_indptr, f.indptr, f.indices, f.last, f.hq, f.hkv, f.dqk, f.page_size, **kw)
        return w.run(f.q, _cache(f), out=f.out, lse=f.lse, return_lse=f.return_lse)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE, f.wrapper_layout)
    if f.plan_first:
        w.plan(f.qo_indptr, f.kv_indptr, f.hq, f.hkv, f.dqk, **kw)
    return w.run(f.q, f.k, f.v, out=f.out, lse=f.lse, return_lse=f.return_lse)


def build_block_sparse(rng, dtype="f16", R=2, C=3, MB=3, NB=4):
    c = Call(rng)
    rows = [np.sort(rng.choice(NB, size=int(rng.integers(1, NB + 1)), replace=False)) for _ in range(MB)]
    indptr = _indptr([len(r) for r in rows])
    indices = np.concatenate(rows).astype(np.int32)
    M, N = MB * R, NB * C
    c.f = SimpleNamespace(
        bsr_indptr=c.keep(indptr), bsr_indices=c.keep(indices), M=M, N=N, R=R, C=C, hq=HQ, hkv=HKV,
        dqk=D, dvo=0, q_dtype=dtype, kv_dtype=None, o_dtype=None, variant=None, scheduler=None,
        plan_first=True, return_lse=False, rows=rows, fi_kw={},
        q=c.keep(cast(rand(rng, (M, HQ, D)), dtype)), k=c.keep(cast(rand(rng, (N, HKV, D)), dtype)),
        v=c.keep(cast(rand(rng, (N, HKV, D)), dtype)), out=poisoned(c, (M, HQ, D), dtype),
        lse=poisoned(c, (M, HQ), "f32"))
    return c


def native_block_sparse(f):
    w = kvattn.BlockSparseAttention()
    if f.plan_first:
        w.plan(bsr=kvattn.BSRMatrix(f.bsr_indptr, f.bsr_indices, f.M, f.N, f.R, f.C),
               num_qo_heads=f.hq, num_kv_heads=f.hkv, head_dim_qk=f.dqk, head_dim_vo=f.dvo,
               q_dtype=f.q_dtype, kv_dtype=f.kv_dtype, o_dtype=f.o_dtype, variant=f.variant,
               scheduler=f.scheduler)
    return w.run(f.q, f.k, f.v, out=f.out, lse=f.lse, return_lse=f.return_lse)


def fi_block_sparse(f):
    w = fi.BlockSparseAttentionWrapper(WORKSPACE)
    if f.plan_first:
        w.plan(f.bsr_indptr, f.bsr_indices, f.M, f.N, f.R, f.C, f.hq, f.hkv, f.dqk,
               q_data_type=FI_DTYPE[f.q_dtype], kv_data_type=FI_DTYPE[f.kv_dtype or f.q_dtype],
               o_data_type=FI_DTYPE[f.q_dtype], **f.fi_kw)
    return w.run(f.q, f.k, f.v, out=f.out, lse=f.lse, return_lse=f.return_lse)


def build_merge(rng, dtype="f16", n=4, h=2, d=16):
    c = Call(rng)
    c.f = SimpleNamespace(
        v_a=c.keep(cast(rand(rng, (n, h, d)), dtype)), s_a=c.keep(rand(rng, (n, h), -5, 5).astype(np.float32)),
        v_b=c.keep(cast(rand(rng, (n, h, d)), dtype)), s_b=c.keep(rand(rng, (n, h), -5, 5).astype(np.float32)),
        v_out=poisoned(c, (n, h, d), dtype), s_out=poisoned(c, (n, h), "f32"))
    return c


def native_merge(f):
    return kvattn.merge_state(f.v_a, f.s_a, f.v_b, f.s_b, v_out=f.v_out, s_out=f.s_out)


def fi_merge(f):
    return fi.merge_state(f.v_a, f.s_a, f.v_b, f.s_b)


def build_merge_in_place(rng, dtype="f16", n=4, h=2, d=16):
    c = Call(rng)
    c.f = SimpleNamespace(
        v=c.keep(cast(rand(rng, (n, h, d)), dtype)), s=c.keep(rand(rng, (n, h), -5, 5).astype(np.float32)),
        v_other=c.keep(cast(rand(rng, (n, h, d)), dtype)),
        s_other=c.keep(rand(rng, (n, h), -5, 5).astype(np.float32)),
        mask=c.keep((rng.random(n) < 0.5).astype(np.uint8)))
    return c


def native_merge_in_place(f):
    return kvattn.merge_state_in_place(f.v, f.s, f.v_other, f.s_other, f.mask)


def fi_merge_in_place(f):
    return fi.merge_state_in_place(f.v, f.s, f.v_other, f.s_other, f.mask)


def build_merge_states(rng, dtype="f16", n=3, k=3, h=2, d=16):
    c = Call(rng)
    c.f = SimpleNamespace(
        v=c.keep(cast(rand(rng, (n, k, h, d)), dtype)), s=c.keep(rand(rng, (n, k, h), -5, 5).astype(np.float32)),
        v_out=poisoned(c, (n, h, d), dtype), s_out=poisoned(c, (n, h), "f32"))
    return c


def native_merge_states(f):
    return kvattn.merge_states(f.v, f.s, v_out=f.v_out, s_out=f.s_out)


def fi_merge_states(f):
    return fi.merge_states(f.v, f.s)


def build_append(rng, dtype="f16", layout="NHD"):
    c = Call(rng)
    old, new = [3, 0, 6], [2, 4, 1]
    lens = [a + b for a, b in zip(old, new)]
    indptr, indices, last, num_pages = page_table(rng, lens, PS)
    shape = (num_pages, PS, HKV, D) if layout == "NHD" else (num_pages, HKV, PS, D)
    batch = np.concatenate([[b] * n for b, n in enumerate(new)]).astype(np.int32)
    pos = np.concatenate([np.arange(o, o + n) for o, n in zip(old, new)]).astype(np.int32)
    c.f = SimpleNamespace(
        append_k=c.keep(cast(rand(rng, (len(batch), HKV, D)), dtype)),
        append_v=c.keep(cast(rand(rng, (len(batch), HKV, D)), dtype)),
        batch_indices=c.keep(batch), positions=c.keep(pos), indptr=c.keep(indptr),
        indices=c.keep(indices), last=c.keep(last), layout=layout, lens=lens,
        k=c.keep(cast(rand(rng, shape), dtype)), v=c.keep(cast(rand(rng, shape), dtype)))
    return c


def native_append(f):
    return kvattn.append_paged_kv_cache(f.append_k, f.append_v, f.batch_indices, f.positions,
                                        _cache(f), (f.indptr, f.indices, f.last), kv_layout=f.layout)


def fi_append(f):
    return fi.append_paged_kv_cache(f.append_k, f.append_v, f.batch_indices, f.positions, _cache(f),
                                    f.indices, f.indptr, f.last, kv_layout=f.layout)


def build_rope(rng, dtype="f16", n=5, hq=4, hk=2, d=16):
    c = Call(rng)
    c.f = SimpleNamespace(
        q=c.keep(cast(rand(rng, (n, hq, d)), dtype)), k=c.keep(cast(rand(rng, (n, hk, d)), dtype)),
        pos_ids=c.keep(rng.integers(0, 100, size=n).astype(np.int32)),
        q_out=poisoned(c, (n, hq, d), dtype), k_out=poisoned(c, (n, hk, d), dtype), rotary_dim=0,
        rope_scale=1.0, rope_theta=1e4, interleave=False, llama31=None)
    return c


def native_rope(f):
    return kvattn.apply_rope(f.q, f.k, f.pos_ids, q_out=f.q_out, k_out=f.k_out, rotary_dim=f.rotary_dim,
                             rope_scale=f.rope_scale, rope_theta=f.rope_theta, interleave=f.interleave,
                             llama31=f.llama31)


def fi_rope(f):
    """kvattn.flashinfer.apply_rope_pos_ids: the outputs are allocated (like q and k)."""
    if f.llama31 is not None:
        raise AssertionError("llama31 cases are native only")
    return fi.apply_rope_pos_ids(f.q, f.k, f.pos_ids, rotary_dim=f.rotary_dim or None,
                                 interleave=f.interleave, rope_scale=f.rope_scale,
                                 rope_theta=f.rope_theta)


def build_planner(rng):
    c = Call(rng)
    kv = [int(x) for x in rng.integers(1, 200, size=3)]
    qo = [int(rng.integers(1, n + 1)) for n in kv]
    c.f = SimpleNamespace(qo_indptr=list(map(int, _indptr(qo))), kv_len=kv, hq=HQ, hkv=HKV, dqk=64,
                          dvo=0, tile=None, causal=False, window_left=-1,
                          options=kvattn.SchedulerOptions(num_workers=2))
    return c


def native_planner(f):
    return kvattn.make_plan(qo_indptr=f.qo_indptr, kv_len=f.kv_len, num_qo_heads=f.hq,
                            num_kv_heads=f.hkv, head_dim_qk=f.dqk, head_dim_vo=f.dvo, tile=f.tile,
                            causal=f.causal, window_left=f.window_left, options=f.options)


APIS = {
    "decode": (build_decode, native_decode, fi_decode),
    "prefill_ragged": (build_prefill, native_prefill, fi_prefill),
    "prefill_mask": (lambda rng: build_prefill(rng, mask=True), native_prefill, fi_prefill),
    "prefill_paged": (lambda rng: build_prefill(rng, paged=True), native_prefill, fi_prefill),
    "block_sparse": (build_block_sparse, native_block_sparse, fi_block_sparse),
    "merge_state": (build_merge, native_merge, fi_merge),
    "merge_state_in_place": (build_merge_in_place, native_merge_in_place, fi_merge_in_place),
    "merge_states": (build_merge_states, native_merge_states, fi_merge_states),
    "append": (build_append, native_append, fi_append),
    "apply_rope": (build_rope, native_rope, fi_rope),
    "planner": (build_planner, native_planner, None),
}


# ---- the corruption lists ----------------------------------------------------------------------------
NATIVE = ("native",)


def _vset(**fields):
    """A variant with fields set (native only: the FlashInfer forms are below)."""
    def mutate(call):
        v = kvattn.Variant() if call.f.variant is None else call.f.variant
        for k, val in fields.items():
            setattr(v, k, val)
        call.f.variant = v
    return mutate


def _rope_set(llama31=None, **fields):
    def mutate(call):
        r = kvattn.RopeConfig()
        for k, val in fields.items():
            setattr(r, k, val)
        if llama31 is not None:
            r.llama31 = kvattn.Llama31Scaling(**llama31)
        v = kvattn.Variant() if call.f.variant is None else call.f.variant
        call.f.variant = v.with_rope(r)
    return mutate


def _sched(**kw):
    def mutate(call):
        call.f.scheduler = kvattn.SchedulerOptions(**kw)
    return mutate


def _graph(batch_delta=0, tokens_delta=0, **kw):
    def mutate(call):
        f = call.f
        batch = len(f.q) if not hasattr(f, "qo_indptr") or f.qo_indptr is None else len(f.qo_indptr) - 1
        if hasattr(f, "bsr_indptr"):
            batch = len(f.bsr_indptr) - 1
        tokens = len(f.q)
        cap = dict(max_batch=max(1, batch) + batch_delta, max_tokens=max(1, tokens) + tokens_delta)
        cap.update(kw)
        f.scheduler = kvattn.SchedulerOptions(cuda_graph=kvattn.GraphCapacity(**cap))
    return mutate


def _view_into(base, dtype, shape, offset_elems=0, values=None):
    """A view of `shape` and `dtype` over base's bytes from element offset_elems of base."""
    flat = base.reshape(-1).view(np.uint8)[offset_elems * base.itemsize:]
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    v = flat[:n].view(dtype).reshape(shape)
    if values is not None:
        v[...] = values
    return v


def attention_cases(api):
    paged = api in ("decode", "prefill_paged")
    prefill = api.startswith("prefill")
    fi_ok = ("native", "flashinfer")
    c = []
    # Shape and dtypes of the plan.
    for v in (0, -1, HQ + 1):
        c.append(Case(api, f"num_qo_heads = {v}", set_attr(hq=v), rf"num_qo_heads = {v}", layers=fi_ok))
    for v in (0, -2, 3):
        c.append(Case(api, f"num_kv_heads = {v}", set_attr(hkv=v), rf"num_kv_heads = {v}", layers=fi_ok))
    for v in (0, 7, 12, 520, -8, 8):
        c.append(Case(api, f"head_dim_qk = {v}", set_attr(dqk=v), rf"head_dim_qk = {v}",
                      layers=fi_ok if api != "decode" else ("native", "flashinfer")))
    for v in (7, 12, 520, -8, 8):
        c.append(Case(api, f"head_dim_vo = {v}", set_attr(dvo=v), rf"head_dim_vo = {v}",
                      layers=("native", "flashinfer") if prefill else NATIVE))
    c += [
        Case(api, "q_dtype = f32 (q is f16)", set_attr(q_dtype="f32"),
             r"q has dtype f16 but the plan was made for q_dtype = f32", kvattn.DTypeError, layers=fi_ok),
        Case(api, "q_dtype = i32", set_attr(q_dtype="i32"), r"q_dtype", kvattn.DTypeError, layers=fi_ok),
        Case(api, "q_dtype = e4m3", set_attr(q_dtype="e4m3"), r"q_dtype", kvattn.DTypeError, layers=fi_ok),
        Case(api, "q_dtype = f64", set_attr(q_dtype="f64"), r"q_dtype: unknown dtype 'f64'",
             kvattn.DTypeError, layers=NATIVE),
        Case(api, "kv_dtype = f32 (the cache is f16)", set_attr(kv_dtype="f32"),
             r"(paged k|^k) has dtype f16 but the plan was made for kv_dtype = f32", kvattn.DTypeError,
             layers=fi_ok),
        Case(api, "kv_dtype = u8", set_attr(kv_dtype="u8"), r"kv_dtype", kvattn.DTypeError, layers=fi_ok),
        Case(api, "o_dtype = f32 (out is f16)", set_attr(o_dtype="f32"),
             r"out has dtype f16 but the plan was made for o_dtype = f32", kvattn.DTypeError, layers=NATIVE),
        Case(api, "o_dtype = u8", set_attr(o_dtype="u8"), r"o_dtype", kvattn.DTypeError, layers=NATIVE),
    ]
    # The variant's values (native: kvattn.Variant; FlashInfer: its plan arguments).
    for w in (-2, -7, I32_MIN):
        c.append(Case(api, f"window_left = {w}", _vset(window_left=w), rf"window_left = {w}", layers=NATIVE))
    for cap in (-1.0, -0.5, math.nan, math.inf):
        c.append(Case(api, f"logits_soft_cap = {cap}", _vset(logits_soft_cap=cap),
                      rf"logits_soft_cap = {cap:g}".replace("nan", "nan").replace("inf", "inf"),
                      layers=NATIVE))
        c.append(Case(api, f"logits_soft_cap = {cap} (flashinfer)",
                      set_attr(fi_kw=dict(logits_soft_cap=cap)), r"logits_soft_cap", layers=fi_ok[1:]))
    for x in (math.nan, math.inf, -math.inf):
        c.append(Case(api, f"sm_scale = {x}", _vset(sm_scale=x), r"sm_scale", layers=NATIVE))
        c.append(Case(api, f"sm_scale = {x} (flashinfer)", set_attr(fi_kw=dict(sm_scale=x)), r"sm_scale",
                      layers=fi_ok[1:]))
        for s in ("q_scale", "k_scale", "v_scale"):
            c.append(Case(api, f"{s} = {x}", _vset(**{s: x}), rf"{s}", layers=NATIVE))
        c.append(Case(api, f"sigmoid_bias = {x}", _vset(sigmoid=True, sigmoid_bias=x), r"sigmoid_bias",
                      layers=NATIVE))
    for x in (0.0, -1.0, math.nan):
        c.append(Case(api, f"rope_theta = {x}", _rope_set(rope_theta=x), r"rope_theta", layers=NATIVE))
        c.append(Case(api, f"rope_scale = {x}", _rope_set(rope_scale=x), r"rope_scale", layers=NATIVE))
        c.append(Case(api, f"rope_theta = {x} (flashinfer)",
                      set_attr(fi_kw=dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=x)), r"rope_theta",
                      layers=fi_ok[1:]))
        c.append(Case(api, f"llama31 factor = {x}", _rope_set(llama31=dict(factor=x)), r"factor",
                      layers=NATIVE))
        c.append(Case(api, f"llama31 original_max_position = {x}",
                      _rope_set(llama31=dict(original_max_position=x)), r"original_max_position",
                      layers=NATIVE))
    c.append(Case(api, "llama31 high_freq_factor = low_freq_factor",
                  _rope_set(llama31=dict(low_freq_factor=2.0, high_freq_factor=2.0)), r"high_freq_factor",
                  layers=NATIVE))
    if api == "decode":
        c.append(Case(api, "custom_mask on without a mask", _vset(custom_mask=True),
                      r"the variant has custom_mask on but no custom_mask was given", layers=NATIVE))
    if api in ("prefill_ragged", "prefill_paged"):
        c.append(Case(api, "custom_mask on without a mask", _vset(custom_mask=True), r"custom_mask",
                      layers=NATIVE))
    if api == "prefill_mask":
        c.append(Case(api, "custom_mask off with a mask given", set_attr(variant=None), r"custom_mask",
                      layers=NATIVE))
    c.append(Case(api, "sigmoid with an lse given", _vset(sigmoid=True),
                  r"lse was requested but sigmoid attention has no lse", layers=NATIVE))
    # Scheduler options.
    for w in (-1, -64):
        c.append(Case(api, f"num_workers = {w}", _sched(num_workers=w), rf"num_workers = {w}", layers=NATIVE))
    for s in (-1, I32_MIN):
        c.append(Case(api, f"fixed_split_size = {s}", _sched(fixed_split_size=s),
                      rf"fixed_split_size = {s}", layers=NATIVE))
    for field, v in (("per_item", -1), ("per_query_row", -3), ("per_kv_token", -1), ("per_partial_row", -8)):
        c.append(Case(api, f"cost.{field} = {v}", _sched(cost=kvattn.CostModel(**{field: v})), field,
                      layers=NATIVE))
    c.append(Case(api, "cost all zero", _sched(cost=kvattn.CostModel(per_item=0, per_query_row=0, per_kv_token=0)),
                  r"cost", layers=NATIVE))
    c += [
        Case(api, "cuda_graph.max_batch below the batch", _graph(batch_delta=-1), r"max_batch", layers=NATIVE),
        Case(api, "cuda_graph.max_tokens below the tokens", _graph(tokens_delta=-1), r"max_tokens",
             layers=NATIVE),
        Case(api, "cuda_graph.max_split_items = -2", _graph(max_split_items=-2), r"max_split_items",
             layers=NATIVE),
    ]
    # Query, output, lse and ragged K/V tensors.
    c += tensor_cases(api, "q", "q", exact_dims=(0, 1, 2), layers=fi_ok)
    c += tensor_cases(api, "out", "out", exact_dims=(0, 1, 2), output=True, layers=fi_ok)
    c += [x for x in tensor_cases(api, "lse", "lse", exact_dims=(0, 1), output=True, wrong_dtype="f16",
                                  layers=fi_ok) if "head-dim stride 2" not in x.name]
    if not paged:
        c += tensor_cases(api, "k", "k", exact_dims=(0, 1, 2), layers=fi_ok)
        c += tensor_cases(api, "v", "v", exact_dims=(0, 1, 2), layers=fi_ok)
    kfield = "k"
    c += [
        Case(api, "out overlaps q", set_attr(out=lambda c: _view_into(c.f.q, c.f.q.dtype, c.f.out.shape)),
             r"^out .*overlaps", layers=fi_ok),
        Case(api, "out overlaps k", lambda c: _shared(c, "k", "out", c.f.out.shape, c.f.out.dtype),
             r"^out .*overlaps", layers=fi_ok),
        Case(api, "out overlaps v shifted 3 elements",
             lambda c: _shared(c, "v", "out", c.f.out.shape, c.f.out.dtype, 3),
             r"^out .*overlaps", layers=fi_ok),
        Case(api, "lse overlaps out", set_attr(lse=lambda c: _view_into(c.f.out, np.float32, c.f.lse.shape)),
             r"^lse .*overlaps|^out .*overlaps", layers=fi_ok),
        Case(api, "lse overlaps q", set_attr(lse=lambda c: _view_into(c.f.q, np.float32, c.f.lse.shape)),
             r"^lse .*overlaps", layers=fi_ok),
        Case(api, "out with heads at stride 0 (hardening)",
             set_attr(out=lambda c: np.lib.stride_tricks.as_strided(
                 c.keep(np.full((len(c.f.q) + 1,) + c.f.out.shape[1:], np.nan, c.f.out.dtype)),
                 shape=c.f.out.shape, strides=(c.f.out.strides[0], 0, c.f.out.strides[2]))),
             r"^out .*has elements that share memory", layers=fi_ok),
        Case(api, "run() before plan()", set_attr(plan_first=False), r"run\(\) was called before plan\(\)",
             layers=NATIVE),
        Case(api, "run() before plan() (flashinfer)", set_attr(plan_first=False), r"before plan",
             RuntimeError, layers=fi_ok[1:]),
    ]
    del kfield
    if paged:
        c += paged_table_cases(api, layers=("native", "flashinfer"))
        for ps in (0, -1, PS + 1, PS - 1):
            c.append(Case(api, f"page_size = {ps}", set_attr(page_size=ps),
                          r"page_size = |paged k|kv_last_page_len\[\d+\] = \d+ is out of range|qo_len = \d+ > kv_len",
                          layers=("native", "flashinfer")))
        c += tensor_cases(api, "k", "paged k", exact_dims=(1, 2, 3))
        c += tensor_cases(api, "v", "paged v", exact_dims=(1, 2, 3))
        c += [
            Case(api, "cache of max_id pages (page id max_id used)",
                 set_attr(k=lambda c: c.f.k[:int(np.max(c.f.indices))],
                          v=lambda c: c.f.v[:int(np.max(c.f.indices))]),
                 r"kv_indices\[\d+\] = \d+ is out of range \[0, \d+\)"),
            Case(api, "paged v with one page less than k", set_attr(v=lambda c: c.f.v[:-1]), r"paged v"),
            Case(api, "wrapper layout HND over an NHD cache", set_attr(wrapper_layout="HND"), r"paged k"),
            Case(api, "a 5-D cache of another layout (pages, 3, ...)",
                 set_attr(k=lambda c: c.keep(np.stack([c.f.k, c.f.v, c.f.v], axis=1)), v=None),
                 r"paged kv"),
        ]
    if prefill:
        c += indptr_cases(api, "qo_indptr", "qo_indptr")
        c += index_cases(api, "qo_indptr", "qo_indptr", exact_length=True)
        c += [
            Case(api, "qo_indptr[-1] = INT32_MAX", set_item("qo_indptr", -1, I32_MAX), r"qo_indptr|qo_len"),
        ]
        if not paged:
            c += indptr_cases(api, "kv_indptr", "kv_indptr")
            c += index_cases(api, "kv_indptr", "kv_indptr", exact_length=True)
            c += [
                Case(api, "kv_indptr[-1] = INT32_MAX (hardening)", set_item("kv_indptr", -1, I32_MAX),
                     r"KV tokens exceed the limit of 2147418112|kv_indptr"),
                Case(api, "no kv_indptr and no page table", set_attr(plan_kv_indptr=False),
                     r"kv_indptr \(ragged KV\) or page_table \(paged KV\) is required", layers=NATIVE),
                Case(api, "run() with 4-D (paged) k, v on a ragged plan",
                     set_attr(k=lambda c: c.f.k[:, None], v=lambda c: c.f.v[:, None]),
                     r"^k must be 3-D"),
            ]
        else:
            c += [
                Case(api, "both kv_indptr and a page table",
                     set_attr(plan_kv_indptr=True, kv_indptr=lambda c: c.keep(_indptr(c.f.kv_lens))),
                     r"not both", layers=NATIVE),
                Case(api, "no kv_indptr and no page table", set_attr(plan_page_table=False),
                     r"is required", layers=NATIVE),
                Case(api, "run() with ragged k, v on a paged plan",
                     set_attr(run_paged=False, k=lambda c: c.f.q, v=lambda c: c.f.q), r"paged|ragged",
                     layers=NATIVE),
            ]
    if api == "prefill_mask":
        c += [
            Case(api, "custom_mask: dtype i32", setter("custom_mask", lambda x, c: c.keep(x.astype(np.int32))),
                 r"custom_mask has dtype i32", kvattn.DTypeError),
            Case(api, "custom_mask: dtype f32", setter("custom_mask", lambda x, c: c.keep(x.astype(np.float32))),
                 r"custom_mask has dtype f32", kvattn.DTypeError),
            Case(api, "custom_mask: 2-D", setter("custom_mask", lambda x, c: x[:, None]), named("custom_mask")),
            Case(api, "custom_mask: stride 2", setter("custom_mask", lambda x, c: with_stride(c, x, 0, 2)),
                 named("custom_mask")),
            Case(api, "custom_mask: null data", setter("custom_mask", lambda x, c: raw(x, data=0)),
                 r"custom_mask has a null data pointer"),
            Case(api, "custom_mask: on cuda:0", setter("custom_mask", lambda x, c: raw(x, device=(KDL_CUDA, 0))),
                 r"custom_mask.*cuda:0"),
            Case(api, "custom_mask shorter than mask_indptr[-1]", setter("custom_mask", lambda x, c: x[:-1]),
                 named("custom_mask")),
        ]
        c += indptr_cases(api, "mask_indptr", "mask_indptr", layers=NATIVE)
        c += index_cases(api, "mask_indptr", "mask_indptr", exact_length=True, layers=NATIVE)

        def short_mask(call):
            f = call.f
            need = (f.qo_lens[0] * f.kv_lens[0] + 7) // 8
            f.mask_indptr = call.keep(np.array(f.mask_indptr, np.int32))
            f.mask_indptr[1] = f.mask_indptr[0] + need - 1

        c.append(Case(api, "request 0's mask one byte short", short_mask, r"mask_indptr", layers=NATIVE))
    if api == "block_sparse":
        c += block_sparse_cases(api)
    return c


def paged_table_cases(api, layers):
    lay = dict(layers=layers)
    c = indptr_cases(api, "indptr", "kv_indptr", **lay)
    c += index_cases(api, "indptr", "kv_indptr", exact_length=True, **lay)
    c.append(Case(api, "kv_indptr[-1] past the end of kv_indices",
                  setter("indptr", lambda x, c: c.keep(np.append(x[:-1], len(c.f.indices) + 1).astype(np.int32))),
                  r"kv_indptr|kv_indices", **lay))
    c += index_cases(api, "indices", "kv_indices", exact_length=False, **lay)
    for bad in ("num_pages", "num_pages + 7", I32_MAX, -1, I32_MIN):
        def value(c, bad=bad):
            n = c.f.k.shape[0]
            return {"num_pages": n, "num_pages + 7": n + 7}.get(bad, bad)
        want = r"kv_indices\[\d+\] = -?\d+ is (negative|out of range \[0, \d+\))"
        c.append(Case(api, f"kv_indices[-1] = {bad}",
                      lambda call, value=value: set_item("indices", -1, value(call))(call), want, **lay))
    c.append(Case(api, "kv_indices shorter than kv_indptr[-1]", setter("indices", lambda x, c: x[:-1]),
                  r"kv_indices", **lay))
    c += index_cases(api, "last", "kv_last_page_len", exact_length=True, **lay)
    for bad in (0, -1, PS + 1, I32_MAX):
        c.append(Case(api, f"kv_last_page_len[1] = {bad}", set_item("last", 1, bad),
                      rf"kv_last_page_len\[1\] = {bad}", **lay))
    return c


def block_sparse_cases(api):
    c = []

    def resize_rows(call, rows):
        f = call.f
        f.q = fresh(call, f.q, (rows,) + f.q.shape[1:])
        f.out = fresh(call, f.out, (rows,) + f.out.shape[1:])
        f.lse = fresh(call, f.lse, (rows,) + f.lse.shape[1:])

    def m_plus_one(call):  # M not a multiple of R; q, out, lse of M + 1 rows
        call.f.M += 1
        resize_rows(call, call.f.M)

    def n_plus_one(call):  # N not a multiple of C; k, v of N + 1 rows
        f = call.f
        f.N += 1
        f.k = fresh(call, f.k, (f.N,) + f.k.shape[1:])
        f.v = fresh(call, f.v, (f.N,) + f.v.shape[1:])

    c += [
        Case(api, "bsr M not a multiple of R", m_plus_one, r"bsr M = 7 is not a multiple of R = 2",
             layers=NATIVE),
        # FlashInfer's M need not be a multiple of R (ceil(M / R) block rows): indptr is then short.
        Case(api, "bsr M not a multiple of R (flashinfer)", m_plus_one,
             r"bsr indptr has 4 elements but 5 are expected", layers=("flashinfer",)),
        Case(api, "bsr N not a multiple of C", n_plus_one, r"bsr N = 13 is not a multiple of C = 3"),
        Case(api, "bsr R = 0", set_attr(R=0), r"bsr block size R x C = 0 x 3"),
        Case(api, "bsr C = -C", set_attr(C=-3), r"bsr block size R x C = 2 x -3"),
        Case(api, "bsr M = R = 2^32 (hardening)", set_attr(M=2**32, R=2**32), r"bsr M = 4294967296 is out of range"),
        Case(api, "bsr N = C = 2^32 (hardening)", set_attr(N=2**32, C=2**32), r"bsr N = 4294967296 is out of range"),
        Case(api, "bsr N = -N - C", set_attr(N=-15), r"N = -15"),
        Case(api, "bsr M past the token limit",
             set_attr(M=lambda c: (kvattn.MAX_TOTAL_TOKENS // 2 + 1) * 2), r"bsr M = \d+"),
        Case(api, "bsr C, N past the KV limit",
             set_attr(N=lambda c: (kvattn.MAX_KV_LEN // 12 + 1) * 12, C=lambda c: (kvattn.MAX_KV_LEN // 12 + 1) * 12),
             r"bsr N = \d+|bsr C = \d+"),
        Case(api, "bsr M = 2^64 (not an int64)", set_attr(M=2**64), r"BSRMatrix|M", TypeError),
    ]
    c += indptr_cases(api, "bsr_indptr", "bsr indptr")
    c += index_cases(api, "bsr_indptr", "bsr indptr", exact_length=True)
    c.append(Case(api, "bsr indptr[-1] past the end of bsr indices",
                  setter("bsr_indptr", lambda x, c: c.keep(np.append(x[:-1], len(c.f.bsr_indices) + 1).astype(np.int32))),
                  r"bsr indptr|bsr indices"))
    c += index_cases(api, "bsr_indices", "bsr indices", exact_length=False)
    for bad in ("N / C", "N / C + 3", I32_MAX, -1, I32_MIN):
        def value(c, bad=bad):
            nb = c.f.N // c.f.C
            return {"N / C": nb, "N / C + 3": nb + 3}.get(bad, bad)
        c.append(Case(api, f"bsr indices[0] = {bad}",
                      lambda call, value=value: set_item("bsr_indices", 0, value(call))(call),
                      r"bsr indices\[0\] = -?\d+"))

    def repeated(call):
        f = call.f
        row0 = list(f.rows[0])
        rows = [row0 + row0[:1]] + [list(r) for r in f.rows[1:]]
        f.bsr_indptr = call.keep(_indptr([len(r) for r in rows]))
        f.bsr_indices = call.keep(np.concatenate(rows).astype(np.int32))

    c.append(Case(api, "bsr indices[0] repeated in its block row", repeated, r"bsr indices"))
    return c


def _shared(call, a_field, b_field, b_shape, b_dtype, offset=0):
    """Fields a and b over one buffer: a keeps its values, b starts `offset` elements of a's dtype
    into a (a view of b_shape, b_dtype); both kept."""
    f = call.f
    a = getattr(f, a_field)
    nbytes = max(a.nbytes, offset * a.itemsize + int(np.prod(b_shape)) * np.dtype(b_dtype).itemsize)
    buf = call.keep(np.zeros(nbytes + 16, np.uint8))
    a2 = buf[:a.nbytes].view(a.dtype).reshape(a.shape)
    a2[...] = a
    b2 = buf[offset * a.itemsize: offset * a.itemsize + int(np.prod(b_shape)) * np.dtype(b_dtype).itemsize]
    b2 = b2.view(b_dtype).reshape(b_shape)
    setattr(f, a_field, a2)
    setattr(f, b_field, b2)


def merge_cases():
    api = "merge_state"
    c = []
    for fld in ("v_a", "v_b"):
        c += tensor_cases(api, fld, fld, exact_dims=(0, 1, 2), fi_allocates_like=fld == "v_a")
    c += tensor_cases(api, "v_out", "v_out", exact_dims=(0, 1, 2), output=True, wrong_dtype="i32", layers=NATIVE)
    for fld in ("s_a", "s_b"):
        c += [x for x in tensor_cases(api, fld, fld, exact_dims=(0, 1), wrong_dtype="f16")
              if "head-dim stride 2" not in x.name and "head-dim stride 0" not in x.name]
    c += [x for x in tensor_cases(api, "s_out", "s_out", exact_dims=(0, 1), output=True, wrong_dtype="f16",
                                  layers=NATIVE) if "head-dim stride 2" not in x.name]
    c += [
        Case(api, "v_out partially overlaps v_a (one element)",
             lambda call: _shared(call, "v_a", "v_out", call.f.v_out.shape, call.f.v_out.dtype, 1),
             r"^v_out .*overlaps", layers=NATIVE),
        Case(api, "v_out overlaps v_a shifted one row (hardening)",
             lambda call: _shared(call, "v_a", "v_out", call.f.v_out.shape, call.f.v_out.dtype,
                                  call.f.v_a.shape[1] * call.f.v_a.shape[2]),
             r"^v_out \(f16\[4, 2, 16\] on cpu", layers=NATIVE),
        Case(api, "v_out partially overlaps v_b",
             lambda call: _shared(call, "v_b", "v_out", call.f.v_out.shape, call.f.v_out.dtype, 1),
             r"^v_out .*overlaps", layers=NATIVE),
        Case(api, "v_out overlaps s_a",
             lambda call: _shared(call, "s_a", "v_out", call.f.v_out.shape, call.f.v_out.dtype),
             r"^v_out .*overlaps", layers=NATIVE),
        Case(api, "s_out overlaps v_out",
             lambda call: _shared(call, "v_out", "s_out", call.f.s_out.shape, np.float32),
             r"(^s_out|^v_out) .*overlaps", layers=NATIVE),
        Case(api, "s_out partially overlaps s_b",
             lambda call: _shared(call, "s_b", "s_out", call.f.s_out.shape, np.float32, 1),
             r"^s_out .*overlaps", layers=NATIVE),
        Case(api, "v_out at v_a's address with another dtype",
             lambda call: _shared(call, "v_a", "v_out", call.f.v_out.shape, np.float32),
             r"^v_out aliases v_a with other strides or shape", layers=NATIVE),
    ]
    return c


def merge_in_place_cases():
    api = "merge_state_in_place"
    c = tensor_cases(api, "v", "v", exact_dims=(0, 1, 2), output=True)
    c += tensor_cases(api, "v_other", "v_other", exact_dims=(0, 1, 2))
    c += [x for x in tensor_cases(api, "s", "s", exact_dims=(0, 1), output=True, wrong_dtype="f16")
          if "head-dim stride 2" not in x.name]
    c += [x for x in tensor_cases(api, "s_other", "s_other", exact_dims=(0, 1), wrong_dtype="f16")
          if "head-dim stride" not in x.name]
    m = named("mask")
    c += [
        Case(api, "mask: dtype i32", setter("mask", lambda x, c: c.keep(x.astype(np.int32))), r"mask has dtype i32",
             kvattn.DTypeError),
        Case(api, "mask: dtype f32", setter("mask", lambda x, c: c.keep(x.astype(np.float32))), r"mask has dtype f32",
             kvattn.DTypeError),
        Case(api, "mask: dtype f16", setter("mask", lambda x, c: c.keep(x.astype(np.float16))), r"mask has dtype f16",
             kvattn.DTypeError),
        Case(api, "mask: 2-D", setter("mask", lambda x, c: x[:, None]), m),
        Case(api, "mask: length + 1", setter("mask", lambda x, c: c.keep(np.append(x, 1).astype(np.uint8))), m),
        Case(api, "mask: length - 1", setter("mask", lambda x, c: x[:-1]), m),
        Case(api, "mask: null data", setter("mask", lambda x, c: raw(x, data=0)), r"mask has a null data pointer"),
        Case(api, "mask: on cuda:0", setter("mask", lambda x, c: raw(x, device=(KDL_CUDA, 0))), r"mask.*cuda:0"),
        Case(api, "mask overlaps v",
             lambda call: _shared(call, "v", "mask", call.f.mask.shape, np.uint8), r"mask|^v "),
        Case(api, "v_other partially overlaps v",
             lambda call: _shared(call, "v", "v_other", call.f.v_other.shape, call.f.v_other.dtype, 1),
             r"v_other .*overlaps|^v .*overlaps"),
        Case(api, "s overlaps v", lambda call: _shared(call, "v", "s", call.f.s.shape, np.float32),
             r"^(s|v) .*overlaps"),
        Case(api, "v overlaps s_other",
             lambda call: _shared(call, "s_other", "v", call.f.v.shape, call.f.v.dtype),
             r"^(v|s_other) .*overlaps"),
    ]
    return c


def merge_states_cases():
    api = "merge_states"
    # (kvattn.flashinfer allocates the outputs from v's shape: its head dim is free.)
    c = tensor_cases(api, "v", "v", exact_dims=(0, 1, 2), wrong_dtype="i32", fi_allocates_like=True)
    c += tensor_cases(api, "v", "v", exact_dims=(3,), wrong_dtype="i32", layers=NATIVE)[-2:]
    c += tensor_cases(api, "v_out", "v_out", exact_dims=(0, 1, 2), output=True, wrong_dtype="i32", layers=NATIVE)
    c += [x for x in tensor_cases(api, "s", "s", exact_dims=(0, 1, 2), wrong_dtype="f16")
          if "head-dim stride" not in x.name]
    c += [x for x in tensor_cases(api, "s_out", "s_out", exact_dims=(0, 1), output=True, wrong_dtype="f16",
                                  layers=NATIVE) if "head-dim stride 2" not in x.name]
    c += [
        Case(api, "v_out overlaps v (not state 0 exactly)",
             lambda call: _shared(call, "v", "v_out", call.f.v_out.shape, call.f.v_out.dtype),
             r"^v_out .*overlaps", layers=NATIVE),
        Case(api, "s_out overlaps s",
             lambda call: _shared(call, "s", "s_out", call.f.s_out.shape, np.float32), r"^s_out .*overlaps",
             layers=NATIVE),
        Case(api, "s_out overlaps v_out",
             lambda call: _shared(call, "v_out", "s_out", call.f.s_out.shape, np.float32),
             r"^(s_out|v_out) .*overlaps", layers=NATIVE),
    ]
    return c


def append_cases():
    api = "append"
    c = tensor_cases(api, "append_k", "append_k", exact_dims=(0, 1, 2), wrong_dtype="i32")
    c += tensor_cases(api, "append_v", "append_v", exact_dims=(0, 1, 2), wrong_dtype="i32")
    c += tensor_cases(api, "k", "paged k", exact_dims=(0, 1, 2, 3), output=True, wrong_dtype="i32")
    c += tensor_cases(api, "v", "paged v", exact_dims=(0, 1, 2, 3), output=True, wrong_dtype="i32")
    c += index_cases(api, "batch_indices", "batch_indices", exact_length=True)
    c += index_cases(api, "positions", "positions", exact_length=True)
    for bad in (3, 5, -1, I32_MIN):
        c.append(Case(api, f"batch_indices[1] = {bad}", set_item("batch_indices", 1, bad),
                      rf"batch_indices\[1\] = {bad}"))
    for bad in ("kv_len", "kv_len + 5", -1, I32_MAX):
        def value(c, bad=bad):
            n = c.f.lens[int(c.f.batch_indices[1])]
            return {"kv_len": n, "kv_len + 5": n + 5}.get(bad, bad)
        c.append(Case(api, f"positions[1] = {bad}", lambda call, value=value: set_item("positions", 1, value(call))(call),
                      r"positions\[1\] = -?\d+"))

    def same_slot(call):
        f = call.f
        f.batch_indices = call.keep(np.array(f.batch_indices))
        f.positions = call.keep(np.array(f.positions))
        f.batch_indices[3], f.positions[3] = f.batch_indices[0], f.positions[0]

    c.append(Case(api, "rows 0 and 3 on one slot", same_slot, r"same slot|slot"))
    c += paged_table_cases(api, layers=("native", "flashinfer"))

    def indptr_in_v(call):
        f = call.f
        f.indptr = _view_into(f.v, np.int32, f.indptr.shape, values=f.indptr)

    c += [
        Case(api, "append_k overlaps paged k",
             set_attr(append_k=lambda c: _view_into(c.f.k, c.f.append_k.dtype, c.f.append_k.shape)),
             r"append_k|paged k"),
        Case(api, "kv_indptr inside paged v", indptr_in_v, r"kv_indptr|paged v"),
        Case(api, "paged v overlaps paged k", set_attr(v=lambda c: c.f.k), r"paged v|paged k"),
    ]
    return c


def rope_cases():
    """(kvattn.flashinfer.apply_rope_pos_ids allocates the outputs like q and k: their head counts
    are free there, and the outputs' own corruptions are the native API's.)"""
    api = "apply_rope"
    c = []
    for name in ("q", "k"):
        c += tensor_cases(api, name, name, exact_dims=(0, 2), fi_allocates_like=True)
        c += tensor_cases(api, name, name, exact_dims=(1,), layers=NATIVE)[-2:]
    c += tensor_cases(api, "q_out", "q_out", exact_dims=(0, 1, 2), output=True, layers=NATIVE)
    c += tensor_cases(api, "k_out", "k_out", exact_dims=(0, 1, 2), output=True, layers=NATIVE)
    c += index_cases(api, "pos_ids", "pos_ids", exact_length=True)
    for case in c:  # legal through kvattn.flashinfer: outputs of q's / k's own dtype, int64 positions
        if case.name in ("q: dtype f32", "k: dtype f32", "pos_ids: dtype int64"):
            case.layers = NATIVE
    for rd in (15, 18, -2, I32_MIN):
        c.append(Case(api, f"rotary_dim = {rd}", set_attr(rotary_dim=rd), rf"rotary_dim = {rd}"))
    for x in (0.0, -1.0, math.nan, math.inf):
        c.append(Case(api, f"rope_theta = {x}", set_attr(rope_theta=x), r"rope_theta"))
        c.append(Case(api, f"rope_scale = {x}", set_attr(rope_scale=x), r"rope_scale"))
        c.append(Case(api, f"llama31 factor = {x}", set_attr(llama31=kvattn.Llama31Scaling(factor=x)), r"factor",
                      layers=NATIVE))
        c.append(Case(api, f"llama31 low_freq_factor = {x}",
                      set_attr(llama31=kvattn.Llama31Scaling(low_freq_factor=x)), r"low_freq_factor",
                      layers=NATIVE))
        c.append(Case(api, f"llama31 original_max_position = {x}",
                      set_attr(llama31=kvattn.Llama31Scaling(original_max_position=x)), r"original_max_position",
                      layers=NATIVE))
    c.append(Case(api, "llama31 high_freq_factor = low_freq_factor",
                  set_attr(llama31=kvattn.Llama31Scaling(low_freq_factor=2.0, high_freq_factor=2.0)),
                  r"high_freq_factor", layers=NATIVE))

    def square(call):  # q and k of one shape: k_out = q exactly, as in tests/hardening_test.cpp
        f = call.f
        f.k = fresh(call, f.k, f.q.shape)
        f.k_out = f.q

    def q_out_over_k(call):
        f = call.f
        _shared(call, "k", "q_out", f.q_out.shape, f.q_out.dtype)

    c += [
        Case(api, "k_out aliases q exactly (hardening)", square, r"^k_out .*overlaps|^k_out .*q\b"),
        Case(api, "k_out overlaps q", set_attr(k_out=lambda c: c.f.q[:, :c.f.k.shape[1]]), r"^k_out .*overlaps"),
        Case(api, "q_out and k_out both q (hardening)",
             lambda call: (square(call), setattr(call.f, "q_out", call.f.q)),
             r"^q_out \(f16\[5, 4, 16\] on cpu"),
        Case(api, "q_out overlaps k", q_out_over_k, r"^q_out .*overlaps|^k .*overlaps"),
        Case(api, "k_out overlaps q_out",
             set_attr(k_out=lambda c: _view_into(c.f.q_out, c.f.k_out.dtype, c.f.k_out.shape)),
             r"^(k_out|q_out) .*overlaps (k_out|q_out)"),
        Case(api, "q_out partially overlaps q",
             lambda call: _shared(call, "q", "q_out", call.f.q_out.shape, call.f.q_out.dtype, 1),
             r"^q_out .*overlaps"),
        Case(api, "pos_ids inside k_out",
             set_attr(pos_ids=lambda c: _view_into(c.f.k_out, np.int32, c.f.pos_ids.shape, values=c.f.pos_ids)),
             r"pos_ids|k_out"),
    ]
    for case in c[-7:]:  # the outputs' aliasing: the caller's outputs, native only
        case.layers = NATIVE
    return c


def planner_cases():
    api = "planner"
    c = []
    mx = kvattn.MAX_KV_LEN

    def lst(field, fn):
        return setter(field, lambda x, call: fn(list(x)))

    c += [
        Case(api, "qo_indptr decreasing at 2", lst("qo_indptr", lambda v: v[:2] + [v[1] - 1] + v[3:]),
             r"qo_indptr\[2\] = \d+ is less than qo_indptr\[1\] = \d+"),
        Case(api, "qo_indptr[-1] = INT32_MAX", lst("qo_indptr", lambda v: v[:-1] + [I32_MAX]), r"qo_indptr|qo_len"),
        Case(api, "qo_indptr empty", set_attr(qo_indptr=[], kv_len=[]), r"qo_indptr"),
        Case(api, "qo_indptr[0] = 1", lst("qo_indptr", lambda v: [1] + v[1:]), r"qo_indptr\[0\] = 1"),
        Case(api, "qo_indptr[0] = -1", lst("qo_indptr", lambda v: [-1] + v[1:]), r"qo_indptr\[0\] = -1"),
        Case(api, "kv_len one entry long", lst("kv_len", lambda v: v + [1]), r"kv_len"),
        Case(api, "kv_len one entry short", lst("kv_len", lambda v: v[:-1]), r"kv_len"),
        Case(api, "a batch past the planner's limits",
             set_attr(qo_indptr=[0, kvattn.MAX_TOTAL_TOKENS], kv_len=[mx]), r"exceeds the planner's limit"),
        Case(api, "a causal batch past the planner's limits",
             set_attr(qo_indptr=[0, kvattn.MAX_TOTAL_TOKENS], kv_len=[mx], causal=True), r"exceeds the planner's limit"),
        Case(api, "two requests past the token limit",
             set_attr(qo_indptr=[0, kvattn.MAX_TOTAL_TOKENS, I32_MAX], kv_len=[mx, mx]), r"qo_indptr|tokens|qo_len"),
        Case(api, "num_qo_heads = 0", set_attr(hq=0), r"num_qo_heads = 0"),
        Case(api, "num_kv_heads = 0", set_attr(hkv=0), r"num_kv_heads = 0"),
        Case(api, "heads 32768", set_attr(hq=32768, hkv=32768), r"heads|32768"),
        Case(api, "num_qo_heads not a multiple", set_attr(hq=2 * HKV + 1), rf"num_qo_heads = {2 * HKV + 1}"),
        Case(api, "num_qo_heads negative", set_attr(hq=-HQ), rf"num_qo_heads = {-HQ}"),
        Case(api, "head_dim_qk = 0", set_attr(dqk=0), r"head_dim_qk = 0"),
        Case(api, "head_dim_qk = -64", set_attr(dqk=-64), r"head_dim_qk = -64"),
        Case(api, "head_dim_vo = -1", set_attr(dvo=-1), r"head_dim_vo = -1"),
        Case(api, "tile.query_tokens = 0", set_attr(tile=kvattn.TileShape(query_tokens=0)), r"query_tokens = 0"),
        Case(api, "tile.query_tokens = -16", set_attr(tile=kvattn.TileShape(query_tokens=-16)), r"query_tokens = -16"),
        Case(api, "tile.kv_tokens = 0", set_attr(tile=kvattn.TileShape(kv_tokens=0)), r"kv_tokens = 0"),
        Case(api, "tile.kv_tokens = INT_MIN", set_attr(tile=kvattn.TileShape(kv_tokens=I32_MIN)), rf"kv_tokens = {I32_MIN}"),
        Case(api, "num_workers = 0", set_attr(options=kvattn.SchedulerOptions(num_workers=0)), r"num_workers = 0"),
        Case(api, "num_workers = -1", set_attr(options=kvattn.SchedulerOptions(num_workers=-1)), r"num_workers = -1"),
        Case(api, "fixed_split_size = -1",
             set_attr(options=kvattn.SchedulerOptions(num_workers=2, fixed_split_size=-1)), r"fixed_split_size = -1"),
        Case(api, "cost.per_item = -1",
             set_attr(options=kvattn.SchedulerOptions(num_workers=2, cost=kvattn.CostModel(per_item=-1))), r"per_item"),
        Case(api, "cuda_graph.max_batch = 0",
             set_attr(options=kvattn.SchedulerOptions(num_workers=2, cuda_graph=kvattn.GraphCapacity(max_batch=0, max_tokens=100))),
             r"max_batch"),
    ]
    for w in (-2, -100, I32_MIN):
        c.append(Case(api, f"window_left = {w}", set_attr(window_left=w), rf"window_left = {w}"))
    for b in (0, 2):
        for v in (-1, mx + 1, I32_MAX, I32_MIN):
            c.append(Case(api, f"kv_len[{b}] = {v}", lst("kv_len", lambda x, b=b, v=v: x[:b] + [v] + x[b + 1:]),
                          rf"kv_len\[{b}\] = {v}"))
    for fld in ("qo_indptr", "kv_len"):
        c += [x for x in index_cases(api, fld, fld, exact_length=False)
              if "list" not in x.name]
    return c


CASES = (attention_cases("decode") + attention_cases("prefill_ragged") + attention_cases("prefill_mask")
         + attention_cases("prefill_paged") + attention_cases("block_sparse") + merge_cases()
         + merge_in_place_cases() + merge_states_cases() + append_cases() + rope_cases() + planner_cases())


def _params():
    seen = set()
    out = []
    for case in CASES:
        for layer in case.layers:
            if APIS[case.api][1 if layer == "native" else 2] is None:
                continue
            pid = case.id(layer)
            assert pid not in seen, f"duplicate case {pid}"
            seen.add(pid)
            out.append(pytest.param(case, layer, id=pid))
    return out


def _changed(before, after):
    return [i for i, (a, b) in enumerate(zip(before, after)) if a != b]


@pytest.mark.parametrize("case,layer", _params())
def test_corruption_is_rejected(rng, case, layer):
    build, native, flashinfer = APIS[case.api]
    call = build(rng)
    case.mutate(call)
    before = call.snapshot()
    fn = native if layer == "native" else flashinfer
    with pytest.raises(case.exc) as info:
        fn(call.f)
    message = str(info.value)
    assert message, "an error without a message"
    assert re.search(case.match, message), f"the message does not match {case.match!r}: {message!r}"
    changed = _changed(before, call.snapshot())
    assert not changed, f"a rejected call changed buffers {changed} (message: {message!r})"


# ---- wrong argument names ------------------------------------------------------------------------------
def _wrong_names():
    """(id, call builder, function taking the call's fields and a misspelled keyword)"""
    def dec_plan(f, kw):
        kvattn.BatchDecode().plan(page_table=(f.indptr, f.indices, f.last), page_size=f.page_size,
                                  num_qo_heads=f.hq, num_kv_heads=f.hkv, head_dim_qk=f.dqk, **kw)

    def dec_run(f, kw):
        w = kvattn.BatchDecode()
        w.plan(page_table=(f.indptr, f.indices, f.last), page_size=f.page_size, num_qo_heads=f.hq,
               num_kv_heads=f.hkv, head_dim_qk=f.dqk, q_dtype="f16")
        w.run(f.q, (f.k, f.v), out=f.out, **kw)

    def fi_plan(f, kw):
        fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE).plan(
            f.indptr, f.indices, f.last, f.hq, f.hkv, f.dqk, f.page_size, **kw)

    def fi_run(f, kw):
        w = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
        w.plan(f.indptr, f.indices, f.last, f.hq, f.hkv, f.dqk, f.page_size)
        w.run(f.q, (f.k, f.v), out=f.out, **kw)

    return [
        ("BatchDecode.plan", build_decode, dec_plan, "page_tabel"),
        ("BatchDecode.run", build_decode, dec_run, "outt"),
        ("BatchPrefill.plan", build_prefill,
         lambda f, kw: kvattn.BatchPrefill().plan(qo_indptr=f.qo_indptr, kv_indptr=f.kv_indptr,
                                                  num_qo_heads=f.hq, num_kv_heads=f.hkv,
                                                  head_dim_qk=f.dqk, **kw), "kv_indptrs"),
        ("merge_state", build_merge,
         lambda f, kw: kvattn.merge_state(f.v_a, f.s_a, f.v_b, f.s_b, **kw), "v_outt"),
        ("merge_states", build_merge_states, lambda f, kw: kvattn.merge_states(f.v, f.s, **kw), "s_outt"),
        ("append_paged_kv_cache", build_append,
         lambda f, kw: kvattn.append_paged_kv_cache(f.append_k, f.append_v, f.batch_indices, f.positions,
                                                    (f.k, f.v), (f.indptr, f.indices, f.last), **kw),
         "kv_layuot"),
        ("apply_rope", build_rope, lambda f, kw: kvattn.apply_rope(f.q, f.k, f.pos_ids, **kw), "rotary_dims"),
        ("make_plan", build_planner,
         lambda f, kw: kvattn.make_plan(qo_indptr=f.qo_indptr, kv_len=f.kv_len, num_qo_heads=f.hq,
                                        num_kv_heads=f.hkv, head_dim_qk=f.dqk, **kw), "window_lef"),
        ("Variant", build_planner, lambda f, kw: kvattn.Variant(**kw), "causual"),
        ("flashinfer decode plan", build_decode, fi_plan, "window_lef"),
        ("flashinfer decode run", build_decode, fi_run, "return_lsee"),
        ("flashinfer merge_state", build_merge,
         lambda f, kw: fi.merge_state(f.v_a, f.s_a, f.v_b, f.s_b, **kw), "v_out"),
    ]


@pytest.mark.parametrize("name,build,fn,bad", _wrong_names(), ids=[w[0] for w in _wrong_names()])
def test_wrong_argument_name_is_a_type_error(rng, name, build, fn, bad):
    call = build(rng)
    before = call.snapshot()
    with pytest.raises(TypeError) as info:
        fn(call.f, {bad: 1})
    assert bad in str(info.value), f"the message does not name {bad!r}: {info.value}"
    assert call.snapshot() == before


# ---- randomized legal calls against the float64 reference --------------------------------------------------
def _random_variant(rng, *, prefill, flashinfer):
    """(kvattn.Variant, reference.Var, FlashInfer plan keywords) of a random legal variant."""
    causal = prefill and rng.random() < 0.5
    window = int(rng.integers(0, 12)) if rng.random() < 0.3 else -1
    cap = float(rng.uniform(1.0, 20.0)) if rng.random() < 0.25 else 0.0
    sm = float(rng.uniform(0.05, 0.4)) if rng.random() < 0.25 else None
    mode = rng.choice(["NONE", "NONE", "ALIBI", "ROPE_LLAMA"])
    theta, scale = float(rng.choice([1e2, 1e4])), float(rng.uniform(0.5, 2.0))
    interleave = bool(rng.random() < 0.5) and not flashinfer
    llama31 = rng.random() < 0.3 and not flashinfer
    v = kvattn.Variant(causal=causal, window_left=window, logits_soft_cap=cap, sm_scale=sm,
                       alibi=mode == "ALIBI")
    rope = None
    if mode == "ROPE_LLAMA":
        cfg = kvattn.RopeConfig(rope_scale=scale, rope_theta=theta, interleave=interleave)
        rope = dict(theta=theta, scale=scale, interleave=interleave)
        if llama31:
            l31 = kvattn.Llama31Scaling(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position=64.0)
            cfg.llama31 = l31
            rope["llama31"] = dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_position=64.0)
        v = v.with_rope(cfg)
    var = ref.Var(causal=causal, window_left=window, soft_cap=cap, alibi=mode == "ALIBI", rope=rope,
                  sm_scale=sm)
    kw = dict(pos_encoding_mode=str(mode), window_left=window, logits_soft_cap=cap or None,
              sm_scale=sm, rope_scale=scale, rope_theta=theta)
    if prefill:
        kw["causal"] = causal
    return v, var, kw


def _pick(rng, options):
    return options[int(rng.integers(0, len(options)))]


def legal_paged(rng, f, dtype):
    layout = _pick(rng, ["NHD", "HND"])
    ps = _pick(rng, [1, 3, 4, 16])
    indptr, indices, last, num_pages = page_table(rng, f["kv_lens"], ps)
    shape = (lambda d: (num_pages, ps, f["hkv"], d)) if layout == "NHD" else (lambda d: (num_pages, f["hkv"], ps, d))
    k = cast(rand(rng, shape(f["dqk"])), dtype)
    v = cast(rand(rng, shape(f["dvo"])), dtype)
    combined = f["dqk"] == f["dvo"] and rng.random() < 0.3
    cache = np.stack([k, v], axis=1) if combined else (k, v)
    ks = ref.gather_paged(f64(k), layout, indptr, indices, last, ps)
    vs = ref.gather_paged(f64(v), layout, indptr, indices, last, ps)
    return dict(layout=layout, ps=ps, table=(indptr, indices, last), cache=cache, ks=ks, vs=vs,
                before=[x.copy() for x in (k, v, indptr, indices, last)], arrays=(k, v, indptr, indices, last))


def _unchanged(before, arrays):
    for b, a in zip(before, arrays):
        assert np.array_equal(np.asarray(b).view(np.uint8), np.asarray(a).view(np.uint8)), "an input changed"


def legal_attention(rng, api, layer):
    dtype = _pick(rng, FLOAT_DTYPES)
    hkv = _pick(rng, [1, 2])
    hq = hkv * _pick(rng, [1, 2, 4])
    dqk = _pick(rng, [8, 16, 32])
    dvo = dqk if api == "decode" or rng.random() < 0.6 else _pick(rng, [8, 16, 32])
    B = int(rng.integers(1, 5))
    prefill = api.startswith("prefill")
    kv_lens = [int(x) for x in rng.integers(0, 25, size=B)]
    qo_lens = [int(rng.integers(0, n + 1)) for n in kv_lens] if prefill else [1] * B
    if api == "decode":
        kv_lens = [max(n, 0) for n in kv_lens]
    variant, var, fi_kw = _random_variant(rng, prefill=prefill, flashinfer=layer == "flashinfer")
    qo_indptr = _indptr(qo_lens)
    rows = int(qo_indptr[-1])
    q = cast(rand(rng, (rows, hq, dqk)), dtype)
    out = cast(np.full((rows, hq, dvo), np.nan), dtype)
    lse = np.full((rows, hq), np.nan, np.float32)
    f = dict(kv_lens=kv_lens, hkv=hkv, dqk=dqk, dvo=dvo)
    mask = None
    if api == "prefill_ragged" and rng.random() < 0.4:
        mask = [rng.random((a, b)) < 0.6 for a, b in zip(qo_lens, kv_lens)]
        variant = variant.with_custom_mask()
        var.mask = lambda b, i, j: bool(mask[b][i, j])
    if api in ("decode", "prefill_paged"):
        p = legal_paged(rng, f, dtype)
        ks, vs, before, arrays = p["ks"], p["vs"], p["before"], p["arrays"]
    else:
        kv_indptr = _indptr(kv_lens)
        k = cast(rand(rng, (int(kv_indptr[-1]), hkv, dqk)), dtype)
        v = cast(rand(rng, (int(kv_indptr[-1]), hkv, dvo)), dtype)
        ks = [f64(k[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(B)]
        vs = [f64(v[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(B)]
        before, arrays = [k.copy(), v.copy(), q.copy()], (k, v, q)
    common = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=dqk, head_dim_vo=dvo, q_dtype=dtype)
    if layer == "native":
        if api == "decode":
            w = kvattn.BatchDecode(kv_layout=p["layout"])
            w.plan(page_table=p["table"], page_size=p["ps"], variant=variant, **common)
            w.run(q, p["cache"], out=out, lse=lse)
        elif api == "prefill_paged":
            w = kvattn.BatchPrefill(kv_layout=p["layout"])
            w.plan(qo_indptr=qo_indptr, page_table=p["table"], page_size=p["ps"], variant=variant, **common)
            w.run(q, p["cache"], out=out, lse=lse)
        else:
            w = kvattn.BatchPrefill()
            kw = {}
            if mask is not None:
                packed, mask_indptr = _pack_masks(mask)
                kw = dict(custom_mask=packed, mask_indptr=mask_indptr)
            w.plan(qo_indptr=qo_indptr, kv_indptr=kv_indptr, variant=variant, **common, **kw)
            w.run(q, k, v, out=out, lse=lse)
    else:
        names = dict(q_data_type=FI_DTYPE[dtype])
        if api == "decode":
            w = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, p["layout"])
            w.plan(*p["table"], hq, hkv, dqk, p["ps"], **names, **fi_kw)
            w.run(q, p["cache"], out=out, lse=lse)
        elif api == "prefill_paged":
            w = fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, p["layout"])
            w.plan(qo_indptr, *p["table"], hq, hkv, dqk, p["ps"], head_dim_vo=dvo, **names, **fi_kw)
            w.run(q, p["cache"], out=out, lse=lse)
        else:
            w = fi.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
            kw = {}
            if mask is not None:
                kw["custom_mask"] = np.concatenate([m.ravel() for m in mask]) if mask else np.zeros(0, bool)
            w.plan(qo_indptr, kv_indptr, hq, hkv, dqk, head_dim_vo=dvo, **names, **fi_kw, **kw)
            w.run(q, k, v, out=out, lse=lse)
    want_o, want_lse, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs, var)
    check_output(out, want_o, mag, dtype)
    check_lse(lse, want_lse)
    _unchanged(before, arrays)


def legal_block_sparse(rng, layer):
    dtype = _pick(rng, FLOAT_DTYPES)
    R, C = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    mb, nb = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    hkv = _pick(rng, [1, 2])
    hq, d = hkv * _pick(rng, [1, 2]), _pick(rng, [8, 16, 32])
    present = rng.random((mb, nb)) < 0.5
    indptr = _indptr(present.sum(axis=1))
    indices = np.concatenate([np.flatnonzero(r) for r in present]).astype(np.int32)
    M, N = mb * R, nb * C
    q, k, v = (cast(rand(rng, (n, h, d)), dtype) for n, h in ((M, hq), (N, hkv), (N, hkv)))
    out, lse = cast(np.full((M, hq, d), np.nan), dtype), np.full((M, hq), np.nan, np.float32)
    w = kvattn.BlockSparseAttention()
    w.plan(bsr=kvattn.BSRMatrix(indptr, indices, M, N, R, C), num_qo_heads=hq, num_kv_heads=hkv,
           head_dim_qk=d, q_dtype=dtype)
    w.run(q, k, v, out=out, lse=lse)
    var = ref.Var(mask=lambda b, i, j: bool(present[i // R, j // C]))
    want_o, want_lse, mag = ref.batch_attention(f64(q), [0, M], [f64(k)], [f64(v)], var)
    check_output(out, want_o, mag, dtype)
    check_lse(lse, want_lse)


MERGE_ACC = 1e-5  # test_ops.py's bound for the f32 fold


def _merge_lse_ok(got, want):
    g = np.asarray(got, np.float64)
    assert np.array_equal(np.isneginf(g), np.isneginf(want))
    fin = np.isfinite(want)
    assert (np.abs(g[fin] - want[fin]) <= 1e-6 * np.maximum(1.0, np.abs(want[fin]))).all()


def legal_merge(rng, api, layer):
    dtype, odtype = _pick(rng, FLOAT_DTYPES), _pick(rng, FLOAT_DTYPES)
    n, h, d = int(rng.integers(0, 6)), int(rng.integers(1, 4)), _pick(rng, [5, 8, 16, 40])

    def lse(shape):
        s = rng.uniform(-10, 10, size=shape).astype(np.float32)
        s[rng.random(shape) < 0.15] = -np.inf
        return s

    if api == "merge_state":
        va, vb = cast(rand(rng, (n, h, d)), dtype), cast(rand(rng, (n, h, d)), dtype)
        sa, sb = lse((n, h)), lse((n, h))
        want_o, want_s, mag = ref.merge(f64(va), f64(sa), f64(vb), f64(sb))
        if layer == "native":
            vo, so = cast(np.full((n, h, d), np.nan), odtype), np.full((n, h), np.nan, np.float32)
            kvattn.merge_state(va, sa, vb, sb, v_out=vo, s_out=so)
        else:
            vo, so = fi.merge_state(va, sa, vb, sb)
            odtype = dtype
        check_output(vo, want_o, mag, odtype, MERGE_ACC)
        _merge_lse_ok(so, want_s)
    elif api == "merge_state_in_place":
        v, vo = cast(rand(rng, (n, h, d)), dtype), cast(rand(rng, (n, h, d)), dtype)
        s, so = lse((n, h)), lse((n, h))
        mask = (rng.random(n) < 0.6).astype(np.uint8)
        want_o, want_s, mag = ref.merge(f64(v), f64(s), f64(vo), f64(so))
        keep = mask == 0
        want_o[keep], want_s[keep], mag[keep] = f64(v)[keep], f64(s)[keep], 0
        (kvattn.merge_state_in_place if layer == "native" else fi.merge_state_in_place)(
            v, s, vo, so, mask if layer == "native" else mask.astype(bool))
        check_output(v, want_o, mag, dtype, MERGE_ACC)
        _merge_lse_ok(s, want_s)
    else:
        k = int(rng.integers(0, 5))
        v, s = cast(rand(rng, (n, k, h, d)), dtype), lse((n, k, h))
        want_o, want_s, mag = np.zeros((n, h, d)), np.full((n, h), -np.inf), np.zeros((n, h, d))
        for i in range(k):
            want_o, want_s, m = ref.merge(want_o, want_s, f64(v[:, i]), f64(s[:, i]))
            mag = m + mag
        if layer == "native":
            vo, so = cast(np.full((n, h, d), np.nan), odtype), np.full((n, h), np.nan, np.float32)
            kvattn.merge_states(v, s, v_out=vo, s_out=so)
        else:
            vo, so = fi.merge_states(v, s)
            odtype = dtype
        check_output(vo, want_o, mag, odtype, MERGE_ACC)
        _merge_lse_ok(so, want_s)


def legal_append(rng, layer):
    dtype, adtype = _pick(rng, FLOAT_DTYPES), _pick(rng, FLOAT_DTYPES)
    layout, ps, hkv, d = _pick(rng, ["NHD", "HND"]), _pick(rng, [1, 4, 5]), _pick(rng, [1, 2]), _pick(rng, [8, 16])
    B = int(rng.integers(1, 4))
    old = [int(x) for x in rng.integers(0, 9, size=B)]
    new = [int(x) for x in rng.integers(0, 5, size=B)]
    indptr, indices, last, num_pages = page_table(rng, [a + b for a, b in zip(old, new)], ps)
    shape = (num_pages, ps, hkv, d) if layout == "NHD" else (num_pages, hkv, ps, d)
    kc, vc = cast(rand(rng, shape), dtype), cast(rand(rng, shape), dtype)
    want_k, want_v = kc.copy(), vc.copy()
    batch = np.array([b for b, m in enumerate(new) for _ in range(m)], np.int32)
    pos = np.array([o + i for o, m in zip(old, new) for i in range(m)], np.int32)
    order = rng.permutation(len(batch))
    batch, pos = batch[order], pos[order]
    ak, av = cast(rand(rng, (len(batch), hkv, d)), adtype), cast(rand(rng, (len(batch), hkv, d)), adtype)
    for r in range(len(batch)):
        b, t = batch[r], pos[r]
        page, slot = indices[indptr[b] + t // ps], t % ps
        for want, src in ((want_k, ak), (want_v, av)):
            val = src[r].astype(np.float64).astype(np_dtype(dtype))
            if layout == "NHD":
                want[page, slot] = val
            else:
                want[page, :, slot] = val
    if layer == "native":
        kvattn.append_paged_kv_cache(ak, av, batch, pos, (kc, vc), (indptr, indices, last), kv_layout=layout)
    else:
        fi.append_paged_kv_cache(ak, av, batch, pos, (kc, vc), indices, indptr, last, kv_layout=layout)
    assert np.array_equal(kc.view(np.uint8), want_k.view(np.uint8))
    assert np.array_equal(vc.view(np.uint8), want_v.view(np.uint8))


def legal_rope(rng, layer):
    from test_ops import rope_check

    dtype = _pick(rng, FLOAT_DTYPES)
    n, hq, hk, d = int(rng.integers(0, 7)), int(rng.integers(1, 5)), int(rng.integers(1, 5)), _pick(rng, [8, 16, 32])
    rd = 0 if rng.random() < 0.5 else 2 * int(rng.integers(1, d // 2 + 1))
    cfg = dict(theta=float(_pick(rng, [1e2, 1e4, 5e5])), scale=float(rng.uniform(0.5, 4.0)),
               interleave=bool(rng.random() < 0.5), rotary_dim=rd)
    kw = dict(rotary_dim=rd, rope_theta=cfg["theta"], rope_scale=cfg["scale"], interleave=cfg["interleave"])
    if rng.random() < 0.3:
        l31 = dict(factor=float(rng.uniform(1, 16)), low_freq_factor=1.0, high_freq_factor=float(rng.uniform(2, 6)),
                   original_max_position=float(rng.uniform(64, 8192)))
        cfg["llama31"], kw["llama31"] = l31, kvattn.Llama31Scaling(**l31)
    q, k = cast(rand(rng, (n, hq, d)), dtype), cast(rand(rng, (n, hk, d)), dtype)
    pos = rng.integers(0, 500, size=n).astype(np.int32)
    qo, ko = cast(np.full(q.shape, np.nan), dtype), cast(np.full(k.shape, np.nan), dtype)
    kvattn.apply_rope(q, k, pos, q_out=qo, k_out=ko, **kw)
    rope_check(qo, q, pos, dtype, **cfg)
    rope_check(ko, k, pos, dtype, **cfg)


def legal_planner(rng, layer):
    B = int(rng.integers(0, 6))
    kv = [int(x) for x in rng.integers(0, 3000, size=B)]
    qo = [int(rng.integers(0, n + 1)) for n in kv]
    causal = bool(rng.random() < 0.5)
    window = int(rng.integers(0, 100)) if rng.random() < 0.3 else -1
    opt = kvattn.SchedulerOptions(num_workers=int(rng.integers(1, 9)),
                                  fixed_split_size=int(_pick(rng, [0, 0, 64, 500])))
    plan = kvattn.make_plan(qo_indptr=list(map(int, _indptr(qo))), kv_len=kv, num_qo_heads=4, num_kv_heads=2,
                            head_dim_qk=64, causal=causal, window_left=window, options=opt)
    # The plan's contract: every visible key of every (request, head, query row) in exactly one item.
    cover = {}
    for it in plan.all_items:
        for r in range(it.q_begin, it.q_end):
            cover.setdefault((it.request, it.kv_head, r), []).append((it.kv_begin, it.kv_end))
    for b in range(B):
        for h in range(2):
            for r in range(qo[b]):
                p = kv[b] - qo[b] + r
                lo = max(0, p - window) if window >= 0 else 0
                hi = p + 1 if causal else kv[b]
                chunks = sorted(cover.get((b, h, r), []))
                if hi <= lo:
                    assert sum(e - s for s, e in chunks) == 0
                    continue
                assert chunks, f"request {b} head {h} row {r} is in no item"
                assert chunks[0][0] <= lo and chunks[-1][1] >= hi
                assert all(a[1] == c[0] for a, c in zip(chunks, chunks[1:])), chunks


LEGAL = [("decode", l) for l in ("native", "flashinfer")] + [("prefill_ragged", l) for l in ("native", "flashinfer")]
LEGAL += [("prefill_paged", l) for l in ("native", "flashinfer")] + [("block_sparse", "native")]
LEGAL += [(a, l) for a in ("merge_state", "merge_state_in_place", "merge_states", "append") for l in ("native", "flashinfer")]
LEGAL += [("apply_rope", "native"), ("planner", "native")]


@pytest.mark.parametrize("trial", range(4))
@pytest.mark.parametrize("api,layer", LEGAL, ids=[f"{a}-{l}" for a, l in LEGAL])
def test_random_legal_call_matches_the_reference(rng, api, layer, trial):
    if api in ("decode", "prefill_ragged", "prefill_paged"):
        legal_attention(rng, api, layer)
    elif api == "block_sparse":
        legal_block_sparse(rng, layer)
    elif api.startswith("merge"):
        legal_merge(rng, api, layer)
    elif api == "append":
        legal_append(rng, layer)
    elif api == "apply_rope":
        legal_rope(rng, layer)
    else:
        legal_planner(rng, layer)
