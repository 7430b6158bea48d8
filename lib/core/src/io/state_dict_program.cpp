#include "io/state_dict_program.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "io/pickle_machine.h"

namespace shardtrain::io {
namespace {

// torch.<Name>Storage, the storage types torch.save names in a tensor's persistent id, and their element types.
const std::map<std::string, at::ScalarType>& storage_types() {
  static const std::map<std::string, at::ScalarType> types = {
      {"torch.DoubleStorage", at::kDouble},      {"torch.FloatStorage", at::kFloat},
      {"torch.HalfStorage", at::kHalf},          {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},          {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},        {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},          {"torch.BoolStorage", at::kBool},
      {"torch.ComplexFloatStorage", at::kComplexFloat}, {"torch.ComplexDoubleStorage", at::kComplexDouble},
      {"torch.Float8_e4m3fnStorage", at::kFloat8_e4m3fn}, {"torch.Float8_e5m2Storage", at::kFloat8_e5m2},
      {"torch.UntypedStorage", at::kByte}};
  return types;
}

// Runs one torch.save pickle program (the archive's data.pkl) to its STOP. Storages come from
// `storage_of(key, dtype, numel)`.
class Machine : public PickleMachine {
 public:
  Machine(const std::string& path, const char* program, size_t size, const StorageOf& storage_of)
      : PickleMachine(path, "its state dict", program, size), storage_of_(storage_of) {}

 private:
  // The globals a state dict calls; any other is refused (torch.load(weights_only=True)'s rule).
  ValuePtr call(const std::string& fn, const std::vector<ValuePtr>& args) override {
    if (fn == "collections.OrderedDict") {
      if (!args.empty()) fail("collections.OrderedDict called with arguments");
      return make(Value::Kind::kDict);
    }
    if (fn == "torch._utils._rebuild_tensor_v2" || fn == "torch._utils._rebuild_tensor") {
      // (storage, storage_offset, size, stride, [requires_grad, backward_hooks, metadata]) -> a view of the storage
      if (args.empty() || args[0]->kind != Value::Kind::kStorage) fail(fn + "'s first argument is not a storage");
      const Value& storage = *args[0];
      const int64_t offset = int_arg(args, 1, fn);
      const std::vector<int64_t> sizes = ints_arg(args, 2, fn), strides = ints_arg(args, 3, fn);
      if (sizes.size() != strides.size()) fail(fn + " with " + std::to_string(sizes.size()) + " sizes and " +
                                               std::to_string(strides.size()) + " strides");
      const int64_t capacity = static_cast<int64_t>(storage.storage.nbytes()) / at::elementSize(storage.dtype);
      // The largest element index the view reaches, and its element count (empty when a size is 0), with every
      // product and sum checked: a file's numbers must not overflow.
      int64_t last = offset, numel = 1;
      bool overflow = offset < 0;
      for (size_t d = 0; d < sizes.size(); ++d) {
        if (sizes[d] < 0 || strides[d] < 0) fail(fn + " with a negative size or stride");
        int64_t reach = 0;
        overflow = overflow || __builtin_mul_overflow(sizes[d] == 0 ? 0 : sizes[d] - 1, strides[d], &reach) ||
                   __builtin_add_overflow(last, reach, &last) ||
                   __builtin_mul_overflow(numel, std::max<int64_t>(sizes[d], 1), &numel);
      }
      const bool empty = std::find(sizes.begin(), sizes.end(), 0) != sizes.end();
      if (overflow || (!empty && last >= capacity)) {
        fail("a tensor of " + std::to_string(sizes.size()) + " dimensions at offset " + std::to_string(offset) +
             " reaches past its storage of " + std::to_string(capacity) + " elements");
      }
      auto v = make(Value::Kind::kTensor);
      v->tensor = at::empty({0}, at::TensorOptions().dtype(storage.dtype));
      v->tensor.set_(storage.storage, offset, sizes, strides);
      return v;
    }
    if (fn == "torch._utils._rebuild_parameter" || fn == "torch._utils._rebuild_parameter_with_state" ||
        fn == "torch.jit._pickle.restore_type_tag") {  // a Parameter's data; a typed container written by LibTorch
      if (args.empty()) fail(fn + " called without arguments");
      return args[0];
    }
    fail("the file calls " + fn + ", which a file of tensors does not (only a state dict is read: a dict of "
         "tensors, as torch.load(weights_only=True))");
  }

  // ('storage', torch.<T>Storage, key, location, numel): the archive's record data/<key>, shared by every tensor
  // that names it.
  ValuePtr persistent_load(const ValuePtr& id) override {
    const auto& t = expect(id, Value::Kind::kTuple, "a persistent id")->items;
    if (t.size() < 5 || t.size() > 6 || t[0]->kind != Value::Kind::kString || t[0]->s != "storage" ||
        t[1]->kind != Value::Kind::kGlobal || t[2]->kind != Value::Kind::kString ||
        t[4]->kind != Value::Kind::kInt) {
      fail("a persistent id that is not ('storage', type, key, location, numel[, view])");
    }
    if (t.size() == 6 && t[5]->kind != Value::Kind::kNone) {  // the legacy format's view_metadata
      fail("a view of a storage (saved by PyTorch before 1.0), which is not read");
    }
    auto type = storage_types().find(t[1]->s);
    if (type == storage_types().end()) fail("storage type " + t[1]->s + " (a tensor dtype's storage expected)");
    auto v = make(Value::Kind::kStorage);
    v->dtype = type->second;
    auto it = storages_.find(t[2]->s);
    if (it == storages_.end()) it = storages_.emplace(t[2]->s, storage_of_(t[2]->s, v->dtype, t[4]->i)).first;
    v->storage = it->second;
    return v;
  }

  const StorageOf& storage_of_;
  std::map<std::string, at::Storage> storages_;
};

}  // namespace

namespace {

// The dict a program built as (name, tensor) entries. Throws naming the first entry that is not one.
std::vector<std::pair<std::string, at::Tensor>> entries_of(const std::string& path, const Value& root) {
  if (root.kind != Value::Kind::kDict) {
    throw std::runtime_error(path + ": holds a " + std::string(kind_name(root.kind)) +
                             ", not a state dict (a dict of tensors)");
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t k = 0; k < root.items.size(); k += 2) {
    const Value& key = *root.items[k];
    const Value& value = *root.items[k + 1];
    if (key.kind != Value::Kind::kString) {
      throw std::runtime_error(path + ": a key of its dict is a " + std::string(kind_name(key.kind)) +
                               " (a state dict's keys are tensor names)");
    }
    if (value.kind != Value::Kind::kTensor) {
      throw std::runtime_error(path + ": '" + key.s + "' holds a " + kind_name(value.kind) +
                               ", not a tensor (a state dict of tensors expected)");
    }
    out.emplace_back(key.s, value.tensor);
  }
  return out;
}

// The magic number torch.save's legacy format begins with, pickled (LONG1 of 10 bytes, STOP) after PROTO n.
const std::string kLegacyMagic("\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 13);

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> run_state_dict_program(const std::string& path, const char* program,
                                                                       size_t size, const StorageOf& storage_of) {
  Machine machine(path, program, size, storage_of);
  return entries_of(path, *machine.run());
}

at::Tensor run_tensor_program(const std::string& path, const char* program, size_t size,
                              const StorageOf& storage_of) {
  Machine machine(path, program, size, storage_of);
  const Value& root = *machine.run();
  if (root.kind != Value::Kind::kTensor) {
    throw std::runtime_error(path + ": holds a " + std::string(kind_name(root.kind)) + ", not a tensor");
  }
  return root.tensor;
}

bool is_legacy_torch_save(const char* bytes, size_t size) {
  return size >= 2 + kLegacyMagic.size() && static_cast<uint8_t>(bytes[0]) == 0x80 &&  // PROTO
         std::memcmp(bytes + 2, kLegacyMagic.data(), kLegacyMagic.size()) == 0;
}

std::vector<std::pair<std::string, at::Tensor>> run_legacy_state_dict(
    const std::string& path, const char* bytes, size_t size, const std::function<at::DataPtr(size_t)>& bytes_at) {
  auto fail = [&](const std::string& what) {
    return std::runtime_error(path + ": cannot read its state dict (torch.save's legacy format): " + what);
  };
  if (!is_legacy_torch_save(bytes, size)) throw fail("it does not begin with the format's magic number");
  size_t pos = 2 + kLegacyMagic.size();
  // Each pickle runs to its STOP; the next begins after it.
  StorageOf no_storages = [&](const std::string&, at::ScalarType, int64_t) -> at::Storage {
    throw fail("a storage outside the saved object");
  };
  auto next = [&](const StorageOf& storage_of, auto&& use) {
    Machine machine(path, bytes + pos, size - pos, storage_of);
    const Value& value = *machine.run();
    pos += machine.consumed();
    return use(value);
  };
  next(no_storages, [&](const Value& v) {
    if (v.kind != Value::Kind::kInt || v.i != 1001) throw fail("protocol version is not 1001");
    return 0;
  });
  next(no_storages, [&](const Value& v) {  // sys_info: {"protocol_version", "little_endian", "type_sizes"}
    if (v.kind != Value::Kind::kDict) throw fail("its system information is not a dict");
    auto little = v.keys.find("little_endian");
    if (little != v.keys.end() && !(v.items[little->second + 1]->kind == Value::Kind::kBool &&
                                    v.items[little->second + 1]->i == 1)) {
      throw fail("saved big-endian (little expected)");
    }
    return 0;
  });
  // The object: each storage it names is made without its bytes, which follow the next pickle.
  std::map<std::string, std::pair<at::Storage, size_t>> storages;  // key -> (storage, element size)
  StorageOf placeholder = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    const size_t item = at::elementSize(dtype);
    if (numel < 0 || static_cast<uint64_t>(numel) > size / item) {
      throw fail("storage " + key + " of " + std::to_string(numel) + " elements is larger than the file");
    }
    at::Storage s(at::Storage::use_byte_size_t(), static_cast<size_t>(numel) * item,
                  at::DataPtr(nullptr, at::Device(at::kCPU)), nullptr, /*resizable=*/false);
    storages.emplace(key, std::make_pair(s, item));
    return s;
  };
  auto entries = next(placeholder, [&](const Value& v) { return entries_of(path, v); });
  // The storages' keys in the order their bytes follow: each an int64 element count, then the elements.
  const std::vector<std::string> keys = next(no_storages, [&](const Value& v) {
    if (v.kind != Value::Kind::kList) throw fail("its storage keys are not a list");
    std::vector<std::string> out;
    for (const ValuePtr& key : v.items) {
      if (key->kind != Value::Kind::kString) throw fail("a storage key is not a string");
      out.push_back(key->s);
    }
    return out;
  });
  for (const std::string& key : keys) {
    auto it = storages.find(key);
    if (it == storages.end()) throw fail("storage " + key + " is not used by any tensor");
    if (size - pos < 8) throw fail("the file ends before storage " + key);
    int64_t numel = 0;
    std::memcpy(&numel, bytes + pos, 8);  // little-endian, as the check above
    const auto& [storage, item] = it->second;
    const size_t nbytes = storage.nbytes();
    if (numel < 0 || static_cast<uint64_t>(numel) != nbytes / item) {
      throw fail("storage " + key + " holds " + std::to_string(numel) + " elements, its tensors' persistent id " +
                 std::to_string(nbytes / item));
    }
    if (size - pos - 8 < nbytes) throw fail("the file ends inside storage " + key);
    storage.set_data_ptr_noswap(bytes_at(pos + 8));
    pos += 8 + nbytes;
    storages.erase(it);
  }
  if (!storages.empty()) throw fail("storage " + storages.begin()->first + " has no bytes in the file");
  return entries;
}

}  // namespace shardtrain::io
