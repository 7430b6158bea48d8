// LibTorch's CUDA part is loaded only when a process asks for a GPU (shardtrain/cuda/cuda_library.h): this binary is
// linked as the command line is, so a process starts without it, and loading it on this machine (no GPU) gives the
// real libraries: CUDA's hooks answer, NCCL's process group and the memory calls go through libshardtrain_cuda.so and
// refuse the missing device by name. ctest runs each suite in a process of its own (unit.CudaLibrary, ...), so each
// test here starts where nothing has loaded CUDA or asked LibTorch about it; run in one process with the rest of
// the binary, a test whose premise another test has spent skips and says so.
#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cuda/entry_points.h"
#include "shardtrain/cuda/cuda_library.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/memory/memory_stats.h"
#include "support/expect_error.h"
#include "support/scratch.h"

namespace shardtrain::cuda {
namespace {

// Whether a file whose name contains `name` is mapped into this process (/proc/self/maps).
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(name) != std::string::npos;
}

constexpr const char* kSpent = "CUDA is loaded in this process already: run this suite alone (ctest runs it so)";

TEST(CudaLibrary, LoadsLibTorchsCudaPartOnlyWhenAsked) {
  if (mapped("libtorch_cuda.so")) GTEST_SKIP() << kSpent;
  ASSERT_FALSE(mapped("libshardtrain_cuda.so"));
  ASSERT_FALSE(mapped("libc10_cuda.so"));

  // Not found, and not a library: each names the path; neither loads anything.
  testing::TempDir dir("shardtrain_cuda_library_");
  const std::string absent = dir.path + "/absent/libshardtrain_cuda.so", text = dir.path + "/text.so";
  std::ofstream(text) << "not a library\n";
  ASSERT_EQ(::setenv("SHARDTRAIN_CUDA_LIBRARY", absent.c_str(), 1), 0);
  testing::expect_error<std::runtime_error>([] { load_cuda(); }, {"not found", "SHARDTRAIN_CUDA_LIBRARY", absent});
  ASSERT_EQ(::setenv("SHARDTRAIN_CUDA_LIBRARY", text.c_str(), 1), 0);
  testing::expect_error<std::runtime_error>([] { load_cuda(); }, {"cannot load " + text});
  ASSERT_EQ(::unsetenv("SHARDTRAIN_CUDA_LIBRARY"), 0);
  EXPECT_FALSE(mapped("libtorch_cuda.so"));

  // Found where the build put it.
  const int gpus = load_cuda();
  EXPECT_TRUE(mapped("libshardtrain_cuda.so"));
  EXPECT_TRUE(mapped("libtorch_cuda.so"));
  EXPECT_TRUE(at::detail::getCUDAHooks().isBuilt());
  EXPECT_GE(at::detail::getCUDAHooks().versionCUDART(), 12000);  // what the wheel was built with: 13000
  EXPECT_EQ(nccl_version() >> 32, 2u);                             // NCCL 2.x
  EXPECT_EQ(gpus, static_cast<int>(torch::cuda::device_count()));
  EXPECT_EQ(load_cuda(), gpus);  // once
  if (gpus > 0) return;          // the GPU machine runs the rest in cuda_tests

  // Without a device, each call that needs one refuses by name, through the library.
  auto store = c10::make_intrusive<c10d::HashStore>();
  testing::expect_error<std::invalid_argument>(
      [&] { entry_points().make_nccl_backend(store, 0, 1, std::chrono::seconds(5), 0); },
      {"NCCL backend", "CUDA device 0 requested but 0 CUDA device(s) are visible"});
  testing::expect_error<std::invalid_argument>([] { device_properties(0); }, {"CUDA device 0"});
  testing::expect_error<std::runtime_error>([] { memory::cuda_total_memory(0); }, {"device 0"});
  const dist::DistEnv env{};
  testing::expect_error<std::invalid_argument>([&] { dist::rank_device(true, env, "train.device: 'cuda'"); },
                                               {"train.device: 'cuda'", "no visible CUDA device"});
}

TEST(CudaLibraryAskedFirst, IsAClearError) {
  if (mapped("libtorch_cuda.so")) GTEST_SKIP() << kSpent;
  EXPECT_FALSE(at::hasCUDA());  // LibTorch settles here: no CUDA in this process
  testing::expect_error<std::runtime_error>([] { load_cuda(); },
                                            {"asked about CUDA before shardtrain loaded", "load_cuda() first"});
}

// train.device: auto on a machine without NVIDIA's driver: the CPU, found without loading CUDA's libraries (what
// every CPU run pays otherwise).
TEST(CudaDeviceProbe, NoDriverMeansTheCpuWithoutLoadingCuda) {
  if (mapped("libtorch_cuda.so")) GTEST_SKIP() << kSpent;
  std::error_code ec;
  if (std::filesystem::exists("/proc/driver/nvidia/gpus", ec) || std::filesystem::exists("/dev/nvidiactl", ec)) {
    GTEST_SKIP() << "this machine has NVIDIA's driver: the probe loads CUDA (LoadsLibTorchsCudaPartOnlyWhenAsked)";
  }
  EXPECT_EQ(visible_gpus(), 0);
  EXPECT_EQ(resolve_device(parallel::Device::AUTO), parallel::Device::CPU);
  EXPECT_EQ(resolve_device(parallel::Device::CPU), parallel::Device::CPU);
  EXPECT_EQ(resolve_device(parallel::Device::CUDA), parallel::Device::CUDA);  // asked for: the run refuses it
  EXPECT_FALSE(mapped("libtorch_cuda.so"));
}

}  // namespace
}  // namespace shardtrain::cuda
