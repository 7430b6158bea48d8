// io::load_torch_state_dict and io::WeightFiles over torch.save files: what LibTorch writes reads back as views of
// the mapped file, in order, storages shared as saved; directories and indexes of pytorch_model*.bin files (mixed
// with safetensors shards) read as one; the legacy format (PyTorch before 1.6) read in place; a file that is not a
// dict of tensors, calls a global outside the list, is truncated or reaches past a storage is refused, naming why. Python-written files (the OrderedDict state_dict, protocol
// 4, nn.Parameter) are read in tests/models/hf_parity_test.cpp against transformers' own.
#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "shardtrain/io/files.h"
#include "shardtrain/io/pickle_files.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/io/torch_state_dict.h"
#include "shardtrain/io/weight_files.h"
#include "shardtrain/memory/memory_stats.h"
#include "support/expect_error.h"

namespace shardtrain::io {
namespace {

using testing::expect_error;
using namespace std::string_literals;

struct ScratchDir {
  std::string path = "/tmp/shardtrain_torch_state_dict_test_" + std::to_string(::getpid());
  ScratchDir() { make_directories(path); }
  ~ScratchDir() { remove_tree(path); }
};

void save_dict(const std::string& path, const std::vector<std::pair<std::string, c10::IValue>>& entries) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, value] : entries) dict.insert(name, value);
  save_pickle(path, dict);
}

// A torch.save archive whose pickle program is `program`, with record data/0 of `storage_bytes` zeros.
void write_archive(const std::string& path, const std::string& program, size_t storage_bytes = 0) {
  caffe2::serialize::PyTorchStreamWriter writer(path);
  writer.writeRecord("data.pkl", program.data(), program.size());
  const std::vector<char> zeros(storage_bytes);
  if (storage_bytes > 0) writer.writeRecord("data/0", zeros.data(), zeros.size());
  writer.writeEndOfFile();
}

// BINUNICODE: 'X', the length (4 bytes, little-endian), the UTF-8 bytes.
std::string str(const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  return "X"s + static_cast<char>(n & 0xff) + static_cast<char>((n >> 8) & 0xff) + static_cast<char>(n >> 16) +
         static_cast<char>(n >> 24) + s;
}

// {'w': a float tensor of sizes (rows,) over storage '0' of 4 elements}, as torch.save writes it (the legacy format
// adds a sixth item to the storage's persistent id, None).
std::string one_tensor_program(int rows, bool legacy = false) {
  return "\x80\x02}("s + str("w") + "ctorch._utils\n_rebuild_tensor_v2\n((" + str("storage") + "ctorch\nFloatStorage\n" +
         str("0") + str("cpu") + "K\x04" + (legacy ? "N" : "") + "tQK\x00K"s + static_cast<char>(rows) +
         "\x85K\x01\x85\x89tRu.";
}

// The same in torch.save's legacy format: the magic number, protocol 1001, system information, the object, the
// storage keys ['0'], then storage '0' as its element count `count` and the floats 1..4.
std::string legacy_file(int rows, int64_t count) {
  std::string out = "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19."s + "\x80\x02M\xe9\x03." +
                    "\x80\x02}(" + str("little_endian") + "\x88u." + one_tensor_program(rows, true) + "\x80\x02](" +
                    str("0") + "e.";
  out.append(reinterpret_cast<const char*>(&count), 8);
  const float values[4] = {1, 2, 3, 4};
  out.append(reinterpret_cast<const char*>(values), sizeof(values));
  return out;
}

TEST(TorchStateDict, ReadsEveryDtypeAndLayoutAsViewsOfTheFile) {
  const ScratchDir dir;
  const at::Tensor w = at::randn({4, 3});
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"w", w},
      {"w.t", w.t()},                       // strides (1, 3), the same storage
      {"w.row", w[2]},                      // storage offset 6
      {"bf16", at::randn({5}).to(at::kBFloat16)},
      {"half", at::randn({2, 2}).to(at::kHalf)},
      {"long", at::arange(7)},
      {"bool", at::rand({3}) < 0.5},
      {"scalar", at::tensor(2.5)},
      {"empty", at::empty({0, 3})}};
  std::vector<std::pair<std::string, c10::IValue>> entries(tensors.begin(), tensors.end());
  save_dict(dir.path + "/sd.pt", entries);
  EXPECT_TRUE(is_torch_save_file(dir.path + "/sd.pt"));
  const auto loaded = load_torch_state_dict(dir.path + "/sd.pt");
  ASSERT_EQ(loaded.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(loaded[i].first, tensors[i].first);  // the file's order
    EXPECT_EQ(loaded[i].second.scalar_type(), tensors[i].second.scalar_type()) << tensors[i].first;
    EXPECT_EQ(loaded[i].second.strides(), tensors[i].second.strides()) << tensors[i].first;
    EXPECT_TRUE(at::equal(loaded[i].second, tensors[i].second)) << tensors[i].first;
  }
  // Views of one storage saved once are views of one storage here.
  EXPECT_EQ(loaded[1].second.storage().data(), loaded[0].second.storage().data());
  EXPECT_EQ(loaded[2].second.storage_offset(), 6);
}

// Loading 8 MiB allocates under a tenth of it (the counting allocator): the tensors are the file's pages.
TEST(TorchStateDict, AllocatesNothingTheSizeOfTheFile) {
  memory::install_cpu_memory_counter();
  const ScratchDir dir;
  const at::Tensor big = at::randn({1 << 21});
  save_dict(dir.path + "/big.pt", {{"big", big}});
  const int64_t before = memory::cpu_memory_stats().current_bytes;
  memory::reset_cpu_peak();
  auto loaded = load_torch_state_dict(dir.path + "/big.pt");
  EXPECT_TRUE(at::equal(loaded.at(0).second, big));
  EXPECT_LT(memory::cpu_memory_stats().peak_bytes - before, (8 << 20) / 10);
}

// A directory of pytorch_model.bin, and an index whose shards are torch.save and safetensors files, read as one;
// rows of a strided tensor come back contiguous.
TEST(TorchStateDict, WeightFilesReadTorchSaveFilesAndShards) {
  const ScratchDir dir;
  const at::Tensor a = at::randn({6, 4}), b = at::randn({3});
  make_directories(dir.path + "/one");
  save_dict(dir.path + "/one/pytorch_model.bin", {{"a.t", a.t()}, {"b", b}});
  EXPECT_TRUE(has_weight_files(dir.path + "/one"));
  const WeightFiles one(dir.path + "/one");
  EXPECT_EQ(one.path(), dir.path + "/one/pytorch_model.bin");
  ASSERT_NE(one.find("a.t"), nullptr);
  EXPECT_EQ(one.find("a.t")->shape, (std::vector<int64_t>{4, 6}));
  const at::Tensor rows = one.read_rows("a.t", 1, 2);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_TRUE(at::equal(rows, a.t().narrow(0, 1, 2)));
  expect_error<std::out_of_range>([&] { one.read_rows("a.t", 3, 2); }, {"'a.t' has 4 rows", "[3, 5)"});

  make_directories(dir.path + "/sharded");
  save_dict(dir.path + "/sharded/pytorch_model-00001-of-00002.bin", {{"a", a}});
  write_safetensors(dir.path + "/sharded/model-00002-of-00002.safetensors", {{"b", b}});
  const std::string index = R"({"weight_map": {"a": "pytorch_model-00001-of-00002.bin",
                                                "b": "model-00002-of-00002.safetensors"}})";
  write_file_atomic(dir.path + "/sharded/pytorch_model.bin.index.json", std::vector<char>(index.begin(), index.end()));
  const WeightFiles sharded(dir.path + "/sharded");
  EXPECT_EQ(sharded.entries().size(), 2u);
  EXPECT_TRUE(at::equal(sharded.read("a"), a));
  EXPECT_TRUE(at::equal(sharded.read_rows("b", 1, 2), b.narrow(0, 1, 2)));
  EXPECT_FALSE(has_weight_files(dir.path));
  expect_error<std::runtime_error>([&] { WeightFiles none(dir.path); }, {"pytorch_model.bin.index.json"});
}

// PyTorch before 1.6 wrote five pickles and the storages after them: read in place, as views of the mapped file; a
// storage whose count differs from its tensors' or that the file cuts short is refused.
TEST(TorchStateDict, ReadsTheLegacyFormat) {
  const ScratchDir dir;
  const std::string p = dir.path + "/legacy.bin";
  auto write = [&](const std::string& bytes) { write_file_atomic(p, std::vector<char>(bytes.begin(), bytes.end())); };
  write(legacy_file(4, 4));
  EXPECT_TRUE(is_torch_save_file(p));
  const auto loaded = load_torch_state_dict(p);
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_TRUE(at::equal(loaded[0].second, at::arange(1, 5, at::kFloat)));
  write(legacy_file(3, 4));  // three of the storage's four elements
  EXPECT_TRUE(at::equal(load_torch_state_dict(p).at(0).second, at::arange(1, 4, at::kFloat)));
  write(legacy_file(4, 5));
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {"legacy format", "storage 0 holds 5"});
  const std::string whole = legacy_file(4, 4);
  write(whole.substr(0, whole.size() - 1));
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {"ends inside storage 0"});
  write(whole.substr(0, 40));
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {"legacy.bin", "ends inside an instruction"});
}

TEST(TorchStateDict, RefusesWhatIsNotADictOfTensors) {
  const ScratchDir dir;
  const std::string p = dir.path + "/x.pt";
  save_dict(p, {{"w", at::randn({2})}, {"note", std::string("text")}});
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {p, "'note' holds a str", "not a tensor"});
  save_pickle(p, c10::IValue(at::randn({2})));  // torch.save(tensor)
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {"holds a tensor", "not a state dict"});
  // A global outside the list is refused, not called: GLOBAL os.system, ('ls',), REDUCE.
  write_archive(p, "\x80\x02"s + "cos\nsystem\n" + "X\x02\x00\x00\x00"s + "ls" + "\x85" + "R.");
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {"calls os.system", "weights_only"});
  write_archive(p, "\x80\x02}X\xff\x00\x00\x00"s + "ab");  // a 255-byte string of 2
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {"ends inside an instruction"});
  write_archive(p, "\x80\x02}I1\n."s);  // INT, a text opcode torch.save never writes
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {"opcode 0x49 at byte 3"});
  // A tensor past its storage's end, and the same program within it.
  write_archive(p, one_tensor_program(4), 16);
  EXPECT_TRUE(at::equal(load_torch_state_dict(p).at(0).second, at::zeros({4})));
  write_archive(p, one_tensor_program(8), 16);
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {"reaches past its storage of 4 elements"});
  write_archive(p, one_tensor_program(4), 12);
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {"holds 12 bytes, not 4 elements of 4"});
  write_file_atomic(p, std::vector<char>{'{', '}', '\n'});
  EXPECT_FALSE(is_torch_save_file(p));
  expect_error<std::runtime_error>([&] { load_torch_state_dict(p); }, {"not a torch.save archive"});
  expect_error<std::runtime_error>([&] { load_torch_state_dict(dir.path + "/none.pt"); }, {"no such file"});
}

}  // namespace
}  // namespace shardtrain::io
