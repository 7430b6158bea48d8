#include "io/state_dict_program.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <unordered_map>

namespace shardtrain::io {
namespace {

// The pickle protocol's opcodes that torch.save's programs use (protocol 2, its default; the protocol 4-5 ones
// that pickle_protocol= can add). pickletools documents each.
enum Op : uint8_t {
  kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kDup = '2',
  kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M', kLong1 = 0x8a, kNone = 'N', kNewTrue = 0x88, kNewFalse = 0x89,
  kBinFloat = 'G', kBinUnicode = 'X', kShortBinUnicode = 0x8c, kBinUnicode8 = 0x8d, kShortBinString = 'U',
  kBinString = 'T', kEmptyTuple = ')', kTuple = 't', kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87,
  kEmptyList = ']', kAppend = 'a', kAppends = 'e', kList = 'l', kEmptyDict = '}', kDict = 'd', kSetItem = 's',
  kSetItems = 'u', kGlobal = 'c', kStackGlobal = 0x93, kReduce = 'R', kBuild = 'b', kBinPersId = 'Q',
  kBinGet = 'h', kLongBinGet = 'j', kBinPut = 'q', kLongBinPut = 'r', kMemoize = 0x94, kProto = 0x80,
  kFrame = 0x95,
};

// A value on the pickle machine's stack. Every value is owned by the machine's arena and referred to by pointer:
// the memo and the stack share a dict filled after it was memoized, and a program may nest containers deeply or in
// cycles without recursion or leaks when they are freed.
struct Value;
using ValuePtr = Value*;
struct Value {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kGlobal, kStorage, kTensor };
  Kind kind = Kind::kNone;
  int64_t i = 0;                         // kBool, kInt
  double f = 0;                          // kFloat
  std::string s;                         // kString; kGlobal: "module.name"
  std::vector<ValuePtr> items;           // kTuple, kList; kDict: key, value, key, value...
  std::unordered_map<std::string, size_t> keys;  // kDict: a string key's place in items
  at::Storage storage;                   // kStorage
  at::ScalarType dtype = at::kByte;      // kStorage
  at::Tensor tensor;                     // kTensor
};

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kTuple: return "tuple";
    case Value::Kind::kList: return "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kGlobal: return "global";
    case Value::Kind::kStorage: return "storage";
    case Value::Kind::kTensor: return "tensor";
  }
  return "?";
}

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

// Runs one pickle program (the archive's data.pkl) to its STOP. Storages come from `storage_of(key, dtype, numel)`.
class Machine {
 public:
  Machine(const std::string& path, const char* program, size_t size, const StorageOf& storage_of)
      : path_(path), p_(program), size_(size), storage_of_(storage_of) {}

  size_t consumed() const { return pos_; }  // the program's bytes up to its STOP, once run

  ValuePtr run() {
    while (true) {
      const size_t at = pos_;
      const uint8_t op = u8();
      switch (op) {
        case kProto: u8(); break;
        case kFrame: take(8); break;
        case kStop:
          if (stack_.size() != 1) fail("the program stops with " + std::to_string(stack_.size()) + " values");
          return stack_.back();
        case kMark: marks_.push_back(stack_.size()); break;
        case kPop: pop(); break;
        case kPopMark: since_mark(); break;
        case kDup: {
          ValuePtr v = top();
          stack_.push_back(v);
          break;
        }
        case kNone: stack_.push_back(make(Value::Kind::kNone)); break;
        case kNewTrue: case kNewFalse: {
          auto v = make(Value::Kind::kBool);
          v->i = op == kNewTrue;
          stack_.push_back(v);
          break;
        }
        case kBinInt: push_int(static_cast<int32_t>(le(4))); break;
        case kBinInt1: push_int(static_cast<int64_t>(le(1))); break;
        case kBinInt2: push_int(static_cast<int64_t>(le(2))); break;
        case kLong1: {
          const size_t n = u8();
          if (n > 8) fail("an integer of " + std::to_string(n) + " bytes (8 at most expected)");
          uint64_t bits = n == 0 ? 0 : le(n);
          if (n > 0 && n < 8 && (bits >> (8 * n - 1)) != 0) bits |= ~uint64_t{0} << (8 * n);  // sign-extend
          push_int(static_cast<int64_t>(bits));
          break;
        }
        case kBinFloat: {
          uint64_t bits = 0;
          for (const char c : take(8)) bits = (bits << 8) | static_cast<uint8_t>(c);  // big-endian
          auto v = make(Value::Kind::kFloat);
          std::memcpy(&v->f, &bits, sizeof(bits));
          stack_.push_back(v);
          break;
        }
        case kBinUnicode: case kBinString: push_string(take(le(4))); break;
        case kShortBinUnicode: case kShortBinString: push_string(take(u8())); break;
        case kBinUnicode8: push_string(take(le(8))); break;
        case kEmptyTuple: stack_.push_back(make(Value::Kind::kTuple)); break;
        case kTuple: push_sequence(Value::Kind::kTuple, since_mark()); break;
        case kTuple1: case kTuple2: case kTuple3: {
          const size_t n = op - kTuple1 + 1;
          if (stack_.size() < n) fail("a tuple of " + std::to_string(n) + " from a shorter stack");
          push_sequence(Value::Kind::kTuple, std::vector<ValuePtr>(stack_.end() - n, stack_.end()), n);
          break;
        }
        case kEmptyList: stack_.push_back(make(Value::Kind::kList)); break;
        case kList: push_sequence(Value::Kind::kList, since_mark()); break;
        case kAppend: {
          ValuePtr item = pop();
          expect(top(), Value::Kind::kList, "APPEND")->items.push_back(item);
          break;
        }
        case kAppends: {
          std::vector<ValuePtr> items = since_mark();
          auto& list = expect(top(), Value::Kind::kList, "APPENDS")->items;
          list.insert(list.end(), items.begin(), items.end());
          break;
        }
        case kEmptyDict: stack_.push_back(make(Value::Kind::kDict)); break;
        case kDict: {
          std::vector<ValuePtr> items = since_mark();
          stack_.push_back(make(Value::Kind::kDict));
          set_items(top(), items);
          break;
        }
        case kSetItem: {
          ValuePtr value = pop(), key = pop();
          set_items(top(), {key, value});
          break;
        }
        case kSetItems: {
          std::vector<ValuePtr> items = since_mark();
          set_items(top(), items);
          break;
        }
        case kGlobal: {
          std::string module = line(), name = line();
          push_global(module + "." + name);
          break;
        }
        case kStackGlobal: {
          ValuePtr name = pop(), module = pop();
          push_global(expect(module, Value::Kind::kString, "STACK_GLOBAL")->s + "." +
                      expect(name, Value::Kind::kString, "STACK_GLOBAL")->s);
          break;
        }
        case kReduce: {
          ValuePtr args = pop(), callable = pop();
          stack_.push_back(call(expect(callable, Value::Kind::kGlobal, "REDUCE")->s,
                                expect(args, Value::Kind::kTuple, "REDUCE")->items));
          break;
        }
        case kBuild: {
          pop();  // the state: a state dict's attributes (OrderedDict's _metadata), which tensors do not need
          if (top()->kind != Value::Kind::kDict) {
            fail(std::string("BUILD of a ") + kind_name(top()->kind) + " (only a dict's attributes are expected)");
          }
          break;
        }
        case kBinPersId: stack_.push_back(persistent_load(pop())); break;
        case kBinGet: case kLongBinGet: {
          const uint64_t key = le(op == kBinGet ? 1 : 4);
          auto it = memo_.find(key);
          if (it == memo_.end()) fail("memo entry " + std::to_string(key) + " read before it was written");
          stack_.push_back(it->second);
          break;
        }
        case kBinPut: memo_[le(1)] = top(); break;
        case kLongBinPut: memo_[le(4)] = top(); break;
        case kMemoize: memo_[memo_.size()] = top(); break;
        default: {
          char text[64];
          std::snprintf(text, sizeof(text), "opcode 0x%02x at byte %zu", op, at);
          fail(std::string(text) + ", which a file of tensors does not use");
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(path_ + ": cannot read its state dict: " + what);
  }
  ValuePtr make(Value::Kind kind) {
    arena_.push_back(std::make_unique<Value>());
    arena_.back()->kind = kind;
    return arena_.back().get();
  }
  std::string take(uint64_t n) {
    if (n > size_ - pos_) fail("the pickle program ends inside an instruction (truncated file?)");
    std::string out(p_ + pos_, p_ + pos_ + n);
    pos_ += n;
    return out;
  }
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint64_t le(size_t n) {  // an unsigned little-endian integer of n bytes
    const std::string bytes = take(n);
    uint64_t v = 0;
    for (size_t k = n; k-- > 0;) v = (v << 8) | static_cast<uint8_t>(bytes[k]);
    return v;
  }
  std::string line() {
    const void* end = std::memchr(p_ + pos_, '\n', size_ - pos_);
    if (end == nullptr) fail("a GLOBAL without its newline");
    std::string out = take(static_cast<const char*>(end) - (p_ + pos_));
    pos_ += 1;
    return out;
  }
  ValuePtr top() {
    if (stack_.empty()) fail("an instruction reads an empty stack");
    return stack_.back();
  }
  ValuePtr pop() {
    ValuePtr v = top();
    stack_.pop_back();
    return v;
  }
  std::vector<ValuePtr> since_mark() {
    if (marks_.empty() || marks_.back() > stack_.size()) fail("an instruction expects a MARK that is not there");
    std::vector<ValuePtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  ValuePtr expect(const ValuePtr& v, Value::Kind kind, const char* op) const {
    if (v->kind != kind) {
      fail(std::string(op) + " expects a " + kind_name(kind) + ", found a " + kind_name(v->kind));
    }
    return v;
  }
  void push_int(int64_t i) {
    auto v = make(Value::Kind::kInt);
    v->i = i;
    stack_.push_back(v);
  }
  void push_string(std::string s) {
    auto v = make(Value::Kind::kString);
    v->s = std::move(s);
    stack_.push_back(v);
  }
  void push_global(std::string name) {
    auto v = make(Value::Kind::kGlobal);
    v->s = std::move(name);
    stack_.push_back(v);
  }
  void push_sequence(Value::Kind kind, std::vector<ValuePtr> items, size_t popped = 0) {
    stack_.resize(stack_.size() - popped);
    auto v = make(kind);
    v->items = std::move(items);
    stack_.push_back(v);
  }
  void set_items(const ValuePtr& dict, const std::vector<ValuePtr>& items) {
    expect(dict, Value::Kind::kDict, "SETITEM");
    if (items.size() % 2 != 0) fail("SETITEMS with a key and no value");
    for (size_t k = 0; k < items.size(); k += 2) {
      if (items[k]->kind == Value::Kind::kString) {
        auto [it, added] = dict->keys.emplace(items[k]->s, dict->items.size());
        if (!added) {  // a key set again: Python keeps its first place and the last value
          dict->items[it->second + 1] = items[k + 1];
          continue;
        }
      }
      dict->items.push_back(items[k]);
      dict->items.push_back(items[k + 1]);
    }
  }

  int64_t int_arg(const std::vector<ValuePtr>& args, size_t k, const std::string& fn) const {
    if (args.size() <= k || args[k]->kind != Value::Kind::kInt) fail(fn + "'s argument " + std::to_string(k) +
                                                                     " is not an integer");
    return args[k]->i;
  }
  std::vector<int64_t> ints_arg(const std::vector<ValuePtr>& args, size_t k, const std::string& fn) const {
    if (args.size() <= k || args[k]->kind != Value::Kind::kTuple) fail(fn + "'s argument " + std::to_string(k) +
                                                                       " is not a tuple");
    std::vector<int64_t> out;
    for (const auto& item : args[k]->items) {
      if (item->kind != Value::Kind::kInt) fail(fn + "'s argument " + std::to_string(k) + " holds a non-integer");
      out.push_back(item->i);
    }
    return out;
  }

  // The globals a state dict calls; any other is refused (torch.load(weights_only=True)'s rule).
  ValuePtr call(const std::string& fn, const std::vector<ValuePtr>& args) {
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
  ValuePtr persistent_load(const ValuePtr& id) {
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

  std::string path_;
  const char* p_;
  size_t size_, pos_ = 0;
  const StorageOf& storage_of_;
  std::vector<std::unique_ptr<Value>> arena_;  // every value made, freed with the machine
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
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

bool is_legacy_torch_save(const char* bytes, size_t size) {
  return size >= 2 + kLegacyMagic.size() && static_cast<uint8_t>(bytes[0]) == kProto &&
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
