#include "support/bsr_case.h"

#include <gtest/gtest.h>

#include "reference/reference.h"
#include "support/compare.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"

namespace kvattn_test {

using kvattn::DType;


void run_bsr_case(const BsrCase& bc, Rng& rng) {
  const AttnCase& c = bc.base;
  SCOPED_TRACE("bsr M " + std::to_string(bc.M) + " N " + std::to_string(bc.N) + " R x C " +
               std::to_string(bc.R) + " x " + std::to_string(bc.C) + ", " + c.describe());
  const int hq = c.num_qo_heads, hkv = c.num_kv_heads, dqk = c.head_dim_qk, dvo = c.dvo();
  const bool want_lse = c.want_lse && !c.variant.sigmoid && !(c.user && !c.user->use_softmax);

  // The pattern: each row block lists its present column blocks in random order.
  std::vector<int32_t> indptr{0}, indices;
  for (int64_t br = 0; br < bc.M / bc.R; ++br) {
    std::vector<int32_t> cols;
    for (int32_t j = 0; j < bc.N / bc.C; ++j)
      if (rng.coin(bc.density)) cols.push_back(j);
    rng.shuffle(cols);
    indices.insert(indices.end(), cols.begin(), cols.end());
    indptr.push_back(int32_t(indices.size()));
  }
  std::vector<int32_t> indices_buf = indices;
  indices_buf.push_back(-7);  // past indptr[-1]: never read

  auto make = [&](DType t, std::vector<int64_t> shape) {
    HostTensor x = c.strided ? HostTensor::strided(t, std::move(shape)) : HostTensor(t, std::move(shape));
    x.poison();
    return x;
  };
  HostTensor q = make(c.q_dtype, {bc.M, hq, dqk}), k = make(c.kv(), {bc.N, hkv, dqk}),
             v = make(c.kv(), {bc.N, hkv, dvo}), out = make(c.out(), {bc.M, hq, dvo}),
             lse = make(DType::f32, {bc.M, hq});
  std::vector<double> qd, kd, vd;
  auto fill = [&](HostTensor& t, char what, std::vector<double>& dst) {
    t.for_each([&](int64_t off, const std::vector<int64_t>& i) {
      t.set_at(off, fill_value(c.fill, what, i[0], int(i[1]), int(i[2]), rng));
      dst.push_back(t.get_at(off));
    });
  };
  fill(q, 'q', qd);
  fill(k, 'k', kd);
  fill(v, 'v', vd);

  HostTensor indptr_t = int32_tensor(indptr), indices_t = int32_tensor(indices_buf);
  kvattn::BlockSparsePlan p;
  static_cast<kvattn::AttentionShape&>(p) = shape_of(c);
  p.bsr = {indptr_t.view(), indices_t.view(), bc.M, bc.N, bc.R, bc.C};
  kvattn::BlockSparseAttention op;
  op.plan(p);
  op.run(q.view(), k.view(), v.view(), out.view(), want_lse ? lse.view() : kvattn::TensorView{});

  ref::Request r{bc.M, bc.N, hq, hkv, dqk, dvo, qd.data(), kd.data(), vd.data(), bc.N - bc.M,
                 ref::bsr_pattern(indptr, indices, bc.R, bc.C)};
  r.user = c.user;  // a user variant sees one sequence (batch 0)
  ref::Result res = ref::attention(r, c.variant);
  EXPECT_TRUE(outputs_match(out, res.o, res.o_mag));
  if (want_lse) EXPECT_TRUE(lse_match(lse, res.lse));
  else EXPECT_TRUE(padding_untouched(lse, "lse (not requested)"));
}

}  // namespace kvattn_test
