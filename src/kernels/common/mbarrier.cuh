// mbarrier and async-proxy primitives of sm_90 (PTX ISA 8.0+): the barriers the bulk-copy decode
// kernels and the Hopper prefill tier synchronise their producers and consumers with. Addresses
// are shared-window addresses (smem_addr); "memory" clobbers keep the compiler from moving
// shared-memory accesses across the waits and fences.
#pragma once

#include "kernels/common/ptx.cuh"

namespace kvattn::kernels {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_inval(uint32_t bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Makes prior mbarrier.init visible to the async proxy (the only form the ISA has: .release.cluster).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Orders this thread's generic-proxy shared-memory accesses against later async-proxy ones.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// One arrival (release, CTA scope) that also raises the phase's expected transaction bytes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Whether the phase of parity `parity` has completed (acquire, CTA scope); may suspend a while.
__device__ __forceinline__ bool mbar_try_wait_parity(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "  selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait_parity(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait_parity(bar, parity)) {
  }
}
// The barrier's current phase also waits for this thread's earlier cp.async copies (the pending
// count is raised now and lowered when they complete: no net arrival). "Earlier" means all of
// them, also those into other stages: harmless, those complete at least as early.
__device__ __forceinline__ void cp_async_arrive_on(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// An arrival on the barrier's current phase once this thread's earlier cp.async copies complete:
// the expected count includes it (no pending count raised), so a phase of N arrivals waits for
// the copies of N such threads.
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Named CTA barriers (ids 1-15; 0 is __syncthreads) over `threads` threads, a multiple of 32: sync
// waits for all of them; arrive only counts this thread in (release: its earlier writes are seen
// by the threads that sync); the reduction returns whether any thread's `value` was true.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ bool named_barrier_or(int id, int threads, bool value) {
  uint32_t any;
  asm volatile(
      "{\n"
      "  .reg .pred p, q;\n"
      "  setp.ne.u32 p, %1, 0;\n"
      "  bar.red.or.pred q, %2, %3, p;\n"
      "  selp.u32 %0, 1, 0, q;\n"
      "}\n"
      : "=r"(any)
      : "r"(uint32_t(value)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

}  // namespace kvattn::kernels
