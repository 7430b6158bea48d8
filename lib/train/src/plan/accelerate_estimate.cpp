#include "shardtrain/plan/accelerate_estimate.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <regex>
#include <set>
#include <stdexcept>

namespace shardtrain::plan {

namespace {

// Every module of a layout, by name ("" the root): its bytes (every tensor below it) and its child modules.
struct ModuleTree {
  std::map<std::string, int64_t> bytes;
  std::map<std::string, std::vector<std::string>> children;  // in the order the layout names them
  std::vector<std::string> root_tensors;                     // tensors held by the root itself
};

std::string parent_of(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}

ModuleTree tree_of(const models::HfModelLayout& layout) {
  ModuleTree t;
  std::set<std::string> linked;
  for (const auto& tensor : layout.tensors) {
    int64_t numel = 1;
    for (int64_t d : tensor.shape) numel *= d;
    const int64_t size = numel * static_cast<int64_t>(c10::elementSize(tensor.dtype));
    t.bytes[tensor.name] += size;
    if (tensor.name.find('.') == std::string::npos) t.root_tensors.push_back(tensor.name);
    // Each proper prefix is a module: add the size, and link it to its parent once.
    for (std::string m = parent_of(tensor.name);; m = parent_of(m)) {
      t.bytes[m] += size;
      if (m.empty()) break;
      if (linked.insert(m).second) t.children[parent_of(m)].push_back(m);
    }
  }
  return t;
}

// Python's str.center: the extra space of an odd margin goes left when the width is odd.
std::string centered(const std::string& text, size_t width, size_t length) {
  if (width <= length) return text;
  const size_t margin = width - length, left = margin / 2 + (margin & width & 1);
  return std::string(left, ' ') + text + std::string(margin - left, ' ');
}

// Code points of a UTF-8 string (Python's len).
size_t code_points(const std::string& s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

std::string repeated(const std::string& s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

double divisor_of(const std::string& dtype) {
  if (dtype == "float16" || dtype == "bfloat16") return 2;
  if (dtype == "int8") return 4;
  if (dtype == "int4") return 8;
  return 1;
}

}  // namespace

ModelSizes accelerate_sizes(const models::HfModelLayout& layout) {
  const ModuleTree tree = tree_of(layout);
  std::vector<std::regex> no_split;
  for (const auto& r : layout.no_split) no_split.emplace_back(r);
  auto kept_whole = [&](const std::string& name) {
    return std::any_of(no_split.begin(), no_split.end(), [&](const std::regex& r) { return std::regex_match(name, r); });
  };
  auto children_of = [&](const std::string& name) {
    const auto it = tree.children.find(name);
    return it == tree.children.end() ? std::vector<std::string>{} : it->second;
  };

  ModelSizes out;
  out.total_bytes = tree.bytes.count("") ? tree.bytes.at("") : 0;
  // The root's own tensors and its child modules, as Accelerate lists them (parameters, children, buffers: the
  // order only decides the order of equal-sized names).
  std::deque<std::string> queue(tree.root_tensors.begin(), tree.root_tensors.end());
  for (const auto& c : children_of("")) queue.push_back(c);
  while (!queue.empty()) {
    const std::string name = queue.front();
    queue.pop_front();
    const auto children = children_of(name);
    if (children.empty() || kept_whole(name)) {
      const int64_t size = tree.bytes.at(name);
      if (size > out.largest_layer_bytes) {
        out.largest_layer_bytes = size;
        out.largest_layers = {name};
      } else if (size == out.largest_layer_bytes) {
        out.largest_layers.push_back(name);
      }
    } else {
      queue.insert(queue.begin(), children.begin(), children.end());
    }
  }
  return out;
}

const std::vector<std::string>& accelerate_dtypes() {
  static const std::vector<std::string> dtypes = {"float32", "float16", "bfloat16", "int8", "int4"};
  return dtypes;
}

void check_accelerate_dtype(const std::string& dtype) {
  const auto& known = accelerate_dtypes();
  if (std::find(known.begin(), known.end(), dtype) != known.end()) return;
  std::string list;
  for (const auto& d : known) list += (list.empty() ? "" : ", ") + d;
  throw std::invalid_argument("unknown dtype '" + dtype + "' (expected one of " + list + ")");
}

int64_t AdamStages::highest() const { return std::max({model, gradients, optimizer, step}); }

std::optional<AdamStages> accelerate_training_usage(int64_t bytes, const std::string& dtype) {
  check_accelerate_dtype(dtype);
  if (dtype == "float32") return AdamStages{bytes, bytes, 2 * bytes, 4 * bytes};
  if (dtype == "float16" || dtype == "bfloat16") return AdamStages{bytes, bytes + bytes / 2, 2 * bytes, 2 * bytes};
  return std::nullopt;
}

std::string accelerate_bytes(double bytes, bool integral) {
  // round(x, 2) and repr: two decimals, correctly rounded, then trailing zeros dropped down to one.
  auto decimals = [](double x) {
    char text[64];
    std::snprintf(text, sizeof text, "%.2f", x);
    std::string s = text;
    while (s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
    return s;
  };
  for (const char* unit : {"bytes", "KB", "MB", "GB", "TB"}) {
    if (bytes < 1024.0) {
      return (integral ? std::to_string(static_cast<int64_t>(bytes)) : decimals(bytes)) + " " + unit;
    }
    bytes /= 1024.0;
    integral = false;
  }
  return decimals(bytes) + " PB";
}

std::string ascii_table(const std::vector<std::string>& headers, const std::vector<std::vector<std::string>>& rows,
                        const std::string& title) {
  const std::string sep = "│", line = "─";
  std::vector<size_t> widths;
  for (size_t i = 0; i < headers.size(); ++i) {
    size_t w = code_points(headers[i]);
    for (const auto& row : rows) w = std::max(w, code_points(row.at(i)));
    widths.push_back(w);
  }
  const std::vector<size_t> formats = widths;  // the %Ns patterns keep the widths before any widening
  size_t diff = 0;
  auto make_row = [&](const std::string& left, const std::string& middle, const std::string& right) {
    std::string out = left;
    for (size_t i = 0; i < widths.size(); ++i) out += (i ? middle : "") + repeated(line, widths[i]);
    return out + repeated(line, diff) + right;
  };
  auto row_length = [&] {  // code points of make_row's result
    size_t n = 2 + diff + (widths.size() - 1);
    for (size_t w : widths) n += w;
    return n;
  };
  size_t total = 0;
  for (size_t w : widths) total += w;
  if (code_points(title) > total) {
    const size_t separator = row_length();
    diff = code_points(title) > separator ? code_points(title) - separator : separator - code_points(title);
    widths.back() += diff;
  }
  const std::string separator = make_row("├", "┼", "┤");
  const size_t separator_length = row_length();
  std::string out = make_row("┌", line, "┐") + "\n";
  out += sep + centered(title, separator_length - 2, code_points(title)) + sep + "\n";
  out += make_row("├", "┬", "┤") + "\n";
  widths.back() += diff;
  auto pattern = [&](const std::vector<std::string>& cells) {
    std::string s = sep;
    for (size_t i = 0; i < cells.size(); ++i) {
      std::string cell = centered(cells[i], widths[i], code_points(cells[i]));
      const size_t n = code_points(cell);
      if (n < formats[i]) cell = std::string(formats[i] - n, ' ') + cell;
      s += (i ? sep : "") + cell;
    }
    return s + sep;
  };
  out += pattern(headers) + "\n" + separator + "\n";
  for (const auto& row : rows) out += pattern(row) + "\n";
  out += "└";
  for (size_t i = 0; i < widths.size(); ++i) out += (i ? "┴" : "") + repeated(line, widths[i]);
  return out + "┘";
}

std::string accelerate_table(const std::string& model, const ModelSizes& sizes,
                             const std::vector<std::string>& dtypes) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& dtype : dtypes) {
    check_accelerate_dtype(dtype);
    const double divisor = divisor_of(dtype);
    const bool integral = divisor == 1;  // Python keeps an int until it is divided
    const auto usage = accelerate_training_usage(sizes.total_bytes, dtype);
    rows.push_back({dtype, accelerate_bytes(static_cast<double>(sizes.largest_layer_bytes) / divisor, integral),
                    accelerate_bytes(static_cast<double>(sizes.total_bytes) / divisor, integral),
                    usage ? accelerate_bytes(static_cast<double>(usage->highest()), true) : "N/A"});
  }
  return ascii_table({"dtype", "Largest Layer", "Total Size", "Training using Adam"}, rows,
                     "Memory Usage for loading `" + model + "`");
}

std::string adam_stages_table(const std::string& model, const ModelSizes& sizes,
                              const std::vector<std::string>& dtypes) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& dtype : dtypes) {
    const auto usage = accelerate_training_usage(sizes.total_bytes, dtype);
    if (!usage) continue;
    auto b = [](int64_t v) { return accelerate_bytes(static_cast<double>(v), true); };
    rows.push_back({dtype, b(usage->model), b(usage->gradients), b(usage->optimizer), b(usage->step),
                    b(usage->highest())});
  }
  if (rows.empty()) return "";
  return ascii_table({"dtype", "Model", "Gradients", "Backward pass", "Optimizer step", "Highest"}, rows,
                     "Training using Adam, by stage: `" + model + "`");
}

}  // namespace shardtrain::plan
