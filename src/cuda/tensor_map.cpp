#include "cuda/tensor_map.h"

#include <cuda.h>  // CUtensorMap and its enums only: the function comes from the driver at run time
#include <cuda_runtime_api.h>

#include <cstring>

namespace kvattn::cuda {

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled (CUDA 12.0 ABI), or null where the driver has none.
EncodeTiled encode_tiled() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      p = nullptr;
      cudaGetLastError();  // a failed lookup must not surface in a later, unrelated check
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

}  // namespace

// The header aligns CUtensorMap to 128 bytes; the copy instructions need 64 (PTX ISA), which the
// kernel parameter block gives TensorMapBytes.
static_assert(sizeof(CUtensorMap) == sizeof(kernels::TensorMapBytes) && alignof(kernels::TensorMapBytes) >= 64,
              "TensorMapBytes holds a CUtensorMap");

bool encode_paged_cache_map(const PagedCacheView& c, kernels::TensorMapBytes& map, int& token_dim) {
  const bool fp8 = c.dtype == DType::e4m3 || c.dtype == DType::e5m2;
  if (c.dtype != DType::f16 && c.dtype != DType::bf16 && !fp8) return false;
  const int64_t esize = fp8 ? 1 : 2;
  const int64_t box_dims = 128 / esize;  // one 128-byte swizzle row
  if (c.head_dim % box_dims != 0 || c.page_size < 16 || c.num_heads < 1 || c.num_pages < 1) return false;
  const int64_t page = c.stride_page * esize, token = c.stride_token * esize, head = c.stride_head * esize;
  if (reinterpret_cast<uintptr_t>(c.base) % 16 != 0) return false;
  for (int64_t s : {page, token, head})
    if (s <= 0 || s % 16 != 0 || s >= (int64_t(1) << 40)) return false;
  if (page < token || page < head || c.num_pages > (int64_t(1) << 31)) return false;
  EncodeTiled encode = encode_tiled();
  if (!encode) return false;

  // Strides must nest (the driver header: each stride covers the previous dimension). With one
  // head, NHD has equal token and head strides: heads first then (a dimension of size 1).
  const bool tokens_first = token < head;
  const cuuint64_t dims[4] = {cuuint64_t(c.head_dim), cuuint64_t(tokens_first ? c.page_size : c.num_heads),
                              cuuint64_t(tokens_first ? c.num_heads : c.page_size), cuuint64_t(c.num_pages)};
  const cuuint64_t strides[3] = {cuuint64_t(tokens_first ? token : head), cuuint64_t(tokens_first ? head : token),
                                 cuuint64_t(page)};
  const cuuint32_t box[4] = {cuuint32_t(box_dims), tokens_first ? 16u : 1u, tokens_first ? 1u : 16u, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  CUtensorMap out;
  const CUtensorMapDataType type = fp8                    ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : c.dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                           : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = encode(&out, type,
                            4, const_cast<void*>(c.base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  std::memcpy(&map, &out, sizeof(out));
  token_dim = tokens_first ? 1 : 2;
  return true;
}

}  // namespace kvattn::cuda
