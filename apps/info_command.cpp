// `kvattn info`: the version and the backends this build and this machine can run.
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/overrides.h"
#include "kvattn/kvattn.h"
#if KVATTN_WITH_CUDA
#include "cuda/runtime.h"  // device discovery (never throws; no driver means no device)
#endif

namespace kvattn_cli {

BackendInfo query_backends() {
  BackendInfo info;
  info.cpu_threads = kvattn::cpu_num_threads();
#if KVATTN_WITH_CUDA
  info.cuda_built = true;
  std::string why;
  if (!kvattn::cuda::cuda_available(&why)) {
    info.cuda_status = "built in; no CUDA device (" + why + ")";
  } else {
    info.cuda_devices = kvattn::cuda::device_count();
    std::string list;
    for (int i = 0; i < info.cuda_devices; ++i) {
      const auto& d = kvattn::cuda::device_info(i);
      list += (i ? ", " : "") + std::to_string(i) + ": " + d.name + " (" + d.arch + ")";
    }
    info.cuda_status = "built in; " + std::to_string(info.cuda_devices) + " device" +
                       (info.cuda_devices == 1 ? "" : "s") + " [" + list + "]";
  }
#else
  info.cuda_built = false;
  info.cuda_status = "not built in this build";
#endif
  return info;
}

}  // namespace kvattn_cli

void register_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print the version and the backends available on this machine");
  auto json = std::make_shared<bool>(false), env = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print the information as JSON");
  cmd->add_flag("--env", *env, "Print the table of KVATTN_* environment variables (Markdown, as in README.md)");
  cmd->callback([json, env] {
    if (*env) {
      std::cout << kvattn::detail::override_table_markdown();
      return;
    }
    const kvattn_cli::BackendInfo b = kvattn_cli::query_backends();
    if (*json) {
      nlohmann::json j;
      j["version"] = kvattn::kVersion;
      j["backends"]["cpu"] = {{"available", true}, {"threads", b.cpu_threads}};
      j["backends"]["cuda"] = {{"built", b.cuda_built},
                               {"devices", b.cuda_devices},
                               {"status", b.cuda_status}};
      std::cout << j.dump(2) << "\n";
      return;
    }
    std::cout << "kvattn " << kvattn::kVersion << "\n"
              << "backends:\n"
              << "  CPU:  available, " << b.cpu_threads << " thread" << (b.cpu_threads == 1 ? "" : "s")
              << " (set KVATTN_NUM_THREADS to change)\n"
              << "  CUDA: " << b.cuda_status << "\n";
  });
}
