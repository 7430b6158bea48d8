#include "io/dcp_metadata.h"

#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "io/pickle_machine.h"

namespace shardtrain::io {
namespace {

const std::string kMeta = "torch.distributed.checkpoint.metadata.";

// The classes a DCP metadata file instantiates (NEWOBJ, their fields set by BUILD).
const std::set<std::string>& dcp_classes() {
  static const std::set<std::string> classes = {
      kMeta + "Metadata",         kMeta + "TensorStorageMetadata", kMeta + "TensorProperties",
      kMeta + "ChunkStorageMetadata", kMeta + "BytesStorageMetadata", kMeta + "MetadataIndex",
      kMeta + "StorageMeta",      "torch.distributed.checkpoint.filesystem._StorageInfo"};
  return classes;
}

// torch.<dtype> globals as the metadata names a tensor's dtype.
const std::map<std::string, at::ScalarType>& dtypes() {
  static const std::map<std::string, at::ScalarType> types = {
      {"torch.float32", at::kFloat},   {"torch.float64", at::kDouble},   {"torch.float16", at::kHalf},
      {"torch.bfloat16", at::kBFloat16}, {"torch.int64", at::kLong},     {"torch.int32", at::kInt},
      {"torch.int16", at::kShort},     {"torch.int8", at::kChar},        {"torch.uint8", at::kByte},
      {"torch.bool", at::kBool},       {"torch.complex64", at::kComplexFloat},
      {"torch.complex128", at::kComplexDouble}, {"torch.float8_e4m3fn", at::kFloat8_e4m3fn},
      {"torch.float8_e5m2", at::kFloat8_e5m2}};
  return types;
}

class MetadataMachine : public PickleMachine {
 public:
  MetadataMachine(const std::string& path, const char* program, size_t size)
      : PickleMachine(path, "its checkpoint metadata", program, size) {}

 private:
  ValuePtr new_object(const std::string& cls, const std::vector<ValuePtr>& args) override {
    if (!dcp_classes().count(cls)) fail("the file makes an object of class " + cls + ", which DCP's metadata does not");
    if (!args.empty()) fail(cls + " made with arguments (its fields come by BUILD)");
    ValuePtr v = make(Value::Kind::kObject);
    v->s = cls;
    return v;
  }

  // The torch and Python values DCP's dataclasses hold, each as the plain value it stands for.
  ValuePtr call(const std::string& fn, const std::vector<ValuePtr>& args) override {
    auto only = [&](Value::Kind kind) {
      if (args.size() != 1 || args[0]->kind != kind) fail(fn + " called with other than one " + kind_name(kind));
      return args[0];
    };
    if (fn == "torch.Size") {  // torch.Size((d0, d1, ...)): the tuple
      ValuePtr dims = only(Value::Kind::kTuple);
      ints_arg(args, 0, fn);
      return dims;
    }
    if (fn == "torch.serialization._get_layout") return only(Value::Kind::kString);  // "torch.strided"
    if (fn == kMeta + "_MEM_FORMAT_ENCODING") return only(Value::Kind::kInt);        // a memory format's number
    if (fn == "collections.OrderedDict" && args.empty()) return make(Value::Kind::kDict);
    // StorageMeta's checkpoint_id: its parts joined.
    if (fn == "pathlib.PosixPath" || fn == "pathlib.WindowsPath" || fn == "pathlib._local.PosixPath" ||
        fn == "pathlib._local.WindowsPath") {
      ValuePtr joined = make(Value::Kind::kString);
      for (const ValuePtr& part : args) {
        if (part->kind != Value::Kind::kString) fail(fn + " called with a " + kind_name(part->kind));
        joined->s += (joined->s.empty() ? "" : "/") + part->s;
      }
      return joined;
    }
    fail("the file calls " + fn + ", which DCP's metadata does not");
  }
};

// Reading the value tree, with every expectation named.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(path_ + ": not a distributed checkpoint's metadata: " + what);
  }
  // The fields of an object of `cls` (the state BUILD gave it: a dict).
  const Value& fields(const Value* v, const std::string& cls) const {
    if (v == nullptr || v->kind != Value::Kind::kObject || v->s != kMeta + cls) fail(cls + " expected");
    if (v->state == nullptr || v->state->kind != Value::Kind::kDict) fail(cls + " without its fields");
    return *v->state;
  }
  const Value* field(const Value& dict, const std::string& name, const std::string& cls) const {
    const Value* v = dict.get(name);
    if (v == nullptr) fail(cls + " without its field " + name);
    return v;
  }
  std::vector<int64_t> ints(const Value* v, const std::string& what) const {
    if (v->kind != Value::Kind::kTuple && v->kind != Value::Kind::kList) fail(what + " is not a tuple");
    std::vector<int64_t> out;
    for (const ValuePtr& item : v->items) {
      if (item->kind != Value::Kind::kInt) fail(what + " holds a " + kind_name(item->kind));
      out.push_back(item->i);
    }
    return out;
  }
  const std::string& string(const Value* v, const std::string& what) const {
    if (v->kind != Value::Kind::kString) fail(what + " is not a string");
    return v->s;
  }
  int64_t integer(const Value* v, const std::string& what) const {
    if (v->kind != Value::Kind::kInt) fail(what + " is not an integer");
    return v->i;
  }

 private:
  std::string path_;
};

// TensorProperties' dtype: its __getstate__ tuple (dtype, layout, requires_grad, memory format, pin_memory), or
// the dataclass's fields in files from before it had one.
at::ScalarType dtype_of(const Reader& r, const Value* properties, const std::string& key) {
  if (properties == nullptr || properties->kind != Value::Kind::kObject ||
      properties->s != kMeta + "TensorProperties" || properties->state == nullptr) {
    r.fail("'" + key + "' without its TensorProperties");
  }
  const Value& state = *properties->state;
  const Value* dtype = nullptr;
  const Value* layout = nullptr;
  if (state.kind == Value::Kind::kTuple && !state.items.empty()) {
    dtype = state.items[0];
    if (state.items.size() > 1) layout = state.items[1];
  } else if (state.kind == Value::Kind::kDict) {
    dtype = state.get("dtype");
    layout = state.get("layout");
  }
  if (dtype == nullptr || dtype->kind != Value::Kind::kGlobal) r.fail("'" + key + "' has no dtype");
  if (layout != nullptr && layout->kind == Value::Kind::kString && layout->s != "torch.strided") {
    r.fail("'" + key + "' is a " + layout->s + " tensor (dense, torch.strided, tensors are read)");
  }
  auto it = dtypes().find(dtype->s);
  if (it == dtypes().end()) r.fail("'" + key + "' has dtype " + dtype->s + ", which is not read");
  return it->second;
}

// Where each chunk's bytes are: storage_data's {MetadataIndex(fqn, offset): _StorageInfo(relative_path, offset,
// length)}, by (fqn, the chunk's offsets).
struct Place {
  std::string file;
  uint64_t offset, length;
  std::vector<std::string> transforms;
};
using Places = std::map<std::pair<std::string, std::vector<int64_t>>, Place>;

Places storage_places(const Reader& r, const Value& root) {
  Places places;
  const Value* storage = r.field(root, "storage_data", "Metadata");
  if (storage->kind != Value::Kind::kDict) r.fail("its storage_data is not a dict");
  for (size_t k = 0; k < storage->items.size(); k += 2) {
    const Value& index = r.fields(storage->items[k], "MetadataIndex");
    const std::string& fqn = r.string(r.field(index, "fqn", "MetadataIndex"), "a MetadataIndex's fqn");
    const Value* offset = index.get("offset");
    const std::vector<int64_t> at = offset == nullptr || offset->kind == Value::Kind::kNone
                                        ? std::vector<int64_t>{}
                                        : r.ints(offset, "offset of '" + fqn + "'");
    const Value* info = storage->items[k + 1];
    if (info->kind != Value::Kind::kObject || info->s != "torch.distributed.checkpoint.filesystem._StorageInfo" ||
        info->state == nullptr || info->state->kind != Value::Kind::kDict) {
      r.fail("the storage of '" + fqn +
             "' is not a _StorageInfo (a checkpoint written by "
             "FileSystemWriter expected)");
    }
    const Value& f = *info->state;
    const int64_t bytes_at = r.integer(r.field(f, "offset", "_StorageInfo"), "offset of '" + fqn + "'");
    const int64_t length = r.integer(r.field(f, "length", "_StorageInfo"), "length of '" + fqn + "'");
    if (bytes_at < 0 || length < 0) r.fail("the storage of '" + fqn + "' has a negative offset or length");
    Place place{r.string(r.field(f, "relative_path", "_StorageInfo"), "relative_path of '" + fqn + "'"),
                static_cast<uint64_t>(bytes_at),
                static_cast<uint64_t>(length),
                {}};
    if (place.file.empty() || place.file.find('/') != std::string::npos || place.file == "..") {
      r.fail("the storage of '" + fqn + "' is in '" + place.file + "', not a file beside the metadata");
    }
    if (const Value* t = f.get("transform_descriptors"); t != nullptr && t->kind != Value::Kind::kNone) {
      if (t->kind != Value::Kind::kList && t->kind != Value::Kind::kTuple)
        r.fail("transform_descriptors of '" + fqn + "'");
      for (const ValuePtr& d : t->items)
        place.transforms.push_back(r.string(d, "a transform descriptor of '" + fqn + "'"));
    }
    places[{fqn, at}] = std::move(place);
  }
  return places;
}

// planner_data: {key: (its path in the saved nesting)} (DefaultSavePlanner's flattening).
std::map<std::string, std::vector<std::string>> saved_paths(const Reader& r, const Value& root) {
  std::map<std::string, std::vector<std::string>> paths;
  if (const Value* planner = root.get("planner_data"); planner != nullptr && planner->kind == Value::Kind::kDict) {
    for (size_t k = 0; k < planner->items.size(); k += 2) {
      const Value* key = planner->items[k];
      const Value* path = planner->items[k + 1];
      if (key->kind != Value::Kind::kString || path->kind != Value::Kind::kTuple) continue;
      std::vector<std::string> parts;
      for (const ValuePtr& p : path->items) {
        if (p->kind == Value::Kind::kString)
          parts.push_back(p->s);
        else if (p->kind == Value::Kind::kInt)
          parts.push_back(std::to_string(p->i));
        else
          r.fail("the saved path of '" + key->s + "' holds a " + kind_name(p->kind));
      }
      paths[key->s] = std::move(parts);
    }
  }
  return paths;
}

// One state_dict_metadata entry's TensorStorageMetadata: its size, dtype and chunks, each with where its bytes are.
DcpTensor tensor_of(const Reader& r, const std::string& key, const Value* item,
                    const std::map<std::string, std::vector<std::string>>& paths, const Places& places) {
  const Value& t = r.fields(item, "TensorStorageMetadata");
  DcpTensor tensor;
  tensor.key = key;
  auto path = paths.find(key);
  tensor.path = path == paths.end() ? std::vector<std::string>{key} : path->second;
  tensor.dtype = dtype_of(r, t.get("properties"), key);
  tensor.size = r.ints(r.field(t, "size", "TensorStorageMetadata"), "size of '" + key + "'");
  const Value* chunks = r.field(t, "chunks", "TensorStorageMetadata");
  if (chunks->kind != Value::Kind::kList) r.fail("the chunks of '" + key + "' are not a list");
  for (const ValuePtr& c : chunks->items) {
    const Value& cf = r.fields(c, "ChunkStorageMetadata");
    DcpChunk chunk;
    chunk.offsets = r.ints(r.field(cf, "offsets", "ChunkStorageMetadata"), "a chunk offset of '" + key + "'");
    chunk.sizes = r.ints(r.field(cf, "sizes", "ChunkStorageMetadata"), "a chunk size of '" + key + "'");
    if (chunk.offsets.size() != tensor.size.size() || chunk.sizes.size() != tensor.size.size()) {
      r.fail("a chunk of '" + key + "' has " + std::to_string(chunk.offsets.size()) + " offsets for " +
             std::to_string(tensor.size.size()) + " dimensions");
    }
    for (size_t d = 0; d < tensor.size.size(); ++d) {
      int64_t end = 0;
      if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 ||
          __builtin_add_overflow(chunk.offsets[d], chunk.sizes[d], &end) || end > tensor.size[d]) {
        r.fail("a chunk of '" + key + "' lies outside its tensor in dimension " + std::to_string(d));
      }
    }
    auto place = places.find({key, chunk.offsets});
    if (place == places.end()) r.fail("a chunk of '" + key + "' has no storage entry");
    chunk.file = place->second.file;
    chunk.offset = place->second.offset;
    chunk.length = place->second.length;
    chunk.transforms = place->second.transforms;
    tensor.chunks.push_back(std::move(chunk));
  }
  return tensor;
}

}  // namespace

DcpMetadata parse_dcp_metadata(const std::string& path, const char* bytes, size_t size) {
  MetadataMachine machine(path, bytes, size);
  const Reader r(path);
  const Value& root = r.fields(machine.run(), "Metadata");
  const Places places = storage_places(r, root);
  const std::map<std::string, std::vector<std::string>> paths = saved_paths(r, root);
  DcpMetadata out;
  const Value* items = r.field(root, "state_dict_metadata", "Metadata");
  if (items->kind != Value::Kind::kDict) r.fail("its state_dict_metadata is not a dict");
  for (size_t k = 0; k < items->items.size(); k += 2) {
    const std::string& key = r.string(items->items[k], "a key of state_dict_metadata");
    const Value* item = items->items[k + 1];
    if (item->kind == Value::Kind::kObject && item->s == kMeta + "BytesStorageMetadata") {
      out.byte_items.push_back(key);
      continue;
    }
    out.tensors.push_back(tensor_of(r, key, item, paths, places));
  }
  return out;
}

}  // namespace shardtrain::io
