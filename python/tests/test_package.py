"""The package itself: a quiet, cheap import, the version, the stub, no libcuda, the Variant and
planner types."""

import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import kvattn

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_import_is_quiet_and_cheap(tmp_path):
    env = dict(os.environ, KVATTN_CACHE_DIR=str(tmp_path / "jit"), XDG_CACHE_HOME=str(tmp_path))
    code = ("import sys, kvattn; "
            "assert 'numpy' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""
    # No kernel was compiled or cached.
    assert not (tmp_path / "jit").exists() and not (tmp_path / "kvattn").exists()


def test_version_matches_cpp():
    header = REPO / "include" / "kvattn" / "version.h"
    if header.exists():
        want = re.search(r'kVersion = "([^"]+)"', header.read_text()).group(1)
        assert kvattn.__version__ == want
    assert importlib.metadata.version("kvattn") == kvattn.__version__


def test_stub_and_docstrings():
    pkg = pathlib.Path(kvattn.__file__).parent
    stub = (pkg / "_kvattn.pyi").read_text()
    for name in ["class BatchDecode", "class BatchPrefill", "class BlockSparseAttention",
                 "class CascadeAttention", "class CascadeLevel", "class Variant", "def merge_state(", "def apply_rope(", "def plan(",
                 "class CustomVariant", "def custom(source: str", "def with_custom(self"]:
        assert name in stub, name
    assert (pkg / "py.typed").exists()
    for obj in [kvattn.BatchDecode, kvattn.BatchDecode.plan, kvattn.BatchDecode.run,
                kvattn.BatchPrefill.plan, kvattn.BlockSparseAttention.run, kvattn.CascadeAttention,
                kvattn.CascadeAttention.plan, kvattn.CascadeAttention.run,
                kvattn.CascadeAttention.schedule, kvattn.CascadeLevel, kvattn.merge_states,
                kvattn.append_paged_kv_cache, kvattn.variants.causal, kvattn.Variant,
                kvattn.Variant.custom, kvattn.Variant.with_custom, kvattn.variants.custom]:
        assert obj.__doc__ and len(obj.__doc__) > 20, obj


def test_extension_does_not_link_libcuda():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf")
    so = kvattn._kvattn.__file__
    needed = subprocess.run([readelf, "-d", so], capture_output=True, text=True).stdout
    assert "NEEDED" in needed
    assert "libcuda.so" not in needed


def test_variant_fluent_api():
    v = kvattn.variants.causal().with_soft_cap(30).with_window(4096)
    assert v.describe() == "causal+window(4096)+soft_cap(30)"
    assert repr(v) == "Variant(causal+window(4096)+soft_cap(30))"
    assert v == kvattn.Variant(causal=True, window_left=4096, logits_soft_cap=30)
    assert v != kvattn.variants.causal()
    assert kvattn.variants.plain().describe() == "plain"
    assert kvattn.variants.sliding_window(8, causal=False).causal is False
    assert kvattn.variants.sigmoid(0.5).sigmoid_bias == 0.5
    r = kvattn.variants.rope(kvattn.RopeConfig(rope_theta=5e5, llama31=kvattn.Llama31Scaling()))
    assert r.rope.rope_theta == 5e5 and r.rope.llama31.factor == 8.0
    assert kvattn.Variant().with_sm_scale(0.1).sm_scale == pytest.approx(0.1)
    s = kvattn.Variant().with_scales(1.0, 2.0, 3.0)
    assert (s.q_scale, s.k_scale, s.v_scale) == (1.0, 2.0, 3.0)
    v.window_left = -7
    with pytest.raises(ValueError, match="window_left = -7"):
        v.validate()
    assert kvattn.alibi_slope(0, 8) == pytest.approx(0.5)
    assert kvattn.dtype_size("bf16") == 2 and kvattn.dtype_size(kvattn.DType.e4m3) == 1


def test_make_plan_and_planner():
    lens = [1000, 10, 10, 10]
    p = kvattn.make_plan(qo_indptr=[0, 1, 2, 3, 4], kv_len=lens, num_qo_heads=8, num_kv_heads=2,
                         head_dim_qk=64, options=kvattn.SchedulerOptions(num_workers=4))
    assert p.num_workers == 4 and p.batch_size == 4 and p.max_over_mean >= 1.0
    assert p.split_size > 0 and p.num_merges > 0  # the long request was split
    assert sum(p.worker_costs) == p.total_cost
    for w in range(p.num_workers):
        assert all(it.worker == w for it in p.worker_items(w))
    off = kvattn.make_plan(qo_indptr=[0, 1, 2, 3, 4], kv_len=lens, num_qo_heads=8, num_kv_heads=2,
                           head_dim_qk=64,
                           options=kvattn.SchedulerOptions(num_workers=4, disable_split_kv=True))
    assert off.num_merges == 0 and off.split_size == 0
    # Graph mode: fixed capacity, inactive padding, the same buffers on a re-plan.
    planner = kvattn.Planner()
    opts = kvattn.SchedulerOptions(num_workers=4,
                                   cuda_graph=kvattn.GraphCapacity(max_batch=8, max_tokens=8))
    g = planner.plan(qo_indptr=[0, 1, 2], kv_len=[100, 3], num_qo_heads=4, num_kv_heads=1,
                     head_dim_qk=32, options=opts)
    assert g.graph_mode and len(g.all_items) == g.item_capacity >= g.num_items
    assert all(not it.active and it.worker == -1 for it in g.all_items[g.num_items:])
    with pytest.raises(ValueError, match="capacity|max_batch"):
        planner.plan(qo_indptr=list(range(10)), kv_len=[5] * 9, num_qo_heads=4, num_kv_heads=1,
                     head_dim_qk=32, options=opts)
    assert planner.current().batch_size == 2
    with pytest.raises(ValueError, match="kv_len"):
        kvattn.make_plan(qo_indptr=[0, 1], kv_len=[-1], num_qo_heads=1, num_kv_heads=1, head_dim_qk=8,
                         options=kvattn.SchedulerOptions(num_workers=1))
    # The planner itself has no backend default for the worker count.
    with pytest.raises(ValueError, match="num_workers = 0"):
        kvattn.make_plan(qo_indptr=[0, 1], kv_len=[1], num_qo_heads=1, num_kv_heads=1, head_dim_qk=8)
