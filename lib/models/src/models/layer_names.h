// Name rules shared by the families: how a TransformerLayer's parameters are called in Hugging Face's modules.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace shardtrain::models {

using NameRules = std::vector<std::pair<std::string, std::string>>;

inline std::string regex_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string(".^$|()[]{}*+?\\").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

// For every (our sub-path, Hugging Face sub-path) of a layer: "<ours>.N.<sub>.x" -> "<hf>.N.<hf_sub>.x".
inline NameRules layer_rules(const std::string& ours, const std::string& hf, const NameRules& subpaths) {
  NameRules rules;
  for (const auto& [sub, hf_sub] : subpaths) {
    rules.emplace_back("^" + regex_escape(ours) + "\\.(\\d+)\\." + regex_escape(sub) + "\\.(.*)$",
                       hf + ".$1." + hf_sub + ".$2");
  }
  return rules;
}

// A module's parameters moved under another prefix: "<ours>.x" -> "<hf>.x".
inline std::pair<std::string, std::string> prefix_rule(const std::string& ours, const std::string& hf) {
  return {"^" + regex_escape(ours) + "\\.(.*)$", hf + ".$1"};
}

// The sub-paths of the ViT-style pre-norm layer (ViT, FLAVA's three encoders).
inline const NameRules& vit_layer_subpaths() {
  static const NameRules subpaths = {
      {"attn.q", "attention.attention.query"}, {"attn.k", "attention.attention.key"},
      {"attn.v", "attention.attention.value"}, {"attn.o", "attention.output.dense"},
      {"norm1", "layernorm_before"},           {"norm2", "layernorm_after"},
      {"mlp.fc1", "intermediate.dense"},       {"mlp.fc2", "output.dense"}};
  return subpaths;
}

inline void append(NameRules& to, const NameRules& from) { to.insert(to.end(), from.begin(), from.end()); }

}  // namespace shardtrain::models
