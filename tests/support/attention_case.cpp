#include "support/attention_case.h"
#include "support/device_mirror.h"
#include "support/expect_error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <sstream>

#include "reference/reference.h"
#include "support/compare.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"

namespace kvattn_test {

using kvattn::DType;

std::string AttnCase::describe() const {
  std::ostringstream os;
  os << "case: lens (qo, kv) = [";
  for (size_t b = 0; b < lens.size(); ++b)
    os << (b ? " " : "") << "(" << lens[b].first << "," << lens[b].second << ")";
  os << "] heads " << num_qo_heads << "/" << num_kv_heads << " dims " << head_dim_qk << "/" << dvo()
     << " q " << kvattn::dtype_name(q_dtype) << " kv " << kvattn::dtype_name(kv()) << " out "
     << kvattn::dtype_name(out()) << " variant " << variant.describe() << " "
     << kvattn::kv_layout_name(layout) << " "
     << (store == KVStore::ragged ? "ragged" : store == KVStore::paged ? "paged" : "paged-combined")
     << " page " << page_size << (strided ? " strided" : "") << (want_lse ? " lse" : "")
     << " fill "
     << (fill == Fill::random ? "random" : fill == Fill::ones ? "ones" : fill == Fill::aligned ? "aligned" : "structured");
  return os.str();
}

double fill_value(Fill fill, char what, int64_t t, int h, int e, Rng& rng) {
  switch (fill) {
    case Fill::ones: return 1.0;
    case Fill::structured:
      if (what == 'q') return double((t + 2 * h + e) % 7 - 3) / 4;
      if (what == 'k') return double((3 * t + h + 2 * e) % 5 - 2) / 4;
      return double((5 * t + 3 * h + e) % 17 - 8) / 8;
    case Fill::random:
      if (what == 'v') return rng.uniform(-1, 1);
      return std::clamp(rng.normal(), -3.0, 3.0);
    case Fill::aligned:
      return what == 'v' ? rng.uniform(-1, 1) : rng.uniform(0.5, 1.5);
  }
  return 0;
}

kvattn::AttentionShape shape_of(const AttnCase& c) {
  kvattn::AttentionShape s;
  s.num_qo_heads = c.num_qo_heads;
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim_qk = c.head_dim_qk;
  s.head_dim_vo = c.head_dim_vo;
  s.q_dtype = c.q_dtype;
  s.kv_dtype = c.kv_dtype;
  s.o_dtype = c.o_dtype;
  s.variant = c.variant;
  return s;
}

namespace {

#if KVATTN_WITH_CUDA
// Runs `run` `runs` times on one plan. Every run must write every row again (the outputs are
// re-poisoned before each) and the same bytes: the last run lands in out / lse (checked against
// the reference by the caller), the earlier ones are compared with it here.
template <class Run>
void run_repeatedly(int runs, DeviceMirror& dout, DeviceMirror& dlse, HostTensor& out, HostTensor& lse, Run&& run) {
  std::vector<HostTensor> earlier_out, earlier_lse;
  for (int i = 0; i < runs; ++i) {
    dout.upload();
    dlse.upload();
    run();
    device_synchronize();
    if (i + 1 < runs) {
      earlier_out.push_back(out);
      dout.copy_back(earlier_out.back());
      earlier_lse.push_back(lse);
      dlse.copy_back(earlier_lse.back());
    }
  }
  dout.copy_back(out);
  dlse.copy_back(lse);
  for (size_t i = 0; i < earlier_out.size(); ++i) {
    EXPECT_TRUE(earlier_out[i].same_bytes(out.snapshot())) << "out of run " << i << " of " << runs << " differs from the last";
    EXPECT_TRUE(earlier_lse[i].same_bytes(lse.snapshot())) << "lse of run " << i << " of " << runs << " differs from the last";
  }
}
#endif

HostTensor make_tensor(DType t, std::vector<int64_t> shape, bool strided) {
  HostTensor x = strided ? HostTensor::strided(t, std::move(shape)) : HostTensor(t, std::move(shape));
  x.poison();
  return x;
}

// Per request, the values the kernel sees (decoded from storage), dense as reference.h wants.
struct RequestData {
  int64_t qo_len, kv_len;
  std::vector<double> q, k, v;
};

void run_case(bool decode, const AttnCase& c, Rng& rng) {
  SCOPED_TRACE(c.describe());
  const int hq = c.num_qo_heads, hkv = c.num_kv_heads, dqk = c.head_dim_qk, dvo = c.dvo();
  const bool sigmoid = c.variant.sigmoid || (c.user && !c.user->use_softmax);
  const bool want_lse = c.want_lse && !sigmoid;
  const size_t B = c.lens.size();
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0};
  std::vector<int64_t> kv_lens;
  for (auto [qo, kv] : c.lens) {
    qo_indptr.push_back(qo_indptr.back() + int32_t(qo));
    kv_indptr.push_back(kv_indptr.back() + int32_t(kv));
    kv_lens.push_back(kv);
  }
  const int64_t nq = qo_indptr.back(), nkv = kv_indptr.back();

  // Queries.
  std::vector<RequestData> reqs(B);
  HostTensor q = make_tensor(c.q_dtype, {nq, hq, dqk}, c.strided);
  for (size_t b = 0; b < B; ++b) {
    RequestData& r = reqs[b];
    r.qo_len = c.lens[b].first;
    r.kv_len = c.lens[b].second;
    for (int64_t i = 0; i < r.qo_len; ++i)
      for (int h = 0; h < hq; ++h)
        for (int e = 0; e < dqk; ++e) {
          const int64_t off = q.offset({qo_indptr[b] + i, h, e});
          const double head_scale = c.q_head_scales.empty() ? 1.0 : c.q_head_scales[size_t(h) % c.q_head_scales.size()];
          q.set_at(off, head_scale * fill_value(c.fill, 'q', i, h, e, rng));
          r.q.push_back(q.get_at(off));
        }
  }

  // Keys and values: ragged tensors or a scattered paged cache.
  HostTensor k_ragged, v_ragged;
  std::optional<PagedKV> paged;
  if (c.store == KVStore::ragged) {
    k_ragged = make_tensor(c.kv(), {nkv, hkv, dqk}, c.strided);
    v_ragged = make_tensor(c.kv(), {nkv, hkv, dvo}, c.strided);
  } else {
    PagedKVSpec spec{kv_lens, c.page_size, hkv, dqk, dvo, c.kv(), c.layout,
                     c.store == KVStore::paged_combined, c.strided, c.kv_aligned_strides,
                     int(rng.integer(0, 3))};
    paged.emplace(spec, rng);
  }
  for (size_t b = 0; b < B; ++b) {
    RequestData& r = reqs[b];
    r.k.resize(size_t(r.kv_len * hkv * dqk));
    r.v.resize(size_t(r.kv_len * hkv * dvo));
    for (int64_t j = 0; j < r.kv_len; ++j)
      for (int h = 0; h < hkv; ++h) {
        for (int e = 0; e < dqk; ++e) {
          double x = fill_value(c.fill, 'k', j, h, e, rng);
          double& dst = r.k[size_t((j * hkv + h) * dqk + e)];
          if (paged) {
            dst = paged->set_k(b, j, h, e, x);
          } else {
            const int64_t off = k_ragged.offset({kv_indptr[b] + j, h, e});
            k_ragged.set_at(off, x);
            dst = k_ragged.get_at(off);
          }
        }
        for (int e = 0; e < dvo; ++e) {
          double x = fill_value(c.fill, 'v', j, h, e, rng);
          double& dst = r.v[size_t((j * hkv + h) * dvo + e)];
          if (paged) {
            dst = paged->set_v(b, j, h, e, x);
          } else {
            const int64_t off = v_ragged.offset({kv_indptr[b] + j, h, e});
            v_ragged.set_at(off, x);
            dst = v_ragged.get_at(off);
          }
        }
      }
  }

  // Custom mask: random bits per request at byte offsets with random gaps between requests.
  std::vector<int32_t> mask_indptr{0};
  std::vector<uint8_t> mask_bytes;
  if (c.variant.custom_mask) {
    for (size_t b = 0; b < B; ++b) {
      const int64_t bits = reqs[b].qo_len * reqs[b].kv_len;
      const int64_t start = int64_t(mask_bytes.size());
      mask_bytes.resize(size_t(start + (bits + 7) / 8 + rng.integer(0, 2)));
      for (auto& byte : std::span(mask_bytes).subspan(size_t(start))) byte = uint8_t(rng.integer(0, 255));
      // Re-draw the request's bits with the wanted density; one row may be fully masked.
      const int64_t dead_row = rng.coin(0.3) ? rng.integer(0, std::max<int64_t>(0, reqs[b].qo_len - 1)) : -1;
      for (int64_t bit = 0; bit < bits; ++bit) {
        bool on = bit / std::max<int64_t>(1, reqs[b].kv_len) != dead_row && rng.coin(c.mask_density);
        uint8_t& byte = mask_bytes[size_t(start + bit / 8)];
        byte = uint8_t(on ? byte | (1u << (bit % 8)) : byte & ~(1u << (bit % 8)));
      }
      mask_indptr.push_back(int32_t(mask_bytes.size()));
    }
  }
  HostTensor mask_t(DType::u8, {int64_t(mask_bytes.size())});
  for (size_t i = 0; i < mask_bytes.size(); ++i) mask_t.set_at(int64_t(i), mask_bytes[i]);
  HostTensor mask_indptr_t = int32_tensor(mask_indptr);

  HostTensor out = make_tensor(c.out(), {nq, hq, dvo}, c.strided);
  HostTensor lse = make_tensor(DType::f32, {nq, hq}, c.strided);
  HostTensor qo_indptr_t = int32_tensor(qo_indptr), kv_indptr_t = int32_tensor(kv_indptr);
  const auto q_before = q.snapshot();
  const kvattn::TensorView lse_view = want_lse ? lse.view() : kvattn::TensorView{};

  if (decode) {
    kvattn::BatchDecodePlan p;
    static_cast<kvattn::AttentionShape&>(p) = shape_of(c);
    p.page_table = paged->table();
    p.page_size = c.page_size;
    p.scheduler = c.scheduler;
    if (c.variant.custom_mask) {
      p.custom_mask = mask_t.view();
      p.mask_indptr = mask_indptr_t.view();
    }
    if (c.on_gpu) {
#if KVATTN_WITH_CUDA
      DeviceBytes workspace(c.workspace_bytes > 0 ? c.workspace_bytes : int64_t(64) << 20);
      DeviceMirror dq(q), dout(out), dlse(lse);
      std::optional<DeviceMirror> dk, dv, dkv;
      kvattn::PagedKVCache cache;
      if (c.store == KVStore::paged_combined) {
        dkv.emplace(paged->kv);
        cache = kvattn::PagedKVCache::combined(dkv->view(), c.layout);
      } else {
        dk.emplace(paged->k);
        dv.emplace(paged->v);
        cache = kvattn::PagedKVCache::split(dk->view(), dv->view(), c.layout);
      }
      std::optional<DeviceMirror> dindices;
      if (c.device_page_table) p.page_table.indices = dindices.emplace(paged->indices).view();
      kvattn::BatchDecode op(workspace.view(), c.layout);
      op.plan(p);
      if (!c.expect_error.empty()) {
        EXPECT_KVATTN_ERROR(op.run(dq.view(), cache, dout.view(), want_lse ? dlse.view() : kvattn::TensorView{}),
                            c.expect_error);
        return;
      }
      run_repeatedly(c.runs, dout, dlse, out, lse, [&] {
        op.run(dq.view(), cache, dout.view(), want_lse ? dlse.view() : kvattn::TensorView{});
        op.check_errors();  // a clean run reports nothing
      });
#else
      FAIL() << "on_gpu case in a build without the CUDA backend";
#endif
    } else {
      kvattn::BatchDecode op({}, c.layout);
      op.plan(p);
      op.run(q.view(), paged->cache(), out.view(), lse_view);
      op.check_errors();  // the CPU validates ids before computing: nothing is ever recorded
    }
  } else {
    kvattn::BatchPrefillPlan p;
    static_cast<kvattn::AttentionShape&>(p) = shape_of(c);
    p.qo_indptr = qo_indptr_t.view();
    if (paged) {
      p.page_table = paged->table();
      p.page_size = c.page_size;
    } else {
      p.kv_indptr = kv_indptr_t.view();
    }
    if (c.variant.custom_mask) {
      p.custom_mask = mask_t.view();
      p.mask_indptr = mask_indptr_t.view();
    }
    p.scheduler = c.scheduler;
    if (c.on_gpu) {
#if KVATTN_WITH_CUDA
      DeviceBytes workspace(c.workspace_bytes > 0 ? c.workspace_bytes : int64_t(256) << 20);
      DeviceMirror dq(q), dout(out), dlse(lse);
      std::optional<DeviceMirror> dk, dv, dkv;
      kvattn::PagedKVCache cache;
      if (c.store == KVStore::paged_combined) {
        dkv.emplace(paged->kv);
        cache = kvattn::PagedKVCache::combined(dkv->view(), c.layout);
      } else if (paged) {
        dk.emplace(paged->k);
        dv.emplace(paged->v);
        cache = kvattn::PagedKVCache::split(dk->view(), dv->view(), c.layout);
      } else {
        dk.emplace(k_ragged);
        dv.emplace(v_ragged);
      }
      std::optional<DeviceMirror> dindices;
      if (c.device_page_table && paged) p.page_table->indices = dindices.emplace(paged->indices).view();
      kvattn::BatchPrefill op(workspace.view(), c.layout);
      op.plan(p);
      const kvattn::TensorView dlse_view = want_lse ? dlse.view() : kvattn::TensorView{};
      auto run = [&] {
        if (paged)
          op.run(dq.view(), cache, dout.view(), dlse_view);
        else
          op.run(dq.view(), dk->view(), dv->view(), dout.view(), dlse_view);
      };
      if (!c.expect_error.empty()) {
        EXPECT_KVATTN_ERROR(run(), c.expect_error);
        return;
      }
      run_repeatedly(c.runs, dout, dlse, out, lse, [&] {
        run();
        op.check_errors();  // a clean run reports nothing
      });
#else
      FAIL() << "on_gpu case in a build without the CUDA backend";
#endif
    } else {
      kvattn::BatchPrefill op({}, c.layout);
      op.plan(p);
      if (paged)
        op.run(q.view(), paged->cache(), out.view(), lse_view);
      else
        op.run(q.view(), k_ragged.view(), v_ragged.view(), out.view(), lse_view);
      op.check_errors();
    }
  }
  EXPECT_TRUE(q.same_bytes(q_before)) << "run() modified q";

  // Reference, request by request.
  std::vector<double> o_ref, mag_ref, lse_ref;
  for (size_t b = 0; b < B; ++b) {
    const RequestData& r = reqs[b];
    ref::Request rr{r.qo_len, r.kv_len, hq, hkv, dqk, dvo, r.q.data(), r.k.data(), r.v.data(),
                    r.kv_len - r.qo_len, {}};
    if (c.variant.custom_mask) rr.mask = ref::custom_mask_bits(mask_bytes.data() + mask_indptr[b], r.kv_len);
    rr.user = c.user;
    rr.batch = int(b);
    ref::Result res = ref::attention(rr, c.variant);
    o_ref.insert(o_ref.end(), res.o.begin(), res.o.end());
    mag_ref.insert(mag_ref.end(), res.o_mag.begin(), res.o_mag.end());
    lse_ref.insert(lse_ref.end(), res.lse.begin(), res.lse.end());
  }
  // Decode (one query per request) runs the prefill kernels' decode shape at most, exact by default.
  const ComputeTolerance tol =
      c.on_gpu && approx_tanh_may_run(!decode) ? allow_approx_tanh(c.tolerance, c.variant, c.tanh_approx_error)
                                               : c.tolerance;
  EXPECT_TRUE(outputs_match(out, o_ref, mag_ref, tol));
  if (want_lse) EXPECT_TRUE(lse_match(lse, lse_ref, tol));
  else EXPECT_TRUE(padding_untouched(lse, "lse (not requested)"));
  int64_t lse_written = 0;
  if (!want_lse) lse.for_each([&](int64_t off, const std::vector<int64_t>&) { lse_written += !lse.is_poison_at(off); });
  EXPECT_EQ(lse_written, 0) << "lse was written although not requested";
}

}  // namespace

void run_decode_case(const AttnCase& c, Rng& rng) {
  for (auto [qo, kv] : c.lens) ASSERT_EQ(qo, 1) << "decode cases have one query per request";
  ASSERT_NE(c.store, KVStore::ragged) << "decode reads a paged cache";
  run_case(true, c, rng);
}

void run_prefill_case(const AttnCase& c, Rng& rng) { run_case(false, c, rng); }

}  // namespace kvattn_test
