// kvattn._kvattn: the nanobind extension over kvattn's C++ API. Importing it loads the library
// only: no CUDA call, no kernel compile (the JIT runs at the first GPU plan()/run()).
#include "common.h"

NB_MODULE(_kvattn, m) {
  namespace py = kvattn::py;
  m.doc() = "kvattn's C++ API (kvattn/kvattn.h) for Python; import kvattn, not this module.";
  m.attr("__version__") = kvattn::kVersion;
#if KVATTN_WITH_CUDA
  m.attr("has_cuda_backend") = true;
#else
  m.attr("has_cuda_backend") = false;
#endif
  m.def("cpu_num_threads", &kvattn::cpu_num_threads,
        "Worker threads of the CPU backend (KVATTN_NUM_THREADS, else hardware concurrency).");
  py::register_errors(m);
  py::bind_types(m);
  py::bind_attention(m);
  py::bind_ops(m);
}
