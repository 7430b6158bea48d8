// Option parsing for the sub-commands: `--name value` or `--name=value`, flags without a value, positionals.
// An unknown option is an error that names it and the closest known one.
#pragma once

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardtrain/util/closest_match.h"

namespace shardtrain::cli {

// `text` as a whole number (strtod's syntax, nothing left over) into `out`; false when it is not one.
inline bool parse_number(const std::string& text, double& out) {
  try {
    size_t used = 0;
    out = std::stod(text, &used);
    return used == text.size();
  } catch (const std::exception&) {
    return false;
  }
}

struct Args {
  std::map<std::string, std::string> values;
  std::set<std::string> flags;
  std::vector<std::string> positionals;

  bool has(const std::string& name) const { return values.count(name) || flags.count(name); }
  std::string get(const std::string& name, const std::string& fallback) const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
  int64_t get_int(const std::string& name, int64_t fallback) const {
    auto it = values.find(name);
    if (it == values.end()) return fallback;
    try {
      size_t used = 0;
      const long long v = std::stoll(it->second, &used);
      if (used == it->second.size()) return v;
    } catch (const std::exception&) {
    }
    throw std::invalid_argument("--" + name + ": '" + it->second + "' is not an integer");
  }
  double get_double(const std::string& name, double fallback) const {
    auto it = values.find(name);
    if (it == values.end()) return fallback;
    double v = 0;
    if (parse_number(it->second, v)) return v;
    throw std::invalid_argument("--" + name + ": '" + it->second + "' is not a number");
  }
};

// `with_value`: options that take a value; `flags`: options that do not. "--" ends the options.
inline Args parse_args(const std::vector<std::string>& argv, const std::vector<std::string>& with_value,
                       const std::vector<std::string>& flags) {
  Args args;
  std::vector<std::string> known = with_value;
  known.insert(known.end(), flags.begin(), flags.end());
  auto is_in = [](const std::vector<std::string>& v, const std::string& s) {
    for (const auto& x : v) {
      if (x == s) return true;
    }
    return false;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--") {
      args.positionals.insert(args.positionals.end(), argv.begin() + static_cast<long>(i) + 1, argv.end());
      break;
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      args.positionals.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const auto eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) value = name.substr(eq + 1), name = name.substr(0, eq);
    if (is_in(flags, name) && !inline_value) {
      args.flags.insert(name);
    } else if (is_in(with_value, name)) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) throw std::invalid_argument("--" + name + " needs a value");
        value = argv[++i];
      }
      args.values[name] = value;
    } else {
      throw std::invalid_argument("unknown option --" + name +
                                  (known.empty() ? "" : "; did you mean --" + util::closest_match(name, known) + "?"));
    }
  }
  return args;
}

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  for (char c : s + ",") {
    if (c != ',') {
      item += c;
    } else if (!item.empty()) {
      out.push_back(item), item.clear();
    }
  }
  return out;
}

// A trainer config's overrides among argv[from, end): `--section.key=value` or `--section.key value`; the flags a
// command takes besides (`flags`, e.g. --dry-run) go into `given`. Throws std::invalid_argument naming an argument
// that is neither.
inline std::vector<std::string> config_overrides(const std::vector<std::string>& argv, size_t from,
                                                 const std::set<std::string>& flags = {},
                                                 std::set<std::string>* given = nullptr) {
  std::vector<std::string> overrides;
  for (size_t i = from; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (flags.count(a)) {
      if (given) given->insert(a);
    } else if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      overrides.push_back(a);
    } else if (a.rfind("--", 0) == 0 && i + 1 < argv.size()) {  // --key value
      overrides.push_back(a + "=" + argv[i + 1]);
      ++i;
    } else {
      throw std::invalid_argument("unexpected argument '" + a + "' (expected --section.key=value)");
    }
  }
  return overrides;
}

}  // namespace shardtrain::cli
