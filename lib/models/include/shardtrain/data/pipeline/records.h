// Records of the table and JSON-lines formats a text source reads (data/pipeline/source.h): one record per line.
//   .tsv  fields split at tabs, no quoting (GLUE's files: MRPC's sentences hold unbalanced quotes)
//   .csv  fields split at commas, RFC 4180 quoting within the line ("a, b" is one field, "" a quote)
//   .conll  CoNLL-2003's columns (token classification): a word per line, its fields split at spaces or tabs (the
//         word first, its tag last: "EU NNP B-NP B-ORG"), sentences apart by blank lines, -DOCSTART- lines
//         between documents; a sentence is a record. A .txt file read for token classification is read so too
//         (CoNLL-2003's own files are train.txt, valid.txt, test.txt).
//   .arrow, .parquet  not lines: tables (Hugging Face datasets'), a row per record (data/pipeline/table_records.h)
// Both start with a header row naming the columns.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardtrain::data {

struct RawSample;

enum class RecordFormat { TAR, TEXT_LINES, JSONL, TSV, CSV, ARROW, PARQUET, CONLL };

// The format of a file by its extension; TAR for anything else (the caller checks).
RecordFormat record_format_of(const std::string& path);

// The fields of one line (a trailing '\r' dropped). Throws std::runtime_error for a CSV quote left open.
std::vector<std::string> split_record(const std::string& line, RecordFormat format);

// A CoNLL sentence's words and tags (see above; `sentence` its lines, '\n' apart, a trailing '\r' on each left out):
// each line's first and last fields. Throws std::runtime_error naming `key` and the line (from `first_line`) for a
// line of one field.
void conll_words(const std::string& sentence, const std::string& key, int64_t first_line,
                 std::vector<std::string>& words, std::vector<std::string>& tags);
// A CoNLL line's word and tag: its first and last fields (split at spaces and tabs, a trailing '\r' left out);
// false for a line of fewer than two fields.
bool conll_line(const std::string& line, std::string& word, std::string& tag);
// Whether a line ends a CoNLL sentence: blank (spaces, tabs, '\r'), or -DOCSTART- (a document's start).
bool conll_separator(const std::string& line);

// The class id of a label value: its position in `classes` when it is one of them, else the value itself when it is
// a whole number below classes.size() (GLUE's 0/1), or any whole number when there are no classes. -1 otherwise.
int64_t class_of(const std::string& value, const std::vector<std::string>& classes);
// Why class_of gave -1, for an error that names the sample: "label 'x' is not one of the classes [a, b] ...".
std::string not_a_class(const std::string& value, const std::vector<std::string>& classes);
// The class ids of `values` (class_of each), in order. Throws std::runtime_error "<key>: label 'x' is not one of
// the classes ..." for a value that is none.
std::vector<int64_t> class_ids(const std::vector<std::string>& values, const std::vector<std::string>& classes,
                               const std::string& key);
// A .tsv/.csv field listing classes ("2,15", go_emotions'): the items between commas, spaces around each left out,
// empty ones dropped.
std::vector<std::string> listed_values(const std::string& field);
// A multi-label sample's class ids as its set: ascending, each once.
std::vector<int64_t> as_label_set(std::vector<int64_t> ids);
// A regression label: `value` whole as a finite decimal number ("3.8", "4", "-1e-3"); nullopt otherwise.
std::optional<double> score_of(const std::string& value);
// score_of(value), or std::runtime_error "<prefix>label 'x' is not a number (a regression's score ...)" (prefix
// names the sample: "corpus.tsv:3: ").
double checked_score(const std::string& value, const std::string& prefix);

// The fields a record's text is read from: `text` as configured, except that the default ["text"] stands for
// ["input_ids"] in a record with no "text" but token ids in "input_ids" (a tokenized dataset).
std::vector<std::string> text_field_names(const std::vector<std::string>& text, bool has_text, bool has_input_ids);

// A tokenized record's lists into s (RawSample::tokenized): the ids whose attention_mask is not 0 (all when `mask`
// is empty) and their token types (none when `types` is empty); a pair's second ids without transformers' ignored
// label -100. Throws std::runtime_error naming s.key for types or a mask of another length than the ids (named
// `types_name`, `mask_name`), or no ids at all.
void set_tokens(RawSample& s, const std::vector<int64_t>& ids, const std::vector<int64_t>& types,
                const std::vector<int64_t>& mask, const std::string& types_name, const std::string& mask_name,
                const std::vector<int64_t>& pair_ids = {});

}  // namespace shardtrain::data
