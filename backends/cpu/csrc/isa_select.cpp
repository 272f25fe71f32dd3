// Run-time choice of the kernel variant: probe the CPU once, let PAGED_CPU_ISA or set_isa() force a lower path.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "ops.h"

namespace paged_cpu {
namespace {

struct Variant {
  const char* name;
  const IsaKernels* kernels;
  bool usable;
};

// Best first; a variant is usable when it was built and the CPU has its instructions.
std::vector<Variant> variants() {
  std::vector<Variant> out;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  out.push_back({"avx512bf16", avx512bf16_kernels(), avx512 && __builtin_cpu_supports("avx512bf16")});
  out.push_back({"avx512", avx512_kernels(), avx512});
  out.push_back({"avx2", avx2_kernels(), avx2});
#endif
  out.push_back({"scalar", scalar_kernels(), true});
  return out;
}

const IsaKernels* choose(const std::string& name) {
  std::string known;
  for (const Variant& v : variants()) {
    if (name == "auto" && v.usable && v.kernels != nullptr) return v.kernels;
    if (name == v.name) {
      TORCH_CHECK(v.usable && v.kernels != nullptr, "paged_cpu: ISA '", name,
                  "' is not supported by this CPU (supported: ", c10::Join(", ", supported_isas()), ")");
      return v.kernels;
    }
    known += known.empty() ? v.name : std::string(", ") + v.name;
  }
  TORCH_CHECK(false, "paged_cpu: unknown ISA '", name, "' (known: auto, ", known, ")");
}

std::atomic<const IsaKernels*>& active() {
  static std::atomic<const IsaKernels*> kernels{[] {
    const char* env = std::getenv("PAGED_CPU_ISA");
    return choose(env != nullptr && *env != '\0' ? env : "auto");
  }()};
  return kernels;
}

}  // namespace

const IsaKernels& current_kernels() { return *active().load(std::memory_order_relaxed); }

std::string isa_name() { return current_kernels().name; }

std::string set_isa(const std::string& name) {
  active().store(choose(name));
  return isa_name();
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> out;
  for (const Variant& v : variants())
    if (v.usable && v.kernels != nullptr) out.emplace_back(v.name);
  return out;
}

bool debug_checks() {
  const char* env = std::getenv("PAGED_CPU_DEBUG");
  return env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0;
}

}  // namespace paged_cpu
