// The kvattn tool's subcommands. Each one registers itself on the top-level CLI11 app; main.cpp
// only calls the register_* functions.
//
// Conventions every command follows:
//   - parse errors are CLI11's (main exits with CLI11's code);
//   - a kvattn::Error escapes to main, which prints "error: <message>" and exits 2;
//   - any other non-zero exit is thrown as CLI::RuntimeError(code) (the demo uses 1 when its
//     check against the reference fails);
//   - --json prints machine-readable results on stdout and nothing else there.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace kvattn_cli {

// Which backends this build and this machine can run.
struct BackendInfo {
  int cpu_threads = 0;
  bool cuda_built = false;   // the CUDA backend is compiled into this build (KVATTN_WITH_CUDA)
  int cuda_devices = 0;      // usable CUDA devices (0 without the backend or a driver)
  std::string cuda_status;   // one line for humans, e.g. "not built in this build"
  bool gpu_available() const { return cuda_built && cuda_devices > 0; }
};
BackendInfo query_backends();

}  // namespace kvattn_cli

// `kvattn info`: version and backends.
void register_info_command(CLI::App& app);
// `kvattn demo`: one Llama-3-8B serving step (decode + append/prefill) checked against a float64
// reference.
void register_demo_command(CLI::App& app);
// `kvattn jit list|precompile`: apps/jit_command.cpp.
void register_jit_command(CLI::App& app);
// `kvattn plan`: apps/plan_command.cpp.
void register_plan_command(CLI::App& app);
// `kvattn bench decode`: GPU benchmarks (apps/bench_command.cpp).
void register_bench_command(CLI::App& app);
// `kvattn bench prefill`, registered on the bench subcommand (apps/bench_prefill.cpp).
void register_bench_prefill(CLI::App& bench);
// `kvattn bench cascade`, registered on the bench subcommand (apps/bench_cascade.cpp).
void register_bench_cascade(CLI::App& bench);
// `kvattn bench rope`, registered on the bench subcommand (apps/bench_rope.cpp).
void register_bench_rope(CLI::App& bench);
