// `kvattn bench rope`: apply_rope, apply_rope_ragged and apply_rope_with_cos_sin_cache on the GPU
// through the public API (kvattn/ops.h), timed as the other benchmarks (CUDA events around each
// call on the default stream, cold L2 by rotating copies of the tensors, median of --iters).
// GB/s counts the q and k bytes read plus written (2 x nnz x (Hq + Hk) x head_dim x element size;
// the positions and the table are not counted), beside a device-to-device cudaMemcpyAsync of the
// same bytes (read + written) as the copy this device sustains at that size. Each case is checked
// once against the CPU backend on the same inputs (the table form bit for bit, the computed forms
// within a few ulps of the dtype). --sweep adds rows for other rows-per-CTA choices.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "commands.h"
#include "core/convert.h"
#include "kvattn/kvattn.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/rope_kernels.h"
#include "cuda/runtime.h"
#endif

namespace {

using kvattn::DType;
using kvattn::TensorView;

enum class RopeOp { pos_ids, ragged, table };
// Where q and k live: their own contiguous tensors written to fresh outputs, the same rotated in
// place, or views of one fused [nnz, Hq + 2 Hk, D] QKV buffer rotated in place (vLLM's call).
enum class RopeLayout { out_of_place, in_place, qkv_in_place };

struct RopeBenchCase {
  std::string id;
  int64_t nnz = 4096;
  int hq = 32, hk = 8, head_dim = 128, rotary_dim = 0;  // 0: the head dim
  DType dtype = DType::bf16;
  RopeOp op = RopeOp::pos_ids;
  RopeLayout layout = RopeLayout::out_of_place;
  bool interleave = false, llama31 = false;

  int rd() const { return rotary_dim == 0 ? head_dim : rotary_dim; }
  double bytes() const { return 2.0 * double(nnz) * (hq + hk) * head_dim * double(kvattn::dtype_size(dtype)); }
  std::string heads() const { return std::to_string(hq) + "/" + std::to_string(hk); }
  std::string what() const {
    std::string s = op == RopeOp::pos_ids ? "pos_ids" : op == RopeOp::ragged ? "ragged" : "cos/sin table";
    if (interleave) s += ", interleaved";
    if (llama31) s += ", llama31";
    if (rotary_dim) s += ", rotary " + std::to_string(rotary_dim);
    s += layout == RopeLayout::out_of_place ? ", out of place" : layout == RopeLayout::in_place ? ", in place" : ", in QKV";
    return s;
  }
  nlohmann::json fields() const {
    return {{"op", "rope"}, {"id", id}, {"nnz", nnz}, {"num_qo_heads", hq}, {"num_kv_heads", hk},
            {"head_dim", head_dim}, {"rotary_dim", rd()}, {"dtype", std::string(kvattn::dtype_name(dtype))},
            {"positions", op == RopeOp::pos_ids ? "pos_ids" : op == RopeOp::ragged ? "ragged" : "table"},
            {"layout", layout == RopeLayout::out_of_place ? "out_of_place" : layout == RopeLayout::in_place ? "in_place" : "qkv_in_place"},
            {"interleave", interleave}, {"llama31", llama31}, {"bytes", bytes()}};
  }
};

std::vector<RopeBenchCase> rope_cases(bool quick) {
  std::vector<RopeBenchCase> cases;
  auto add = [&](RopeBenchCase c) {
    c.id = std::string(c.op == RopeOp::table ? "cossin" : c.op == RopeOp::ragged ? "ragged" : "rope") + "_t" +
           std::to_string(c.nnz) + "_h" + std::to_string(c.hq) + "-" + std::to_string(c.hk) + "_d" +
           std::to_string(c.head_dim) + (c.rotary_dim ? "_rd" + std::to_string(c.rotary_dim) : "") + "_" +
           std::string(kvattn::dtype_name(c.dtype)) + (c.interleave ? "_il" : "") + (c.llama31 ? "_l31" : "") +
           (c.layout == RopeLayout::in_place ? "_inplace" : c.layout == RopeLayout::qkv_in_place ? "_qkv" : "");
    cases.push_back(c);
  };
  RopeBenchCase base;  // Llama-3-8B, 4096 tokens, bf16: the target (>= 3.5 TB/s)
  add(base);
  auto with = [&](auto f) {
    RopeBenchCase c = base;
    f(c);
    add(c);
  };
  with([](RopeBenchCase& c) { c.layout = RopeLayout::in_place; });
  with([](RopeBenchCase& c) { c.op = RopeOp::table, c.layout = RopeLayout::qkv_in_place; });  // vLLM / SGLang
  if (quick) return cases;
  with([](RopeBenchCase& c) { c.layout = RopeLayout::qkv_in_place; });
  with([](RopeBenchCase& c) { c.op = RopeOp::table; });
  with([](RopeBenchCase& c) { c.op = RopeOp::ragged; });
  with([](RopeBenchCase& c) { c.interleave = true; });
  with([](RopeBenchCase& c) { c.llama31 = true; });
  with([](RopeBenchCase& c) { c.rotary_dim = 64; });
  with([](RopeBenchCase& c) { c.dtype = DType::f16; });
  with([](RopeBenchCase& c) { c.dtype = DType::f32; });
  with([](RopeBenchCase& c) { c.nnz = 16384; });
  with([](RopeBenchCase& c) { c.nnz = 1024; });
  with([](RopeBenchCase& c) { c.nnz = 64; });  // a decode step: latency
  with([](RopeBenchCase& c) { c.hq = 64; });    // Llama-3-70B
  with([](RopeBenchCase& c) { c.hk = 32; });    // MHA
  with([](RopeBenchCase& c) { c.head_dim = 64, c.hq = 32, c.hk = 8; });
  with([](RopeBenchCase& c) { c.head_dim = 256, c.hq = 16, c.hk = 8; });
  return cases;
}

struct RopeBenchOptions {
  bool quick = false, json = false, list = false, sweep = false;
  int iters = 50;
  std::vector<std::string> cases;
};

void list_rope_cases(const RopeBenchOptions& o) {
  const auto cases = kvattn_cli::pick_cases(rope_cases(o.quick), o.cases, o.quick);
  if (o.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& c : cases) rows.push_back(c.fields());
    std::cout << rows.dump(1) << "\n";
    return;
  }
  std::printf("%-40s %6s %6s %5s %-40s %9s\n", "id", "tokens", "heads", "dim", "op", "MB moved");
  for (const auto& c : cases)
    std::printf("%-40s %6lld %6s %5d %-40s %9.1f\n", c.id.c_str(), static_cast<long long>(c.nnz), c.heads().c_str(),
                c.head_dim, c.what().c_str(), c.bytes() / 1e6);
}

#if KVATTN_WITH_CUDA
using kvattn_cli::cuda_ok;
using kvattn_cli::DeviceBuffer;

// Random values in [-2, 2) of dtype t, as bytes.
std::vector<uint8_t> random_values(DType t, size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  const size_t esz = kvattn::dtype_size(t);
  std::vector<uint8_t> out(n * esz);
  for (size_t i = 0; i < n; ++i) {
    const float f = u(g);
    if (t == DType::f32) {
      std::memcpy(&out[i * 4], &f, 4);
    } else {
      const uint16_t h = t == DType::bf16 ? kvattn::convert::f32_to_bf16(f) : kvattn::convert::f32_to_f16(f);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

double value_at(const std::vector<uint8_t>& b, DType t, size_t i) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, &b[i * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &b[i * 2], 2);
  return t == DType::bf16 ? kvattn::convert::bf16_to_f32(h) : kvattn::convert::f16_to_f32(h);
}

// One copy of a case's tensors on the device: q and k (separate, or in one QKV buffer) and the outputs.
struct RopeTensors {
  std::unique_ptr<DeviceBuffer<uint8_t>> qk, out;
  TensorView q, k, q_out, k_out;
};

RopeTensors make_tensors(const RopeBenchCase& c, const std::vector<uint8_t>& q_host, const std::vector<uint8_t>& k_host) {
  const auto dev = kvattn::Device::cuda(0);
  const size_t esz = kvattn::dtype_size(c.dtype);
  const int64_t D = c.head_dim, n = c.nnz;
  RopeTensors t;
  if (c.layout == RopeLayout::qkv_in_place) {
    const int64_t heads = c.hq + 2 * c.hk, row = heads * D;
    t.qk = std::make_unique<DeviceBuffer<uint8_t>>(size_t(n * row) * esz);
    // Row r: q heads, k heads, v heads (v left as the memset leaves it).
    std::vector<uint8_t> fused(size_t(n * row) * esz, 0);
    const size_t qrow = size_t(c.hq * D) * esz, krow = size_t(c.hk * D) * esz;
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(&fused[size_t(r * row) * esz], &q_host[size_t(r) * qrow], qrow);
      std::memcpy(&fused[size_t(r * row) * esz + qrow], &k_host[size_t(r) * krow], krow);
    }
    cuda_ok(cudaMemcpy(t.qk->ptr, fused.data(), fused.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    t.q = TensorView(t.qk->ptr, c.dtype, {n, c.hq, D}, {row, D, 1}, dev);
    t.k = TensorView(t.qk->ptr + qrow, c.dtype, {n, c.hk, D}, {row, D, 1}, dev);
    t.q_out = t.q, t.k_out = t.k;
    return t;
  }
  t.qk = std::make_unique<DeviceBuffer<uint8_t>>(q_host.size() + k_host.size());
  cuda_ok(cudaMemcpy(t.qk->ptr, q_host.data(), q_host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_ok(cudaMemcpy(t.qk->ptr + q_host.size(), k_host.data(), k_host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  t.q = TensorView(t.qk->ptr, c.dtype, {n, c.hq, D}, dev);
  t.k = TensorView(t.qk->ptr + q_host.size(), c.dtype, {n, c.hk, D}, dev);
  if (c.layout == RopeLayout::in_place) {
    t.q_out = t.q, t.k_out = t.k;
    return t;
  }
  t.out = std::make_unique<DeviceBuffer<uint8_t>>(q_host.size() + k_host.size());
  t.q_out = TensorView(t.out->ptr, c.dtype, {n, c.hq, D}, dev);
  t.k_out = TensorView(t.out->ptr + q_host.size(), c.dtype, {n, c.hk, D}, dev);
  return t;
}

// The positions: 16 requests of nnz / 16 tokens (a prefill batch), each starting at a different
// offset; as pos_ids, as (indptr, offsets), and the table of cos/sin of the plain frequencies.
struct RopePositions {
  std::vector<int32_t> pos, indptr, offsets;
  int64_t max_pos = 0;
};
RopePositions make_positions(const RopeBenchCase& c) {
  RopePositions p;
  const int64_t requests = std::min<int64_t>(16, c.nnz), per = (c.nnz + requests - 1) / requests;
  p.indptr.push_back(0);
  for (int64_t b = 0; b < requests; ++b) {
    const int64_t start = b * per, end = std::min(c.nnz, start + per);
    const int32_t off = int32_t(b * 97);
    p.offsets.push_back(off);
    for (int64_t r = start; r < end; ++r) p.pos.push_back(off + int32_t(r - start));
    p.indptr.push_back(int32_t(end));
  }
  for (int32_t x : p.pos) p.max_pos = std::max<int64_t>(p.max_pos, x + 1);
  return p;
}

nlohmann::json run_rope_case(const RopeBenchCase& c, const RopeBenchOptions& o, double peak_gbps) {
  const auto dev = kvattn::Device::cuda(0);
  const size_t esz = kvattn::dtype_size(c.dtype);
  const int64_t D = c.head_dim;
  const auto q_host = random_values(c.dtype, size_t(c.nnz * c.hq * D), 11);
  const auto k_host = random_values(c.dtype, size_t(c.nnz * c.hk * D), 12);
  const RopePositions pos = make_positions(c);
  // Enough copies that one call's tensors have left the L2 (50-60 MB) before they are read again.
  const double per_copy = double(q_host.size() + k_host.size()) * (c.layout == RopeLayout::out_of_place ? 2 : 1);
  const int copies = int(std::clamp<double>(std::ceil(256e6 / std::max(per_copy, 1.0)), 1, 8));
  std::vector<RopeTensors> t;
  for (int i = 0; i < copies; ++i) t.push_back(make_tensors(c, q_host, k_host));
  DeviceBuffer<int32_t> dpos(pos.pos.size()), dind(pos.indptr.size()), doff(pos.offsets.size());
  cuda_ok(cudaMemcpy(dpos.ptr, pos.pos.data(), pos.pos.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_ok(cudaMemcpy(dind.ptr, pos.indptr.data(), pos.indptr.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_ok(cudaMemcpy(doff.ptr, pos.offsets.data(), pos.offsets.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  // The table: cos, then sin, of p * theta^(-2t/rd) for the rows the positions reach.
  const int rd = c.rd(), half = rd / 2;
  std::vector<float> table(size_t(pos.max_pos) * size_t(rd));
  for (int64_t p = 0; p < pos.max_pos; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = double(p) * std::pow(1e4, -2.0 * i / rd);
      table[size_t(p * rd + i)] = float(std::cos(a));
      table[size_t(p * rd + half + i)] = float(std::sin(a));
    }
  DeviceBuffer<float> dtable(table.size());
  cuda_ok(cudaMemcpy(dtable.ptr, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  kvattn::RopeOptions opt;
  opt.rotary_dim = c.rotary_dim;
  opt.interleave = c.interleave;
  if (c.llama31) opt.llama31 = kvattn::Llama31Scaling{}, opt.rope_theta = 5e5f;
  const TensorView pos_v(dpos.ptr, DType::i32, {c.nnz}, dev), ind_v(dind.ptr, DType::i32, {int64_t(pos.indptr.size())}, dev),
      off_v(doff.ptr, DType::i32, {int64_t(pos.offsets.size())}, dev),
      table_v(dtable.ptr, DType::f32, {pos.max_pos, rd}, dev);
  auto call = [&](const TensorView& q, const TensorView& k, const TensorView& qo, const TensorView& ko, const TensorView& p,
                  const TensorView& tab, const TensorView& ind, const TensorView& off) {
    if (c.op == RopeOp::pos_ids) kvattn::apply_rope(q, k, qo, ko, p, opt);
    else if (c.op == RopeOp::ragged) kvattn::apply_rope_ragged(q, k, qo, ko, ind, off, opt);
    else kvattn::apply_rope_with_cos_sin_cache(q, k, qo, ko, p, tab, c.interleave);
  };
  auto run = [&](int copy) {
    const RopeTensors& x = t[size_t(copy)];
    call(x.q, x.k, x.q_out, x.k_out, pos_v, table_v, ind_v, off_v);
  };

  // Check once, against the CPU backend on the same inputs (in place: on fresh copy-0 tensors).
  std::string check;
  {
    RopeTensors fresh = make_tensors(c, q_host, k_host);
    call(fresh.q, fresh.k, fresh.q_out, fresh.k_out, pos_v, table_v, ind_v, off_v);
    cuda_ok(cudaDeviceSynchronize(), "the checked call");
    std::vector<uint8_t> gq(q_host.size()), gk(k_host.size());
    const size_t qrow = size_t(c.hq * D) * esz, krow = size_t(c.hk * D) * esz;
    const int64_t qo_row = fresh.q_out.stride(0) * int64_t(esz), ko_row = fresh.k_out.stride(0) * int64_t(esz);
    cuda_ok(cudaMemcpy2D(gq.data(), qrow, fresh.q_out.data(), size_t(qo_row), qrow, size_t(c.nnz), cudaMemcpyDeviceToHost), "copy back");
    if (krow)
      cuda_ok(cudaMemcpy2D(gk.data(), krow, fresh.k_out.data(), size_t(ko_row), krow, size_t(c.nnz), cudaMemcpyDeviceToHost),
              "copy back");
    std::vector<uint8_t> cq(q_host.size()), ck(k_host.size());
    std::vector<int32_t> hp = pos.pos, hi = pos.indptr, ho = pos.offsets;
    call(TensorView(q_host.data(), c.dtype, {c.nnz, c.hq, D}), TensorView(k_host.data(), c.dtype, {c.nnz, c.hk, D}),
         TensorView(cq.data(), c.dtype, {c.nnz, c.hq, D}), TensorView(ck.data(), c.dtype, {c.nnz, c.hk, D}),
         TensorView(hp.data(), DType::i32, {c.nnz}), TensorView(table.data(), DType::f32, {pos.max_pos, rd}),
         TensorView(hi.data(), DType::i32, {int64_t(hi.size())}), TensorView(ho.data(), DType::i32, {int64_t(ho.size())}));
    // Computed cos/sin: CUDA's powf and sincosf against the C library's: the f32 angles may differ
    // by a few ulps (allowed 16: 16 * 2^-24 * max_pos radians), which moves an element by that
    // times |x0| + |x1| <= 4, then the rounding to the dtype by one ulp (allowed 2 ulps of 4).
    // The table: the same bits.
    const double ulp = c.dtype == DType::f32 ? 0x1p-23 : c.dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
    const double tol = c.op == RopeOp::table ? 0.0 : 2 * ulp * 4 + 16 * 0x1p-24 * double(pos.max_pos) * 4;
    int64_t bad = 0, differ = 0;
    double worst = 0;
    for (auto [g, w] : {std::pair{&gq, &cq}, std::pair{&gk, &ck}})
      for (size_t i = 0; i < g->size() / esz; ++i) {
        const double a = value_at(*g, c.dtype, i), b = value_at(*w, c.dtype, i);
        if (std::memcmp(&(*g)[i * esz], &(*w)[i * esz], esz) == 0) continue;
        ++differ;
        worst = std::max(worst, std::fabs(a - b));
        bad += !(std::fabs(a - b) <= tol);
      }
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s (%lld of %lld elements differ from the CPU, max %.2g)", bad ? "MISMATCH" : "ok",
                  static_cast<long long>(differ), static_cast<long long>((gq.size() + gk.size()) / esz), worst);
    check = buf;
  }

  const double ms = kvattn_cli::median_ms(run, copies, o.iters);
  const int rows_per_cta = kvattn::cuda::last_rope_rows_per_cta();
  // The device's copy of the same bytes: read size/2, write size/2 (one direction of the op each).
  const size_t half_bytes = size_t(c.bytes() / 2);
  DeviceBuffer<uint8_t> src(half_bytes * size_t(copies)), dst(half_bytes * size_t(copies));
  const double copy_ms = kvattn_cli::median_ms(
      [&](int copy) {
        cuda_ok(cudaMemcpyAsync(dst.ptr + size_t(copy) * half_bytes, src.ptr + size_t(copy) * half_bytes, half_bytes,
                                cudaMemcpyDeviceToDevice, nullptr),
                "cudaMemcpyAsync");
      },
      copies, o.iters);
  const double gbps = c.bytes() / (ms * 1e-3) / 1e9, copy_gbps = c.bytes() / (copy_ms * 1e-3) / 1e9;
  nlohmann::json row = c.fields();
  row.update({{"us", ms * 1e3}, {"GBps", gbps}, {"pct_of_4800", 100.0 * gbps / peak_gbps}, {"copy_us", copy_ms * 1e3},
              {"copy_GBps", copy_gbps}, {"rows_per_cta", rows_per_cta}, {"l2_copies", copies}, {"check", check}});
  if (o.sweep) {
    nlohmann::json sweep = nlohmann::json::array();
    for (int rows : {1, 2, 4, 8, 16, 32, 64}) {
      if (kvattn::kernels::rope_smem_bytes(rows, rd) > 48 * 1024) continue;
      kvattn::cuda::set_rope_rows_per_cta_for_benchmarks(rows);
      const double sms = kvattn_cli::median_ms(run, copies, o.iters);
      sweep.push_back({{"rows_per_cta", rows}, {"us", sms * 1e3}, {"GBps", c.bytes() / (sms * 1e-3) / 1e9}});
    }
    kvattn::cuda::set_rope_rows_per_cta_for_benchmarks(0);
    row["sweep"] = sweep;
  }
  return row;
}
#endif

void bench_rope(const RopeBenchOptions& o) {
  if (o.list) return list_rope_cases(o);
  const auto cases = kvattn_cli::pick_cases(rope_cases(o.quick), o.cases, o.quick);
#if KVATTN_WITH_CUDA
  kvattn::cuda::require_cuda("kvattn bench rope");
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json)
    std::printf("%-36s %6s %6s %4s %-34s %9s %8s %7s %9s %4s  %s\n", "case", "tokens", "heads", "dim", "op", "time",
                "GB/s", "% 4.8T", "copy GB/s", "rows", "check vs CPU");
  bool mismatch = false;
  for (const auto& c : cases) {
    auto row = run_rope_case(c, o, 4800.0);
    mismatch |= row["check"].get<std::string>().rfind("MISMATCH", 0) == 0;
    if (!o.json) {
      std::printf("%-36s %6lld %6s %4d %-34s %6.1f us %8.0f %6.1f%% %9.0f %4d  %s\n", c.id.c_str(),
                  static_cast<long long>(c.nnz), c.heads().c_str(), c.head_dim, c.what().c_str(),
                  row["us"].get<double>(), row["GBps"].get<double>(), row["pct_of_4800"].get<double>(),
                  row["copy_GBps"].get<double>(), row["rows_per_cta"].get<int>(), row["check"].get<std::string>().c_str());
      if (row.contains("sweep"))
        for (const auto& s : row["sweep"])
          std::printf("%-36s %6s %6s %4s %-34s %6.1f us %8.0f %6.1f%% %9s %4d\n", "", "", "", "", "  (rows per CTA forced)",
                      s["us"].get<double>(), s["GBps"].get<double>(), 100.0 * s["GBps"].get<double>() / 4800.0, "",
                      s["rows_per_cta"].get<int>());
    }
    std::fflush(stdout);
    rows.push_back(row);
  }
  if (o.json) std::cout << rows.dump(1) << "\n";
  if (mismatch) throw CLI::RuntimeError(1);
#else
  (void)cases;
  throw kvattn::Error("kvattn bench rope needs the CUDA backend, and this build has none");
#endif
}

}  // namespace

void register_bench_rope(CLI::App& bench) {
  auto* cmd = bench.add_subcommand(
      "rope", "RoPE on the GPU: apply_rope (pos_ids, ragged) and apply_rope_with_cos_sin_cache; Llama-3-8B's "
              "4096 tokens x 32/8 heads x 128 (bf16) and other shapes; GB/s of q and k read + written");
  static RopeBenchOptions o;
  cmd->add_flag("--quick", o.quick, "three cases only (the 4096 x 32/8 x 128 bf16 target: out of place, in place, "
                                    "the cos/sin table in a QKV buffer)");
  cmd->add_flag("--json", o.json, "print the rows as JSON (with --list: the cases' shapes)");
  cmd->add_flag("--list", o.list, "list the cases and run nothing; no GPU needed");
  cmd->add_flag("--sweep", o.sweep, "also time each case with 1, 2, 4, ... 64 rows per CTA");
  cmd->add_option("--cases", o.cases, "run only these case ids, comma-separated (see --list)")->delimiter(',');
  cmd->add_option("--iters", o.iters, "timed runs per case (median reported)")->check(CLI::Range(1, 10000));
  cmd->callback([] { bench_rope(o); });
}
