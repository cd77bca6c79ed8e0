// The stand-alone operations of kvattn/ops.h: merge_state, merge_state_in_place, merge_states,
// append_paged_kv_cache, apply_rope, apply_rope_ragged, apply_rope_with_cos_sin_cache. Outputs not
// given are allocated in the first input's framework (and on its device).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"
#include "core/validate.h"

namespace kvattn::py {

namespace {

}  // namespace

void bind_ops(nb::module_& m) {
  // ---- the library's own checks, for kvattn.flashinfer's Python helpers -----------------------------
  // (Arrays the Python layer reads before the C++ call does, e.g. to lay out a custom mask, are
  // checked here first, with the C++ messages.)
  m.def(
      "_indptr_values",
      [](const char* name, nb::handle x, int64_t expected_len) {
        Held h;
        const TensorView& t = index_arg(name, x, h);
        auto v = validate::indptr(name, t, expected_len);
        return std::vector<int64_t>(v.begin(), v.end());
      },
      nb::arg("name"), nb::arg("x"), nb::arg("expected_len") = -1,
      "The values of an indptr array (1-D int32 on the host, [0] = 0, non-decreasing), checked as "
      "plan() checks them; kvattn.Error naming `name` otherwise.");
  m.def(
      "_int32_values",
      [](const char* name, nb::handle x, int64_t expected_len) {
        Held h;
        auto v = validate::int32_array(name, index_arg(name, x, h), expected_len);
        return std::vector<int64_t>(v.begin(), v.end());
      },
      nb::arg("name"), nb::arg("x"), nb::arg("expected_len") = -1,
      "The values of a 1-D int32 host array (of expected_len elements when >= 0), checked as the "
      "library checks index arrays; kvattn.Error naming `name` otherwise.");
  m.def(
      "_page_table_lengths",
      [](nb::handle page_table, int page_size) {
        Held h[3];
        const PageTable t = page_table_arg(page_table, h);
        const auto info = validate::page_table(t, page_size, -1, true);
        std::vector<int64_t> lens(size_t(info.batch_size));
        for (int64_t b = 0; b < info.batch_size; ++b)
          lens[size_t(b)] = validate::paged_kv_len(info, page_size, b);
        return lens;
      },
      nb::arg("page_table"), nb::arg("page_size"),
      "Each request's KV length from a page table (kv_indptr, kv_indices, kv_last_page_len), "
      "checked as plan() checks it (the page ids' values excepted); kvattn.Error otherwise.");

  m.def(
      "merge_state",
      [](nb::handle v_a, nb::handle s_a, nb::handle v_b, nb::handle s_b, nb::handle v_out,
         nb::handle s_out, nb::handle stream) {
        Held ha, hsa, hb, hsb, ho, hso;
        const TensorView& va = tensor_arg("v_a", v_a, ha);
        const TensorView& sa = tensor_arg("s_a", s_a, hsa);
        const TensorView& vb = tensor_arg("v_b", v_b, hb);
        const TensorView& sb = tensor_arg("s_b", s_b, hsb);
        nb::object vo = nb::borrow(v_out), so = nb::borrow(s_out);
        if (vo.is_none() && va.ndim() == 3)
          vo = empty_like_framework("v_a", v_a, {va.size(0), va.size(1), va.size(2)}, va.dtype());
        if (so.is_none() && va.ndim() == 3)
          so = empty_like_framework("v_a", v_a, {va.size(0), va.size(1)}, DType::f32);
        const TensorView& o = tensor_arg("v_out", vo, ho, true, true);
        const TensorView& os = tensor_arg("s_out", so, hso, true, true);
        void* st = stream_arg(stream, v_a, va);
        without_gil([&] { merge_state(va, sa, vb, sb, o, os, st); });
        return nb::make_tuple(vo, so);
      },
      nb::arg("v_a"), nb::arg("s_a"), nb::arg("v_b"), nb::arg("s_b"), nb::kw_only(),
      nb::arg("v_out") = nb::none(), nb::arg("s_out") = nb::none(), nb::arg("stream") = nb::none(),
      "(v_a, s_a) (+) (v_b, s_b) for attention states over disjoint KV sets (SEMANTICS.md, "
      "'Merging'): v [n, H, D] f32/f16/bf16, s [n, H] float32 base-2 LSE. Returns (v_out, s_out), "
      "allocated in v_a's framework (v_a's dtype) when not given; an output may alias an input "
      "exactly.");

  m.def(
      "merge_state_in_place",
      [](nb::handle v, nb::handle s, nb::handle v_other, nb::handle s_other, nb::handle mask,
         nb::handle stream) {
        Held hv, hs, ho, hso, hm;
        const TensorView& vv = tensor_arg("v", v, hv, true);
        const TensorView& sv = tensor_arg("s", s, hs, true);
        const TensorView& vo = tensor_arg("v_other", v_other, ho);
        const TensorView& so = tensor_arg("s_other", s_other, hso);
        const TensorView& mv = tensor_arg("mask", mask, hm, false, true);
        void* st = stream_arg(stream, v, vv);
        without_gil([&] { merge_state_in_place(vv, sv, vo, so, mv, st); });
      },
      nb::arg("v"), nb::arg("s"), nb::arg("v_other"), nb::arg("s_other"),
      nb::arg("mask") = nb::none(), nb::kw_only(), nb::arg("stream") = nb::none(),
      "v, s <- (v, s) (+) (v_other, s_other) in place; rows whose mask byte ([n] uint8) is 0 are "
      "left untouched. v_other has v's dtype.");

  m.def(
      "merge_states",
      [](nb::handle v, nb::handle s, nb::handle v_out, nb::handle s_out, nb::handle stream) {
        Held hv, hs, ho, hso;
        const TensorView& vv = tensor_arg("v", v, hv);
        const TensorView& sv = tensor_arg("s", s, hs);
        nb::object vo = nb::borrow(v_out), so = nb::borrow(s_out);
        if (vo.is_none() && vv.ndim() == 4)
          vo = empty_like_framework("v", v, {vv.size(0), vv.size(2), vv.size(3)}, vv.dtype());
        if (so.is_none() && vv.ndim() == 4)
          so = empty_like_framework("v", v, {vv.size(0), vv.size(2)}, DType::f32);
        const TensorView& o = tensor_arg("v_out", vo, ho, true, true);
        const TensorView& os = tensor_arg("s_out", so, hso, true, true);
        void* st = stream_arg(stream, v, vv);
        without_gil([&] { merge_states(vv, sv, o, os, st); });
        return nb::make_tuple(vo, so);
      },
      nb::arg("v"), nb::arg("s"), nb::kw_only(), nb::arg("v_out") = nb::none(),
      nb::arg("s_out") = nb::none(), nb::arg("stream") = nb::none(),
      "Folds k states per row in index order: v [n, k, H, D], s [n, k, H] -> (v_out [n, H, D], "
      "s_out [n, H]), allocated in v's framework when not given. k = 0 gives o = 0, lse = -inf.");

  m.def(
      "append_paged_kv_cache",
      [](nb::handle append_k, nb::handle append_v, nb::handle batch_indices, nb::handle positions,
         nb::handle kv_cache, nb::handle page_table, nb::handle layout, nb::handle stream) {
        Held hk, hv, hb, hp, hck, hcv, hpt[3];
        const TensorView& k = tensor_arg("append_k", append_k, hk);
        const TensorView& v = tensor_arg("append_v", append_v, hv);
        const TensorView& b = index_arg("batch_indices", batch_indices, hb);
        const TensorView& p = index_arg("positions", positions, hp);
        PagedKVCache cache = paged_cache_arg(kv_cache, nb::none(), layout_arg(layout), hck, hcv, true);
        PageTable table = page_table_arg(page_table, hpt);
        nb::handle like = PyTuple_Check(kv_cache.ptr()) || PyList_Check(kv_cache.ptr())
                              ? nb::handle(PySequence_Fast_GET_ITEM(kv_cache.ptr(), 0))
                              : kv_cache;
        void* st = stream_arg(stream, like, cache.k);
        without_gil([&] { append_paged_kv_cache(k, v, b, p, cache, table, st); });
      },
      nb::arg("append_k"), nb::arg("append_v"), nb::arg("batch_indices"), nb::arg("positions"),
      nb::arg("kv_cache"), nb::arg("page_table"), nb::kw_only(), nb::arg("kv_layout") = "NHD",
      nb::arg("stream") = nb::none(),
      "Writes row r of append_k / append_v ([nnz, Hkv, D]) at token positions[r] of request "
      "batch_indices[r] (int32 [nnz]) into the paged cache ((k_cache, v_cache) or 5-D). page_table "
      "(kvattn.PageTable or (indptr, indices, last_page_len)) already describes the lengths after "
      "the append. The append dtype may differ from the cache's (converted, round to nearest even; "
      "fp8 saturating). CPU caches take host index arrays and are validated before any write.");

  m.def(
      "apply_rope",
      [](nb::handle q, nb::handle k, nb::handle pos_ids, nb::handle q_out, nb::handle k_out,
         int rotary_dim, float rope_scale, float rope_theta, bool interleave,
         std::optional<Llama31Scaling> llama31, nb::handle stream) {
        Held hq, hk, hp, hqo, hko;
        const TensorView& qv = tensor_arg("q", q, hq);
        const TensorView& kv = tensor_arg("k", k, hk);
        const TensorView& pv = index_arg("pos_ids", pos_ids, hp);
        nb::object qo = nb::borrow(q_out), ko = nb::borrow(k_out);
        if (qo.is_none() && qv.ndim() == 3)
          qo = empty_like_framework("q", q, {qv.size(0), qv.size(1), qv.size(2)}, qv.dtype());
        if (ko.is_none() && kv.ndim() == 3)
          ko = empty_like_framework("k", k, {kv.size(0), kv.size(1), kv.size(2)}, kv.dtype());
        const TensorView& qov = tensor_arg("q_out", qo, hqo, true, true);
        const TensorView& kov = tensor_arg("k_out", ko, hko, true, true);
        RopeOptions o;
        o.rope_scale = rope_scale;
        o.rope_theta = rope_theta;
        o.interleave = interleave;
        o.llama31 = llama31;
        o.rotary_dim = rotary_dim;
        void* st = stream_arg(stream, q, qv);
        without_gil([&] { apply_rope(qv, kv, qov, kov, pv, o, st); });
        return nb::make_tuple(qo, ko);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("pos_ids"), nb::kw_only(), nb::arg("q_out") = nb::none(),
      nb::arg("k_out") = nb::none(), nb::arg("rotary_dim") = 0, nb::arg("rope_scale") = 1.0f,
      nb::arg("rope_theta") = 1.0e4f, nb::arg("interleave") = false, nb::arg("llama31") = nb::none(),
      nb::arg("stream") = nb::none(),
      "Rotates q [nnz, Hq, D] and k [nnz, Hk, D] (f32/f16/bf16) by pos_ids [nnz] (int32; on the host "
      "for CPU tensors, on q's device for CUDA tensors): the first rotary_dim (0: all) elements of "
      "each head (SEMANTICS.md, 'Rotary position embedding'). Returns (q_out, k_out), allocated like q "
      "and k when not given; pass q_out=q, k_out=k to rotate in place. CUDA tensors run on the GPU on "
      "the framework's current stream (graph-capturable once warmed up).");

  m.def(
      "apply_rope_ragged",
      [](nb::handle q, nb::handle k, nb::handle indptr, nb::handle offsets, nb::handle q_out,
         nb::handle k_out, int rotary_dim, float rope_scale, float rope_theta, bool interleave,
         std::optional<Llama31Scaling> llama31, nb::handle stream) {
        Held hq, hk, hi, ho, hqo, hko;
        const TensorView& qv = tensor_arg("q", q, hq);
        const TensorView& kv = tensor_arg("k", k, hk);
        const TensorView& iv = index_arg("indptr", indptr, hi);
        const TensorView& ov = index_arg("offsets", offsets, ho);
        nb::object qo = nb::borrow(q_out), ko = nb::borrow(k_out);
        if (qo.is_none() && qv.ndim() == 3)
          qo = empty_like_framework("q", q, {qv.size(0), qv.size(1), qv.size(2)}, qv.dtype());
        if (ko.is_none() && kv.ndim() == 3)
          ko = empty_like_framework("k", k, {kv.size(0), kv.size(1), kv.size(2)}, kv.dtype());
        const TensorView& qov = tensor_arg("q_out", qo, hqo, true, true);
        const TensorView& kov = tensor_arg("k_out", ko, hko, true, true);
        RopeOptions o;
        o.rope_scale = rope_scale;
        o.rope_theta = rope_theta;
        o.interleave = interleave;
        o.llama31 = llama31;
        o.rotary_dim = rotary_dim;
        void* st = stream_arg(stream, q, qv);
        without_gil([&] { apply_rope_ragged(qv, kv, qov, kov, iv, ov, o, st); });
        return nb::make_tuple(qo, ko);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("indptr"), nb::arg("offsets"), nb::kw_only(),
      nb::arg("q_out") = nb::none(), nb::arg("k_out") = nb::none(), nb::arg("rotary_dim") = 0,
      nb::arg("rope_scale") = 1.0f, nb::arg("rope_theta") = 1.0e4f, nb::arg("interleave") = false,
      nb::arg("llama31") = nb::none(), nb::arg("stream") = nb::none(),
      "apply_rope of a ragged batch (FlashInfer's apply_rope): row r of request b (indptr[b] <= r < "
      "indptr[b + 1]; indptr [B + 1] int32) at position offsets[b] + r - indptr[b] (offsets [B] "
      "int32). Host arrays for CPU tensors (checked: indptr[B] = nnz), contiguous int32 tensors on "
      "q's device for CUDA tensors (a row the kernel cannot place is not written). Otherwise as "
      "apply_rope.");

  m.def(
      "apply_rope_with_cos_sin_cache",
      [](nb::handle q, nb::handle k, nb::handle pos_ids, nb::handle cos_sin_cache, nb::handle q_out,
         nb::handle k_out, bool interleave, nb::handle stream) {
        Held hq, hk, hp, hc, hqo, hko;
        const TensorView& qv = tensor_arg("q", q, hq);
        const TensorView& kv = tensor_arg("k", k, hk);
        const TensorView& pv = index_arg("pos_ids", pos_ids, hp);
        const TensorView& cv = tensor_arg("cos_sin_cache", cos_sin_cache, hc);
        nb::object qo = nb::borrow(q_out), ko = nb::borrow(k_out);
        if (qo.is_none() && qv.ndim() == 3)
          qo = empty_like_framework("q", q, {qv.size(0), qv.size(1), qv.size(2)}, qv.dtype());
        if (ko.is_none() && kv.ndim() == 3)
          ko = empty_like_framework("k", k, {kv.size(0), kv.size(1), kv.size(2)}, kv.dtype());
        const TensorView& qov = tensor_arg("q_out", qo, hqo, true, true);
        const TensorView& kov = tensor_arg("k_out", ko, hko, true, true);
        void* st = stream_arg(stream, q, qv);
        without_gil([&] { apply_rope_with_cos_sin_cache(qv, kv, qov, kov, pv, cv, interleave, st); });
        return nb::make_tuple(qo, ko);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("pos_ids"), nb::arg("cos_sin_cache"), nb::kw_only(),
      nb::arg("q_out") = nb::none(), nb::arg("k_out") = nb::none(), nb::arg("interleave") = false,
      nb::arg("stream") = nb::none(),
      "Rotates q [nnz, Hq, D] and k [nnz, Hk, D] by the precomputed cos/sin of row pos_ids[r] "
      "(int32; host for CPU tensors, each in [0, max_position), checked; on q's device for CUDA "
      "tensors, a row outside the table is not written) of cos_sin_cache [max_position, rotary_dim] "
      "(float32 on q's device: cos of the rotary_dim / 2 frequencies, then their sin); the first "
      "rotary_dim elements of each head, rotate-half or interleaved (kvattn/ops.h). Returns (q_out, "
      "k_out), allocated like q and k when not given; q_out=q, k_out=k rotate in place.");
}

}  // namespace kvattn::py
