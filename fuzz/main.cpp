// kvattn_fuzz: the API fuzzer (api_fuzz.h) driven by a seeded PRNG for a bounded time.
//
//   kvattn_fuzz [--seconds N] [--iterations K] [--seed S] [--start I] [--op NAME]
//               [--legal-only | --corrupt-only] [--hang-seconds H] [--verbose]
//
// Iteration i draws from its own stream (derived from S and i), so `--seed S --start i
// --iterations 1 --verbose` replays iteration i alone, trace included. Without --seed the seed is
// KVATTN_FUZZ_SEED or a fresh random one; it is printed first. Stops after N seconds (default 60
// unless --iterations is given) or K iterations, whichever comes first; prints the calls checked
// and rejected per operation and a last line "P passed, F failed"; exits 1 on any failure (it
// stops after 10), 3 when one iteration runs longer than H seconds (default 120: a hang). A crash
// (a sanitizer report, a fatal signal) prints the iteration to replay and its trace; run UBSan
// with abort_on_error=1 for that (its runtime exits without the death callback otherwise).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "fuzz/api_fuzz.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define KVATTN_FUZZ_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define KVATTN_FUZZ_SANITIZER 1
#endif
#endif
#if KVATTN_FUZZ_SANITIZER
#include <sanitizer/common_interface_defs.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

uint64_t g_seed = 0;
std::atomic<int64_t> g_iteration{-1};
std::atomic<int64_t> g_started_ns{0};

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

uint64_t iteration_seed(uint64_t seed, int64_t i) {
  return kvattn_fuzz::splitmix64(kvattn_fuzz::splitmix64(seed) ^ uint64_t(i));
}

void print_replay(FILE* f) {
  const int64_t i = g_iteration.load();
  if (i < 0) return;
  std::fprintf(f, "kvattn_fuzz: in iteration %lld of seed %llu; replay: kvattn_fuzz --seed %llu --start %lld --iterations 1 --verbose\n",
               static_cast<long long>(i), static_cast<unsigned long long>(g_seed),
               static_cast<unsigned long long>(g_seed), static_cast<long long>(i));
}

// What to replay when the process dies: from ASan's death callback, and from a handler of the
// fatal signals (UBSan with abort_on_error=1 aborts; gcc's UBSan runtime does not run ASan's
// death callbacks; a build without sanitizers just crashes). Not async-signal-safe, but the
// process is going down anyway.
void on_death() {
  print_replay(stderr);
  std::fprintf(stderr, "  trace so far:\n%s", kvattn_fuzz::current_trace().c_str());
  std::fflush(stderr);
}
void on_fatal_signal(int sig) {
  std::signal(sig, SIG_DFL);
  std::fprintf(stderr, "kvattn_fuzz: fatal signal %d\n", sig);
  on_death();
  std::raise(sig);
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "kvattn_fuzz: %s\nusage: kvattn_fuzz [--seconds N] [--iterations K] [--seed S] [--start I] [--op NAME]\n"
               "                   [--legal-only | --corrupt-only] [--hang-seconds H] [--verbose]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = -1;
  int64_t iterations = -1, start = 0;
  double hang_seconds = 120;
  bool have_seed = false;
  kvattn_fuzz::FuzzOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--seconds") seconds = std::atof(value());
    else if (a == "--iterations") iterations = std::atoll(value());
    else if (a == "--seed") { g_seed = std::strtoull(value(), nullptr, 10); have_seed = true; }
    else if (a == "--start") start = std::atoll(value());
    else if (a == "--hang-seconds") hang_seconds = std::atof(value());
    else if (a == "--legal-only") options.legal_only = true;
    else if (a == "--corrupt-only") options.corrupt_only = true;
    else if (a == "--verbose") options.verbose = true;
    else if (a == "--op") {
      const char* name = value();
      options.only = kvattn_fuzz::parse_op(name);
      if (!options.only) usage((std::string("unknown operation ") + name).c_str());
    } else usage(("unknown argument " + a).c_str());
  }
  if (options.legal_only && options.corrupt_only) usage("--legal-only and --corrupt-only exclude each other");
  if (!have_seed) {
    if (const char* env = std::getenv("KVATTN_FUZZ_SEED")) {
      g_seed = std::strtoull(env, nullptr, 10);
    } else {
      std::random_device rd;
      g_seed = (uint64_t(rd()) << 32 ^ rd()) % 1000000000000ull;
    }
  }
  if (seconds < 0 && iterations < 0) seconds = 60;
  std::printf("kvattn_fuzz: seed %llu (replay one iteration: kvattn_fuzz --seed %llu --start I --iterations 1 --verbose)\n",
              static_cast<unsigned long long>(g_seed), static_cast<unsigned long long>(g_seed));
  std::fflush(stdout);
#if KVATTN_FUZZ_SANITIZER
  __sanitizer_set_death_callback(on_death);
  std::signal(SIGABRT, on_fatal_signal);  // ASan handles SIGSEGV and the like itself
#else
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, on_fatal_signal);
#endif

  // A hang (an iteration past hang_seconds) ends the process with the iteration to replay.
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const int64_t t0 = g_started_ns.load();
      if (t0 != 0 && double(now_ns() - t0) * 1e-9 > hang_seconds) {
        std::fprintf(stderr, "kvattn_fuzz: HANG: one iteration has run for more than %.0f s\n", hang_seconds);
        print_replay(stderr);
        std::fflush(stderr);
        std::_Exit(3);
      }
    }
  });

  kvattn_fuzz::Stats stats;
  int64_t failed = 0;
  const auto t_begin = Clock::now();
  for (int64_t i = start; iterations < 0 || i < start + iterations; ++i) {
    if (seconds >= 0 && std::chrono::duration<double>(Clock::now() - t_begin).count() >= seconds) break;
    g_iteration = i;
    g_started_ns = now_ns();
    kvattn_fuzz::Source src(iteration_seed(g_seed, i));
    try {
      stats.add(kvattn_fuzz::fuzz_one(src, options));
    } catch (const kvattn_fuzz::Failure& f) {
      ++failed;
      std::printf("FAILED: seed %llu iteration %lld: %s\n  replay: kvattn_fuzz --seed %llu --start %lld --iterations 1 --verbose\n",
                  static_cast<unsigned long long>(g_seed), static_cast<long long>(i), f.what(),
                  static_cast<unsigned long long>(g_seed), static_cast<long long>(i));
      std::fflush(stdout);
      if (failed >= 10) {
        std::printf("kvattn_fuzz: stopping after %lld failures\n", static_cast<long long>(failed));
        break;
      }
    }
    g_started_ns = 0;
  }
  done = true;
  watchdog.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t_begin).count();
  const int64_t passed = stats.total();
  std::printf("kvattn_fuzz: %lld iterations in %.1f s (%.1f per second), seed %llu\n%s",
              static_cast<long long>(passed + failed), elapsed, double(passed + failed) / std::max(elapsed, 1e-9),
              static_cast<unsigned long long>(g_seed), stats.report().c_str());
  std::printf("%lld passed, %lld failed\n", static_cast<long long>(passed), static_cast<long long>(failed));
  return failed ? 1 : 0;
}
