#include "shardtrain/cuda/cuda_library.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <dlfcn.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "cuda/entry_points.h"

namespace shardtrain::cuda {
namespace {

namespace fs = std::filesystem;
constexpr const char* kFile = "libshardtrain_cuda.so";

// Where the library may be, in the order load_cuda() documents, without repeats.
std::vector<std::string> candidates() {
  if (const char* given = std::getenv("SHARDTRAIN_CUDA_LIBRARY"); given && *given) return {given};
  std::vector<std::string> out;
  auto add = [&](const fs::path& p) {
    const std::string s = p.lexically_normal().string();
    for (const auto& o : out) {
      if (o == s) return;
    }
    out.push_back(s);
  };
  std::error_code ec;
  const fs::path program = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    add(program.parent_path() / kFile);
    add(program.parent_path() / ".." / "lib" / kFile);
  }
  // This code's own file when the library is shared (a static library is inside the program above).
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&load_cuda), &self) != 0 && self.dli_fname && self.dli_fname[0] == '/') {
    add(fs::path(self.dli_fname).parent_path() / kFile);
  }
  add(SHARDTRAIN_CUDA_LIBRARY_BUILT);
  add(SHARDTRAIN_CUDA_LIBRARY_INSTALLED);
  return out;
}

const EntryPoints* open_library() {
  const std::vector<std::string> paths = candidates();
  std::string tried;
  for (const auto& path : paths) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      tried += "\n  " + path;
      continue;
    }
    // Global: NCCL's and cuDNN's libraries, loaded later by LibTorch's CUDA part, resolve against these symbols.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) throw std::runtime_error("CUDA: cannot load " + path + ": " + ::dlerror());
    using Get = const EntryPoints* (*)();
    auto get = reinterpret_cast<Get>(::dlsym(handle, "shardtrain_cuda_entry_points"));
    if (!get) throw std::runtime_error("CUDA: " + path + " has no shardtrain_cuda_entry_points: not shardtrain's");
    const EntryPoints* points = get();
    if (points->version != kEntryPointsVersion) {
      throw std::runtime_error("CUDA: " + path + " has entry points version " + std::to_string(points->version) +
                               ", this program expects " + std::to_string(kEntryPointsVersion) +
                               ": a library from another build of shardtrain");
    }
    // LibTorch decides once per process whether it has CUDA, at its first question about it; asked before the
    // library above was loaded, it answered no, and loading cannot change that.
    if (!at::detail::getCUDAHooks().isBuilt()) {
      throw std::runtime_error(
          "CUDA: LibTorch was asked about CUDA before shardtrain loaded its CUDA backend (torch::cuda::is_available(),"
          " at::hasCUDA() or torch::manual_seed before shardtrain::cuda::load_cuda()) and has settled on none for "
          "this process; call load_cuda() first, or link LibTorch's torch_cuda into the program");
    }
    return points;
  }
  throw std::runtime_error(std::string("CUDA: ") + kFile + " (LibTorch's CUDA backend for shardtrain) not found; " +
                           "set SHARDTRAIN_CUDA_LIBRARY to its path. Tried:" + tried);
}

}  // namespace

// Loaded once per process: what dlopen loads is the process's, and LibTorch's CUDA state with it.
const EntryPoints& entry_points() {
  static const EntryPoints* const points = open_library();
  return *points;
}

int load_cuda() {
  entry_points();
  return static_cast<int>(torch::cuda::device_count());
}

int visible_gpus() {
  std::error_code ec;
  const bool listed = fs::is_directory("/proc/driver/nvidia/gpus", ec) &&
                      !fs::is_empty("/proc/driver/nvidia/gpus", ec);
  if (!listed && !fs::exists("/dev/nvidiactl", ec)) return 0;
  return load_cuda();
}

parallel::Device resolve_device(parallel::Device requested) {
  if (requested != parallel::Device::AUTO) return requested;
  return visible_gpus() > 0 ? parallel::Device::CUDA : parallel::Device::CPU;
}

DeviceProperties device_properties(int device) { return entry_points().device_properties(device); }

uint64_t nccl_version() { return entry_points().nccl_version(); }

}  // namespace shardtrain::cuda
