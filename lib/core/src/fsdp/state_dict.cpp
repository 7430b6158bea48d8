#include "shardtrain/fsdp/state_dict.h"

#include <torch/nn/module.h>

#include <set>
#include <stdexcept>

#include "fsdp/fsdp_unit.h"
#include "shardtrain/distributed/text_exchange.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/pickle_files.h"
#include "shardtrain/io/torch_state_dict.h"

namespace shardtrain::fsdp {
namespace {

constexpr const char* kShardedFormat = "shardtrain.sharded_state_dict.v1";

std::string shape_text(at::IntArrayRef shape) { return c10::str(shape); }

// What a state dict of `root` holds: parameters inside units (sharded) and everything else — parameters no unit
// owns and buffers — which every rank holds whole.
struct Layout {
  std::vector<std::shared_ptr<FsdpUnit::Impl>> units;
  std::map<const c10::TensorImpl*, std::string> param_names;
  std::vector<std::pair<std::string, at::Tensor>> whole;
  const dist::Communicator* shard_group = nullptr;
  bool writer = true;  // replica 0 (of hybrid / NO_SHARD) holds the copy that is written

  const std::string& name_of(const FsdpParam& p) const { return param_names.at(p.param().unsafeGetTensorImpl()); }

  // Every rank of the job after every rank of replica 0's shard group: a shard-group barrier, then a replicate one.
  void barrier() const {
    shard_group->barrier().wait();
    const auto& replicate = units.front()->options.replicate_group;
    if (replicate) replicate->barrier().wait();
  }

  // As barrier(), agreeing on the first failure: `what` (this rank's error, "" for none) becomes "rank R: what",
  // and every rank of the job returns the same first one, "" when none failed.
  std::string agree(const std::string& what) const {
    std::string first = dist::first_failure(*shard_group, dist::failure_text(*shard_group, what));
    const auto& replicate = units.front()->options.replicate_group;
    if (replicate) first = dist::first_failure(*replicate, first);
    return first;
  }
};

Layout layout_of(const std::shared_ptr<torch::nn::Module>& root, const char* caller) {
  Layout layout;
  layout.units = units_sharing_one_group(root, caller);
  std::set<const c10::TensorImpl*> owned;
  for (const auto& unit : layout.units) {
    if (unit->state != ShardState::SHARDED || unit->training != TrainingState::IDLE) {
      throw std::logic_error(std::string(caller) + ": unit " + unit->module_name + " is not sharded and idle; call it "
                             "between steps");
    }
    for (const auto& p : unit->params) owned.insert(p.param().unsafeGetTensorImpl());
  }
  for (const auto& item : root->named_parameters()) {
    layout.param_names[item.value().unsafeGetTensorImpl()] = item.key();
    if (!owned.count(item.value().unsafeGetTensorImpl())) layout.whole.emplace_back(item.key(), item.value());
  }
  for (const auto& item : root->named_buffers()) layout.whole.emplace_back(item.key(), item.value());
  layout.shard_group = &layout.units.front()->group;
  const auto& replicate = layout.units.front()->options.replicate_group;
  layout.writer = !replicate || replicate->rank() == 0;
  return layout;
}

// A model no unit shards: everything whole.
Layout whole_layout(const std::shared_ptr<torch::nn::Module>& root) {
  Layout layout;
  for (const auto& item : root->named_parameters()) layout.whole.emplace_back(item.key(), item.value());
  for (const auto& item : root->named_buffers()) layout.whole.emplace_back(item.key(), item.value());
  return layout;
}

std::string shard_file(const std::string& dir, int64_t shard, int64_t count) {
  return dir + "/shard-" + std::to_string(shard) + "-of-" + std::to_string(count) + ".pt";
}

c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

c10::impl::GenericDict load_dict(const std::string& path, const char* what) {
  c10::IValue value = io::load_pickle(path);
  if (!value.isGenericDict()) throw std::runtime_error(path + " is not a " + what + " (not a dict)");
  return value.toGenericDict();
}

const c10::IValue& entry(const c10::impl::GenericDict& dict, const std::string& key, const std::string& path) {
  auto it = dict.find(c10::IValue(key));
  if (it == dict.end()) throw std::runtime_error(path + ": no entry '" + key + "'");
  return it->value();
}

// Copies into `dst` (rows [first, first + dst.size(0)) of a parameter, contiguous) those rows out of `source`, which
// holds the parameter's rows from `source_first` on (any shape with the same elements per row).
void copy_rows(const at::Tensor& dst, const at::Tensor& source, int64_t first, int64_t source_first) {
  if (dst.numel() == 0) return;
  const int64_t rows = dst.size(0), row_numel = dst.numel() / rows;
  dst.view({rows, row_numel}).copy_(source.reshape({-1, row_numel}).narrow(0, first - source_first, rows));
}

void check_shape(const std::string& name, at::IntArrayRef saved, at::IntArrayRef expected, const std::string& where) {
  if (saved != expected) {
    throw std::invalid_argument(where + ": '" + name + "' has shape " + shape_text(saved) + ", the model's is " +
                                shape_text(expected));
  }
}

// The state tensors of parameter `name`: (file entry name, tensor) for each key of `states` that has one.
std::vector<std::pair<std::string, optim::StateTensor>> states_of(const ParamStates& states, const std::string& name) {
  std::vector<std::pair<std::string, optim::StateTensor>> out;
  for (const auto& [key, tensors] : states) {
    auto it = tensors.find(name);
    if (it != tensors.end()) out.emplace_back(name + "::" + key, it->second);
  }
  return out;
}

// The part of a sharded parameter's state tensor that is this rank's to save and load — the real rows of a
// tensor split like the parameter or by its rows — and the whole tensor's shape. A WHOLE tensor is all of it.
struct StatePart {
  at::Tensor rows;
  std::vector<int64_t> shape;
};
StatePart state_part(const FsdpParam& p, const optim::StateTensor& state, const std::string& entry_name) {
  const at::Tensor& t = state.tensor;
  switch (state.split) {
    case optim::StateSplit::LIKE_PARAMETER: {
      if (t.numel() != p.shard_numel()) {
        throw std::invalid_argument("sharded state dict: '" + entry_name + "' has " + std::to_string(t.numel()) +
                                    " elements, its parameter's shard " + std::to_string(p.shard_numel()));
      }
      return {p.as_shard(t.view({-1})).narrow(0, 0, p.shard_real_rows()), p.declared_shape()};
    }
    case optim::StateSplit::BY_ROWS: {
      const std::vector<int64_t> param_shape = p.declared_shape();
      if (t.dim() == 0 || param_shape.empty()) {
        throw std::invalid_argument("sharded state dict: '" + entry_name + "' is split by rows but it or its " +
                                    "parameter has no dimension");
      }
      std::vector<int64_t> shape = t.sizes().vec();
      shape[0] = param_shape[0];
      return {t.narrow(0, 0, p.shard_real_rows()), shape};
    }
    case optim::StateSplit::WHOLE:
      break;
  }
  return {t, t.sizes().vec()};
}

// metadata.pt's contents, which declare a directory of `count` shard files whole (written after them).
c10::IValue metadata_contents(int64_t count) {
  auto meta = new_dict();
  meta.insert("format", std::string(kShardedFormat));
  meta.insert("shard_count", count);
  return meta;
}

// This rank's file of a sharded state dict: its rows of every unit's parameters and their states, and (shard 0)
// everything held whole. The shards as they are, on their device: io::save_pickle writes each storage once (a
// unit's flat shard holds its parameters' real rows), a device one through one host copy at a time.
c10::IValue shard_contents(const Layout& layout, const ParamStates& states, int64_t shard, int64_t count) {
  auto tensors = new_dict(), shapes = new_dict(), first_rows = new_dict();
  for (const auto& unit : layout.units) {
    for (const auto& p : unit->params) {
      const std::string& name = layout.name_of(p);
      tensors.insert(name, p.real_shard().detach());
      shapes.insert(name, p.declared_shape());
      first_rows.insert(name, p.shard_first_row());
      for (const auto& [entry_name, state] : states_of(states, name)) {
        const bool whole = state.split == optim::StateSplit::WHOLE;
        if (whole && shard != 0) continue;  // equal on every rank: shard 0 writes it
        const StatePart part = state_part(p, state, entry_name);
        tensors.insert(entry_name, part.rows.detach());
        shapes.insert(entry_name, part.shape);
        first_rows.insert(entry_name, whole ? int64_t{0} : p.shard_first_row());
      }
    }
  }
  if (shard == 0) {
    for (const auto& [name, t] : layout.whole) {
      tensors.insert(name, t.detach());
      shapes.insert(name, t.sizes().vec());
      first_rows.insert(name, int64_t{0});
      for (const auto& [entry_name, state] : states_of(states, name)) {
        tensors.insert(entry_name, state.tensor.detach());
        shapes.insert(entry_name, state.tensor.sizes().vec());
        first_rows.insert(entry_name, int64_t{0});
      }
    }
  }
  auto file = new_dict();
  file.insert("format", std::string(kShardedFormat));
  file.insert("shard", shard);
  file.insert("shard_count", count);
  file.insert("tensors", tensors);
  file.insert("shapes", shapes);
  file.insert("first_rows", first_rows);
  return file;
}

// Writes `files` (each into its directory), agreeing with every rank of `layout` on the first failure.
void write_agreed(const Layout& layout, const std::vector<StateDictFile>& files) {
  std::string failed;  // this rank's write error; the ranks agree on the first before going on
  try {
    write_state_dict_files(files);
  } catch (const c10::Error& e) {
    failed = e.what_without_backtrace();
  } catch (const std::exception& e) {
    failed = e.what();
  }
  if (const std::string first = layout.agree(failed); !first.empty()) throw dist::AgreedFailure(first);
}

}  // namespace

void write_state_dict_files(const std::vector<StateDictFile>& files) {
  for (const StateDictFile& f : files) {
    io::make_directories(io::parent_directory(f.path));
    io::save_pickle(f.path, f.contents);
  }
}

StateDictFiles sharded_state_files(const std::shared_ptr<torch::nn::Module>& root, const std::string& dir,
                                   const ParamStates& states) {
  const Layout layout = layout_of(root, "save_sharded_state_dict");
  const int64_t count = layout.shard_group->size(), shard = layout.shard_group->rank();
  StateDictFiles files;
  if (!layout.writer) return files;
  files.shards.push_back({shard_file(dir, shard, count), shard_contents(layout, states, shard, count)});
  if (shard == 0) files.metadata.push_back({dir + "/metadata.pt", metadata_contents(count)});
  return files;
}

StateDictFiles whole_state_files(const std::shared_ptr<torch::nn::Module>& root, const std::string& dir,
                                 const ParamStates& states) {
  StateDictFiles files;
  files.shards.push_back({shard_file(dir, 0, 1), shard_contents(whole_layout(root), states, 0, 1)});
  files.metadata.push_back({dir + "/metadata.pt", metadata_contents(1)});
  return files;
}

void save_sharded_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::string& dir,
                             const ParamStates& states) {
  const Layout layout = layout_of(root, "save_sharded_state_dict");
  const StateDictFiles files = sharded_state_files(root, dir, states);
  write_agreed(layout, files.shards);
  write_agreed(layout, files.metadata);  // every shard is on disk before the metadata declares the directory whole
}

namespace {

// Where loading takes its values from: `rows` fills dst with rows [first, first + dst.size(0)) of entry `name`
// (whole shape `shape`, checked); `whole` returns the whole entry of shape `shape` (checked).
struct EntrySource {
  std::function<void(const std::string& name, const std::vector<int64_t>& shape, const at::Tensor& dst, int64_t first)>
      rows;
  std::function<at::Tensor(const std::string& name, at::IntArrayRef shape)> whole;
};

// Every parameter's rows, its states' (rows, or whole), and every whole tensor of the model, from `source`.
void load_from(const Layout& layout, const ParamStates& states, const EntrySource& source) {
  c10::AutoGradMode no_grad(false);
  for (const auto& unit : layout.units) {
    for (const auto& p : unit->params) {
      const std::string& name = layout.name_of(p);
      source.rows(name, p.declared_shape(), p.real_shard(), p.shard_first_row());
      for (const auto& [entry_name, state] : states_of(states, name)) {
        const StatePart part = state_part(p, state, entry_name);
        if (state.split != optim::StateSplit::WHOLE) {
          source.rows(entry_name, part.shape, part.rows, p.shard_first_row());
          continue;
        }
        part.rows.detach().copy_(source.whole(entry_name, part.shape).reshape(part.rows.sizes()));
      }
    }
  }
  for (const auto& [name, t] : layout.whole) {
    t.detach().copy_(source.whole(name, t.sizes()).reshape(t.sizes()));
    for (const auto& [entry_name, state] : states_of(states, name)) {
      state.tensor.detach().copy_(source.whole(entry_name, state.tensor.sizes()).reshape(state.tensor.sizes()));
    }
  }
}

}  // namespace

void load_sharded_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::string& dir,
                             const ParamStates& states) {
  const Layout layout = layout_of(root, "load_sharded_state_dict");
  const std::string meta_path = dir + "/metadata.pt";
  if (!io::path_exists(meta_path)) {
    throw std::runtime_error("load_sharded_state_dict: " + dir + " is not a complete sharded state dict (no " +
                             "metadata.pt: the save did not finish, or this is not such a directory)");
  }
  const auto meta = load_dict(meta_path, "sharded state dict's metadata");
  const int64_t count = entry(meta, "shard_count", meta_path).toInt();
  std::map<int64_t, c10::impl::GenericDict> files;
  auto file = [&](int64_t shard) -> const c10::impl::GenericDict& {
    auto it = files.find(shard);
    if (it == files.end()) it = files.emplace(shard, load_dict(shard_file(dir, shard, count), "sharded state dict")).first;
    return it->second;
  };
  auto saved = [&](int64_t shard, const std::string& name) {
    const std::string path = shard_file(dir, shard, count);
    const auto& f = file(shard);
    auto tensors = entry(f, "tensors", path).toGenericDict();
    auto it = tensors.find(c10::IValue(name));
    if (it == tensors.end()) throw std::invalid_argument(path + ": no entry for '" + name + "' of the model");
    return std::make_tuple(it->value().toTensor(),
                           io::int_vector(entry(f, "shapes", path).toGenericDict().at(name), path + ": shape of " + name),
                           entry(f, "first_rows", path).toGenericDict().at(name).toInt(), path);
  };
  EntrySource source;
  // This rank's rows [first, first + dst.size(0)) of entry `name`, gathered from the saved shards that hold them.
  source.rows = [&](const std::string& name, const std::vector<int64_t>& shape, const at::Tensor& dst, int64_t first) {
    const int64_t rows = shape.empty() ? 1 : shape[0];
    const int64_t chunk = std::max<int64_t>(1, (rows + count - 1) / count);  // rows per shard when saved
    const int64_t end = first + dst.size(0);
    for (int64_t row = first; row < end;) {
      auto [saved_rows, saved_shape, source_first, path] = saved(row / chunk, name);
      check_shape(name, saved_shape, shape, path);
      const int64_t take = std::min(end, source_first + saved_rows.size(0)) - row;
      if (take <= 0) throw std::runtime_error(path + ": does not hold row " + std::to_string(row) + " of '" + name + "'");
      copy_rows(dst.narrow(0, row - first, take), saved_rows, row, source_first);
      row += take;
    }
  };
  source.whole = [&](const std::string& name, at::IntArrayRef shape) {
    auto [saved_whole, saved_shape, source_first, path] = saved(0, name);
    check_shape(name, saved_shape, shape, path);
    return saved_whole;
  };
  load_from(layout, states, source);
}

void save_whole_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::string& dir,
                           const ParamStates& states) {
  const StateDictFiles files = whole_state_files(root, dir, states);
  write_state_dict_files(files.shards);
  write_state_dict_files(files.metadata);
}

void load_state_dict_rows(const std::shared_ptr<torch::nn::Module>& root, const std::map<std::string, at::Tensor>& state,
                          const ParamStates& states) {
  load_state_dict_rows(
      root,
      [&](const std::string& name) {
        auto it = state.find(name);
        return it == state.end() ? at::Tensor() : it->second;
      },
      states);
}

void load_state_dict_rows(const std::shared_ptr<torch::nn::Module>& root,
                          const std::function<at::Tensor(const std::string& name)>& entry_of,
                          const ParamStates& states) {
  const Layout layout = unit_impls_of(root).empty() ? whole_layout(root) : layout_of(root, "load_state_dict_rows");
  auto find = [&](const std::string& name, at::IntArrayRef shape) {
    at::Tensor t = entry_of(name);
    if (!t.defined()) throw std::invalid_argument("load_state_dict_rows: no entry for '" + name + "' of the model");
    check_shape(name, t.sizes(), shape, "load_state_dict_rows");
    return t;
  };
  EntrySource source;
  source.rows = [&](const std::string& name, const std::vector<int64_t>& shape, const at::Tensor& dst, int64_t first) {
    const at::Tensor whole = find(name, shape);
    const at::Tensor rows = shape.empty() ? whole.reshape({1}) : whole;
    const int64_t take = std::max<int64_t>(0, std::min(dst.size(0), rows.size(0) - first));
    if (take > 0) copy_rows(dst.narrow(0, 0, take), rows, first, 0);
  };
  source.whole = [&](const std::string& name, at::IntArrayRef shape) { return find(name, shape); };
  load_from(layout, states, source);
}

ShardedStateReader::ShardedStateReader(const std::string& dir) : dir_(dir) {
  const std::string meta_path = dir + "/metadata.pt";
  if (!io::path_exists(meta_path)) {
    throw std::runtime_error("read_sharded_state_dict: " + dir + " is not a complete sharded state dict (no metadata.pt)");
  }
  const int64_t count = entry(load_dict(meta_path, "sharded state dict's metadata"), "shard_count", meta_path).toInt();
  for (int64_t shard = 0; shard < count; ++shard) {
    const std::string path = shard_file(dir, shard, count);
    const auto file = load_dict(path, "sharded state dict");
    const auto shapes = entry(file, "shapes", path).toGenericDict();
    const auto first_rows = entry(file, "first_rows", path).toGenericDict();
    for (const auto& item : entry(file, "tensors", path).toGenericDict()) {
      const std::string name = item.key().toStringRef();
      Entry& e = entries_[name];
      if (e.pieces.empty()) e.shape = io::int_vector(shapes.at(name), path + ": shape of " + name);
      e.pieces.push_back({item.value().toTensor(), first_rows.at(name).toInt()});
    }
  }
  for (const auto& [name, e] : entries_) names_.push_back(name);
}

at::Tensor ShardedStateReader::whole(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw std::invalid_argument(dir_ + ": no entry '" + name + "'");
  const Entry& e = it->second;
  at::Tensor out = at::zeros(e.shape, e.pieces.front().rows.options());
  const at::Tensor rows = e.shape.empty() ? out.view({1}) : out;
  const int64_t row_numel = rows.size(0) > 0 ? rows.numel() / rows.size(0) : 0;
  for (const Piece& piece : e.pieces) {
    if (piece.rows.numel() == 0) continue;
    copy_rows(rows.narrow(0, piece.first, piece.rows.numel() / row_numel), piece.rows, piece.first, piece.first);
  }
  return out;
}

std::map<std::string, at::Tensor> read_sharded_state_dict(const std::string& dir) {
  const ShardedStateReader reader(dir);
  std::map<std::string, at::Tensor> full;
  for (const std::string& name : reader.names()) full[name] = reader.whole(name);
  return full;
}

std::map<std::string, at::Tensor> full_state_dict(const std::shared_ptr<torch::nn::Module>& root, bool rank0_only) {
  const Layout layout = layout_of(root, "full_state_dict");
  const bool keep = !rank0_only || (layout.writer && layout.shard_group->rank() == 0);
  std::map<std::string, at::Tensor> state;
  for (const auto& unit : layout.units) {
    std::vector<at::Tensor> values = unit->gather_full_values();  // collective: every rank takes part
    if (!keep) continue;
    for (size_t i = 0; i < values.size(); ++i) state[layout.name_of(unit->params[i])] = values[i].to(at::kCPU);
  }
  if (keep) {
    for (const auto& [name, t] : layout.whole) {
      state[name] = t.detach().to(at::kCPU);
    }
  }
  return state;
}

void save_full_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::string& path) {
  const Layout layout = layout_of(root, "save_full_state_dict");
  std::map<std::string, at::Tensor> state = full_state_dict(root, /*rank0_only=*/true);
  if (layout.writer && layout.shard_group->rank() == 0) {
    c10::Dict<std::string, at::Tensor> dict;
    for (auto& [name, t] : state) dict.insert(name, t);
    const size_t slash = path.rfind('/');
    if (slash != std::string::npos && slash > 0) io::make_directories(path.substr(0, slash));
    io::save_pickle(path, dict);
  }
  layout.barrier();  // the file exists on return, on every rank
}

void load_full_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::string& path) {
  // Ours, or Python's torch.save(model.state_dict()) (an OrderedDict with _metadata, zip or legacy format): the
  // restricted reader takes both, where LibTorch's unpickler cannot read Python's.
  std::map<std::string, at::Tensor> state;
  for (auto& [name, t] : io::load_torch_state_dict(path)) state[name] = std::move(t);
  load_full_state_dict(root, state);
}

void load_full_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::map<std::string, at::Tensor>& state) {
  const Layout layout = layout_of(root, "load_full_state_dict");
  std::set<std::string> expected;
  auto find = [&](const std::string& name) -> const at::Tensor& {
    auto it = state.find(name);
    if (it == state.end()) throw std::invalid_argument("load_full_state_dict: missing '" + name + "'");
    expected.insert(name);
    return it->second;
  };
  c10::AutoGradMode no_grad(false);
  for (const auto& unit : layout.units) {
    for (const auto& p : unit->params) {
      const std::string& name = layout.name_of(p);
      const at::Tensor& full = find(name);
      check_shape(name, full.sizes(), p.declared_shape(), "load_full_state_dict");
      const at::Tensor dst = p.real_shard();
      copy_rows(dst, full, p.shard_first_row(), 0);
    }
  }
  for (const auto& [name, t] : layout.whole) {
    const at::Tensor& full = find(name);
    check_shape(name, full.sizes(), t.sizes(), "load_full_state_dict");
    t.detach().copy_(full);
  }
  for (const auto& [name, t] : state) {
    if (!expected.count(name)) throw std::invalid_argument("load_full_state_dict: unexpected '" + name + "', not in the model");
  }
}

namespace {

// Each parameter (unit by unit) and buffer of the layout as a slot, with the tensor its rows are written to: the
// real rows of a parameter's shard, or the whole buffer.
void for_each_slot(const Layout& layout, const std::function<void(const RowSlot&, const at::Tensor& dst)>& fn) {
  for (const auto& unit : layout.units) {
    for (const auto& p : unit->params) {
      fn(RowSlot{layout.name_of(p), p.declared_shape(), p.shard_first_row(), p.shard_real_rows(), p.param()},
         p.real_shard());
    }
  }
  for (const auto& [name, t] : layout.whole) {
    fn(RowSlot{name, t.sizes().vec(), 0, t.dim() == 0 ? 1 : t.size(0), t}, t.detach());
  }
}

}  // namespace

std::vector<RowSlot> row_slots(const std::shared_ptr<torch::nn::Module>& root) {
  std::vector<RowSlot> slots;
  for_each_slot(layout_of(root, "row_slots"), [&](const RowSlot& slot, const at::Tensor&) { slots.push_back(slot); });
  return slots;
}

void load_rows(const std::shared_ptr<torch::nn::Module>& root, const std::function<at::Tensor(const RowSlot&)>& rows_of) {
  c10::AutoGradMode no_grad(false);
  for_each_slot(layout_of(root, "load_rows"), [&](const RowSlot& slot, const at::Tensor& dst) {
    const at::Tensor rows = rows_of(slot);
    if (!rows.defined()) return;  // kept as it is
    if (rows.numel() != dst.numel()) {
      throw std::invalid_argument("load_rows: '" + slot.name + "' rows [" + std::to_string(slot.first_row) + ", " +
                                  std::to_string(slot.first_row + slot.rows) + ") came with " +
                                  std::to_string(rows.numel()) + " elements, expected " + std::to_string(dst.numel()));
    }
    if (dst.numel() > 0) dst.copy_(rows.reshape(dst.sizes()));
  });
}

}  // namespace shardtrain::fsdp
