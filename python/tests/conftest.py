"""Fixtures and checks shared by the kvattn Python tests (CPU backend, numpy inputs).

Every test draws fresh random inputs; the seed is printed (shown with a failure) and
KVATTN_TEST_SEED=N replays it. bf16 and fp8 inputs need ml_dtypes; without it those cases skip.
"""

import os
import random

import numpy as np
import pytest

import reference as ref

try:
    import ml_dtypes
except ImportError:  # bf16 / fp8 cases skip
    ml_dtypes = None

HAS_ML_DTYPES = ml_dtypes is not None
FLOAT_DTYPES = ["f32", "f16"] + (["bf16"] if HAS_ML_DTYPES else [])
FP8_DTYPES = ["e4m3", "e5m2"] if HAS_ML_DTYPES else []


def np_dtype(name):
    """The numpy dtype of a kvattn dtype name (bf16 / fp8 from ml_dtypes)."""
    native = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "u8": np.uint8}
    if name in native:
        return np.dtype(native[name])
    if ml_dtypes is None:
        pytest.skip(f"{name} needs ml_dtypes")
    return np.dtype({"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
                     "e5m2": ml_dtypes.float8_e5m2}[name])


def cast(x, name):
    """x (float64) stored in dtype `name` (round to nearest even)."""
    return np.asarray(x, dtype=np.float64).astype(np_dtype(name))


def f64(x):
    """The stored values, exactly, as float64."""
    return np.asarray(x).astype(np.float64)


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("KVATTN_TEST_SEED", random.SystemRandom().randrange(2**63)))
    print(f"{request.node.nodeid}: KVATTN_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def check_output(got, want, mag, dtype, accumulation=ref.ACCUMULATION, what="out"):
    """Every element within rtol |want| + atol + accumulation * mag (reference.py's argument);
    NaN (an unwritten poisoned element) fails."""
    rtol, atol = ref.OUTPUT_TOLERANCE[dtype]
    g = f64(got)
    assert g.shape == want.shape, f"{what}: shape {g.shape} != {want.shape}"
    allowed = rtol * np.abs(want) + atol + accumulation * mag
    err = np.abs(g - want)
    bad = ~(err <= allowed)
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(err / allowed, nan=np.inf), -1)),
                             want.shape)
        pytest.fail(f"{what}: {int(bad.sum())} of {bad.size} elements off; worst at {i}: got "
                    f"{g[i]!r}, want {want[i]!r}, allowed {allowed[i]:.3g}")


def check_lse(got, want, abs_tol=ref.LSE_ABS, what="lse"):
    """-inf exactly where no key is visible, else within abs_tol + 1e-6 |lse|."""
    g = np.asarray(got, dtype=np.float64)
    assert g.shape == want.shape, f"{what}: shape {g.shape} != {want.shape}"
    inf = np.isneginf(want)
    assert np.array_equal(np.isneginf(g), inf), f"{what}: -inf rows differ"
    fin = ~inf
    err = np.abs(g[fin] - want[fin])
    allowed = abs_tol + ref.LSE_REL * np.abs(want[fin])
    assert (err <= allowed).all(), f"{what}: worst error {err.max():.3g} (allowed ~{allowed.max():.3g})"


def rand(rng, shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape)


def page_table(rng, kv_lens, page_size, spare_pages=3):
    """A shuffled page assignment for requests of the given lengths: (indptr, indices,
    last_page_len) int32 arrays and the number of pages of the cache."""
    counts = [(n + page_size - 1) // page_size for n in kv_lens]
    total = sum(counts) + spare_pages
    perm = rng.permutation(total).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = perm[: indptr[-1]].copy()
    last = np.array([(n - 1) % page_size + 1 if n > 0 else 0 for n in kv_lens], dtype=np.int32)
    return indptr, indices, last, total
