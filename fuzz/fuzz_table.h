// What the table fuzz targets share (fuzz_arrow, fuzz_parquet): every value of every column of an opened table read
// as each kind (numbers, lists of whole numbers and lists of strings too). A column of another kind, or data found
// damaged when read, throws std::runtime_error; anything else (a crash, a sanitizer report, another exception) is a
// finding.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "shardtrain/data/formats/column_table.h"

namespace shardtrain::fuzz {

inline void read_every_value(const data::ColumnTable& table) {
  (void)table.metadata("huggingface");
  for (size_t c = 0; c < table.columns().size(); ++c) {
    for (int64_t row = 0; row < table.rows() && row < 4096; ++row) {
      try {
        (void)table.is_null(static_cast<int>(c), row);
        (void)table.bytes(static_cast<int>(c), row);
      } catch (const std::runtime_error&) {
      }
      try {
        (void)table.integer(static_cast<int>(c), row);
      } catch (const std::runtime_error&) {
      }
      try {
        (void)table.number(static_cast<int>(c), row);
      } catch (const std::runtime_error&) {
      }
      try {
        (void)table.integers(static_cast<int>(c), row);
      } catch (const std::runtime_error&) {
      }
      try {
        (void)table.strings(static_cast<int>(c), row);
      } catch (const std::runtime_error&) {
      }
    }
  }
}

}  // namespace shardtrain::fuzz
