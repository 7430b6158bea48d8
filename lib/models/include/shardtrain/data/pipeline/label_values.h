// The classes of a classifier trained on text records without a ClassLabel, collected from the records as
// transformers' run_glue, run_classification and run_ner collect them (`sorted(set(labels))`, or the dtype's verdict
// of a regression), so that data.labels may be left out for .jsonl, .tsv/.csv and CoNLL files too.
#pragma once

#include <string>
#include <vector>

namespace shardtrain::data {

struct LabelValues {
  // The distinct labels, sorted: whole numbers by value, else as strings byte by byte (Python's sorted() of str).
  std::vector<std::string> names;
  // Every label is a number and one is not whole (STS-B's 3.8): a regression's scores, not classes (run_glue's
  // rule for a float column); `names` is then empty.
  bool scores = false;
  // A .jsonl record held its labels as an array (sets of classes for a sequence classifier, as run_classification
  // decides from a list column).
  bool lists = false;
};

// The labels of `files` (data::expand_paths'): `field` of each .jsonl record (a string or number, or an array of
// them: sets of classes, or one per word), of each .tsv/.csv row (separated by commas when `sets`), the last column
// of each CoNLL line (.conll, and .txt when `words`). Tables and tars hold their own (a ClassLabel, .cls) and add
// nothing, nor does a line that cannot be parsed (the loader counts those). Throws std::invalid_argument naming a
// file that cannot be read.
LabelValues label_values(const std::vector<std::string>& files, const std::string& field, bool sets, bool words);

}  // namespace shardtrain::data
