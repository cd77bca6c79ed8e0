// The kvattn command-line tool: `kvattn <command> [options]`. Each subcommand lives in its own
// file and registers itself (commands.h).
#include <exception>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "kvattn/kvattn.h"

int main(int argc, char** argv) {
  CLI::App app{"kvattn: attention engine for LLM inference serving", "kvattn"};
  app.set_version_flag("--version", std::string("kvattn ") + kvattn::kVersion);
  app.footer(
      "Run `kvattn <command> --help` for a command's options. Start with `kvattn demo`.\n"
      "Exit status: 0 success, 1 a check failed, 2 a kvattn error, other values: bad arguments.");

  register_info_command(app);
  register_demo_command(app);
  register_jit_command(app);
  register_bench_command(app);
  register_plan_command(app);

  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) {  // `kvattn` alone: show what it can do
      std::cout << app.help();
      return 1;
    }
  } catch (const CLI::Error& e) {  // parse errors, --help, --version, CLI::RuntimeError(code)
    return app.exit(e);
  } catch (const kvattn::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
