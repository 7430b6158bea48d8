// A Hugging Face config.json (or one of its sub-configs: FLAVA's text_config), read key by key with the errors a
// user needs: the file, the key, its value, and what was expected. Private to the models layer; each family's
// recipe file turns one into its config (from_hf in the zoo's table).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::models {

class HfConfig {
 public:
  // `path` is a config.json or a directory holding one. Throws std::invalid_argument naming the path when it is
  // neither, or when the file is not a JSON object.
  static HfConfig read(const std::string& path);
  static HfConfig parse(const std::string& text, const std::string& where);  // `where` names it in errors

  const std::string& where() const { return where_; }  // "dir/config.json", "dir/config.json: text_config"

  bool has(const std::string& key) const;  // present and not null
  // The value of `key`, or `fallback` when it is absent or null. Throws naming the key when it has another type.
  int64_t integer(const std::string& key, int64_t fallback) const;
  double number(const std::string& key, double fallback) const;
  std::string text(const std::string& key, const std::string& fallback) const;
  bool flag(const std::string& key, bool fallback) const;
  std::vector<std::string> texts(const std::string& key) const;  // a list of strings (architectures); {} if absent
  int64_t entries(const std::string& key) const;                 // entries of an object or list (id2label); 0 if absent
  // An object of names by id ({"0": "negative", "1": "positive"}: id2label) as a list by id; {} if absent. Throws
  // naming the key unless its keys are "0" to "N-1" and its values strings.
  std::vector<std::string> labels(const std::string& key) const;
  HfConfig section(const std::string& key) const;                // a sub-config; an empty one when absent

  // Throws std::invalid_argument unless `key` is absent, null, or (as text: strings as they are, true/false,
  // numbers as JSON writes them) one of `supported`; the error names `family` and what it implements.
  void require(const std::string& key, const std::vector<std::string>& supported, const std::string& family) const;
  // Throws std::invalid_argument: "<where>: '<key>' is <value>; <why>".
  [[noreturn]] void reject(const std::string& key, const std::string& why) const;

 private:
  HfConfig(std::string where, std::shared_ptr<const nlohmann::json> json);
  std::string value_text(const std::string& key) const;
  std::string where_;
  std::shared_ptr<const nlohmann::json> json_;  // an object
};

// A classifier's classes into a config.json being written (`config`: a JSON object): id2label and label2id, and
// problem_type where transformers would not infer it — "regression" for one output, "multi_label_classification"
// for sets of classes.
void hf_put_labels(nlohmann::json& config, const std::vector<std::string>& labels, bool multi_label);

}  // namespace shardtrain::models
