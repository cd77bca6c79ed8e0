// NVRTC: compiles a KernelSpec to a cubin, and turns a failed compile into a readable error.
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <regex>
#include <sstream>

#include "cuda/embedded_kernels.h"
#include "cuda/jit.h"
#include "kvattn/error.h"

namespace kvattn::cuda {
namespace {

void nvrtc_check(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) detail::throw_error("NVRTC error while ", what, ": ", nvrtcGetErrorString(r));
}

// Owns an nvrtcProgram so that every exit path destroys it.
struct Program {
  nvrtcProgram p = nullptr;
  ~Program() { if (p) nvrtcDestroyProgram(&p); }
};

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void numbered(std::ostream& os, const std::vector<std::string>& lines, int first, int last, int mark) {
  for (int i = std::max(first, 1); i <= std::min<int>(last, int(lines.size())); ++i)
    os << (i == mark ? ">" : " ") << std::string(5 - std::min<size_t>(5, std::to_string(i).size()), ' ')
       << i << " | " << lines[i - 1] << "\n";
}

// NVRTC reports "file(line): error: ...". Shows each cited line of the generated source or of an
// embedded header with one line of context, then the whole generated source.
std::string explain_failure(const KernelSpec& spec, const std::string& program_name, const std::string& log) {
  std::map<std::string, std::vector<std::string>> files;
  files[program_name] = split_lines(spec.source);
  for (const auto& f : embedded_kernel_files()) files[f.path] = split_lines(f.content);

  std::ostringstream os;
  if (!spec.user_file.empty()) {
    // A user variant: its own lines (as "<name>.variant(LINE)") come first.
    files[spec.user_file] = split_lines(spec.user_source);
    std::string user_lines;
    std::istringstream in(log);
    for (std::string line; std::getline(in, line);)
      if (line.find(spec.user_file) != std::string::npos) user_lines += line + "\n";
    const std::string name = spec.user_file.substr(0, spec.user_file.size() - 8);  // less ".variant"
    if (user_lines.empty())
      os << "the GPU kernel " << spec.name << " does not compile with the custom variant " << name
         << ", though no error points at " << spec.user_file << " (NVRTC " << nvrtc_version() << ", " << spec.arch
         << "; a hook's signature, or a kvattn bug):\n";
    else
      os << "custom variant " << name << " does not compile for the GPU (NVRTC " << nvrtc_version() << ", "
         << spec.arch << "):\n" << user_lines;
    os << "\nthe whole log:\n";
  }
  os << "NVRTC " << nvrtc_version() << " failed to compile kernel " << spec.name << " (entry "
     << spec.entry << ") for " << spec.arch << ":\n" << log;
  static const std::regex cite(R"(([^\s()]+)\((\d+)\): (error|warning))");
  int shown = 0;
  for (std::sregex_iterator it(log.begin(), log.end(), cite), end; it != end && shown < 8; ++it) {
    auto f = files.find((*it)[1].str());
    if (f == files.end() || (*it)[3] != "error") continue;
    int line = std::stoi((*it)[2].str());
    os << "\nat " << f->first << ":" << line << ":\n";
    numbered(os, f->second, line - 1, line + 1, line);
    ++shown;
  }
  os << "\ngenerated source " << program_name << ":\n";
  numbered(os, files[program_name], 1, int(files[program_name].size()), 0);
  os << "options:";
  for (const auto& o : base_nvrtc_options()) os << " " << o;
  for (const auto& o : spec.options) os << " " << o;
  os << " -arch=" << spec.arch << "\n";
  return os.str();
}

}  // namespace

const std::vector<std::string>& base_nvrtc_options() {
  static const std::vector<std::string> options = {"--std=c++20", "-default-device", "-lineinfo"};
  return options;
}

std::string nvrtc_version() {
  static const std::string v = [] {
    int major = 0, minor = 0;
    nvrtc_check(nvrtcVersion(&major, &minor), "nvrtcVersion");
    return std::to_string(major) + "." + std::to_string(minor);
  }();
  return v;
}

int arch_sm(const std::string& arch) {
  static const std::regex form(R"(sm_(\d+)a?)");
  std::smatch m;
  KVATTN_CHECK(std::regex_match(arch, m, form), "invalid arch '", arch,
               "': expected sm_<compute capability>, e.g. sm_90a, sm_80, sm_89");
  return std::stoi(m[1]);
}

void check_arch(const std::string& arch) {
  const int sm = arch_sm(arch);
  static const std::vector<int> supported = [] {
    int n = 0;
    nvrtc_check(nvrtcGetNumSupportedArchs(&n), "nvrtcGetNumSupportedArchs");
    std::vector<int> v(n);
    nvrtc_check(nvrtcGetSupportedArchs(v.data()), "nvrtcGetSupportedArchs");
    return v;
  }();
  if (std::find(supported.begin(), supported.end(), sm) != supported.end()) return;
  std::ostringstream os;
  for (int a : supported) os << " sm_" << a;
  detail::throw_error("NVRTC ", nvrtc_version(), " cannot compile for ", arch, "; it supports", os.str());
}

CompileResult compile_to_cubin(const KernelSpec& spec) {
  check_arch(spec.arch);
  auto start = std::chrono::steady_clock::now();
  std::vector<const char*> header_src, header_names;
  for (const auto& f : embedded_kernel_files()) {
    header_src.push_back(f.content);
    header_names.push_back(f.path);
  }
  const std::string program_name = spec.name + ".cu";
  Program prog;
  nvrtc_check(nvrtcCreateProgram(&prog.p, spec.source.c_str(), program_name.c_str(),
                                 int(header_src.size()), header_src.data(), header_names.data()),
              "nvrtcCreateProgram");

  // -arch=sm_XX (not compute_XX) makes NVRTC emit SASS, fetched with nvrtcGetCUBIN.
  std::vector<std::string> options = base_nvrtc_options();
  options.insert(options.end(), spec.options.begin(), spec.options.end());
  options.push_back("-arch=" + spec.arch);
  std::vector<const char*> argv;
  for (const auto& o : options) argv.push_back(o.c_str());
  nvrtcResult r = nvrtcCompileProgram(prog.p, int(argv.size()), argv.data());

  CompileResult out;
  size_t log_size = 0;
  nvrtc_check(nvrtcGetProgramLogSize(prog.p, &log_size), "nvrtcGetProgramLogSize");
  out.log.resize(log_size);
  if (log_size) nvrtc_check(nvrtcGetProgramLog(prog.p, out.log.data()), "nvrtcGetProgramLog");
  while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n')) out.log.pop_back();
  if (r == NVRTC_ERROR_COMPILATION) throw Error(explain_failure(spec, program_name, out.log));
  nvrtc_check(r, ("compiling " + spec.name).c_str());

  size_t size = 0;
  nvrtc_check(nvrtcGetCUBINSize(prog.p, &size), "nvrtcGetCUBINSize");
  KVATTN_CHECK(size > 0, "NVRTC produced no cubin for ", spec.name, " (arch ", spec.arch, ")");
  out.cubin.resize(size);
  nvrtc_check(nvrtcGetCUBIN(prog.p, out.cubin.data()), "nvrtcGetCUBIN");
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace kvattn::cuda
