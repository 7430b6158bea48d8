// io::save_pickle / load_pickle: torch.save's archive written from the tensors' own storages straight to the file
// and read back through a mapping of it; the same format as torch::pickle_save both ways; clear errors naming the
// path.
#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <unistd.h>

#include "shardtrain/io/files.h"
#include "shardtrain/io/pickle_files.h"
#include "shardtrain/memory/memory_stats.h"
#include "support/expect_error.h"

namespace shardtrain::io {
namespace {

struct ScratchDir {
  std::string path = "/tmp/shardtrain_pickle_test_" + std::to_string(::getpid());
  ScratchDir() { make_directories(path); }
  ~ScratchDir() { remove_tree(path); }
};

c10::impl::GenericDict dict_of(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, t] : tensors) dict.insert(name, t);
  dict.insert("note", std::string("text beside the tensors"));
  return dict;
}

// A CPU tensor is written without a copy: saving 8 MiB in two views of one storage allocates (by the counting
// allocator) less than a tenth of it, and the file holds the storage once.
TEST(PickleFiles, SavesViewsOfOneStorageOnceWithoutCopies) {
  memory::install_cpu_memory_counter();
  const ScratchDir dir;
  const at::Tensor flat = at::randn({1 << 21});  // 8 MiB
  const auto dict = dict_of({{"a", flat.narrow(0, 0, 1 << 20)}, {"b", flat.narrow(0, 1 << 20, 1 << 20)}});
  memory::reset_cpu_peak();
  const int64_t before = memory::cpu_memory_stats().current_bytes;
  save_pickle(dir.path + "/x.pt", dict);
  EXPECT_LT(memory::cpu_memory_stats().peak_bytes - before, (8 << 20) / 10);
  const int64_t size = file_size(dir.path + "/x.pt");
  EXPECT_GE(size, 8 << 20);
  EXPECT_LT(size, (8 << 20) + (64 << 10));

  const std::string path = dir.path + "/x.pt";
  for (const c10::IValue& loaded : {load_pickle(path), torch::pickle_load(read_file(path))}) {
    const auto back = loaded.toGenericDict();
    EXPECT_TRUE(at::equal(back.at("a").toTensor(), flat.narrow(0, 0, 1 << 20)));
    EXPECT_TRUE(at::equal(back.at("b").toTensor(), flat.narrow(0, 1 << 20, 1 << 20)));
    EXPECT_EQ(back.at("note").toStringRef(), "text beside the tensors");
  }
}

// A load maps the file: its storages are views of it, nothing the size of the file is allocated (by the counting
// allocator), and writing to a loaded tensor changes this process's copy only, not the file.
TEST(PickleFiles, LoadsThroughACopyOnWriteMappingOfTheFile) {
  memory::install_cpu_memory_counter();
  const ScratchDir dir;
  const std::string path = dir.path + "/x.pt";
  const at::Tensor t = at::randn({1 << 21});  // 8 MiB
  save_pickle(path, dict_of({{"t", t}}));
  memory::reset_cpu_peak();
  const int64_t before = memory::cpu_memory_stats().current_bytes;
  at::Tensor loaded = load_pickle(path).toGenericDict().at("t").toTensor();
  EXPECT_LT(memory::cpu_memory_stats().peak_bytes - before, (8 << 20) / 10);
  EXPECT_TRUE(at::equal(loaded, t));
  loaded.mul_(2);
  EXPECT_TRUE(at::equal(loaded, t * 2));
  EXPECT_TRUE(at::equal(load_pickle(path).toGenericDict().at("t").toTensor(), t)) << "the file changed";
}

// What torch::pickle_save wrote (typed containers) loads with load_pickle, shapes through int_vector (checkpoints
// written before save_pickle existed, and before it wrote containers untyped).
TEST(PickleFiles, LoadsWhatPickleSaveWrote) {
  const ScratchDir dir;
  const at::Tensor t = at::arange(12, at::kLong).view({3, 4});
  auto dict = dict_of({{"t", t}});
  dict.insert("shape", c10::List<int64_t>({3, 4}));
  write_file_atomic(dir.path + "/old.pt", torch::pickle_save(dict));
  const auto back = load_pickle(dir.path + "/old.pt").toGenericDict();
  EXPECT_TRUE(at::equal(back.at("t").toTensor(), t));
  EXPECT_EQ(int_vector(back.at("shape"), "shape"), (std::vector<int64_t>{3, 4}));
}

// save_pickle writes no global Python's torch.load refuses by default (weights_only=True): typed containers —
// List[int] (build_intlist), List[float], List[Tensor], a typed dict (restore_type_tag), tuples — go untyped,
// and read back (tests/reference/torch_load_check.py loads a trainer's checkpoint in Python).
TEST(PickleFiles, WritesNoGlobalTorchLoadRefuses) {
  const ScratchDir dir;
  const std::string path = dir.path + "/x.pt";
  c10::Dict<std::string, int64_t> rows;
  rows.insert("w", 3);
  auto dict = dict_of({{"t", at::randn({2})}});
  dict.insert("shape", c10::List<int64_t>({3, 4}));
  dict.insert("scales", c10::List<double>({0.5, 2.0}));
  dict.insert("tensors", c10::List<at::Tensor>({at::ones({1}), at::zeros({2})}));
  dict.insert("rows", rows);
  dict.insert("pair", c10::ivalue::Tuple::create({c10::IValue(int64_t{1}), c10::IValue(c10::List<int64_t>({5}))}));
  save_pickle(path, dict);
  caffe2::serialize::PyTorchStreamReader reader(path);
  const auto [program, size] = reader.getRecord("data.pkl");
  const std::string text(static_cast<const char*>(program.get()), size);
  EXPECT_EQ(text.find("torch.jit"), std::string::npos) << "a global torch.load refuses by default";
  const auto back = load_pickle(path).toGenericDict();
  EXPECT_EQ(int_vector(back.at("shape"), "shape"), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(back.at("scales").toListRef().at(1).toDouble(), 2.0);
  EXPECT_TRUE(at::equal(back.at("tensors").toListRef().at(1).toTensor(), at::zeros({2})));
  EXPECT_EQ(back.at("rows").toGenericDict().at("w").toInt(), 3);
  EXPECT_EQ(int_vector(back.at("pair").toTupleRef().elements().at(1), "pair"), (std::vector<int64_t>{5}));
  testing::expect_error<std::runtime_error>([&] { int_vector(back.at("scales"), "scales"); },
                                            {"scales", "holds a Double"});
}

TEST(PickleFiles, MissingOrDamagedFilesNameThePath) {
  const ScratchDir dir;
  testing::expect_error<std::runtime_error>([&] { load_pickle(dir.path + "/none.pt"); },
                                            {dir.path + "/none.pt", "no such file"});
  write_file_atomic(dir.path + "/junk.pt", std::vector<char>(100, 'x'));
  testing::expect_error<std::runtime_error>([&] { load_pickle(dir.path + "/junk.pt"); },
                                            {dir.path + "/junk.pt", "torch.save archive"});
  testing::expect_error<std::runtime_error>([&] { save_pickle(dir.path + "/no/such/dir/x.pt", dict_of({})); },
                                            {dir.path + "/no/such/dir"});
}

}  // namespace
}  // namespace shardtrain::io
