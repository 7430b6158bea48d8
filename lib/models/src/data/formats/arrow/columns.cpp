#include "data/formats/arrow/columns.h"

#include <arrow/util/float16.h>

#include <algorithm>
#include <stdexcept>

namespace shardtrain::data {
namespace {

// Which of the ColumnTable's kinds an Arrow type is read as; a dictionary column as its values.
ColumnKind kind_of(const arrow::DataType& type) {
  switch (type.id()) {
    case arrow::Type::NA: return ColumnKind::NULL_TYPE;
    case arrow::Type::BOOL: return ColumnKind::BOOL;
    case arrow::Type::INT8: case arrow::Type::INT16: case arrow::Type::INT32: case arrow::Type::INT64:
    case arrow::Type::UINT8: case arrow::Type::UINT16: case arrow::Type::UINT32: case arrow::Type::UINT64:
      return ColumnKind::INT;
    case arrow::Type::HALF_FLOAT: case arrow::Type::FLOAT: case arrow::Type::DOUBLE: return ColumnKind::FLOAT;
    case arrow::Type::STRING: case arrow::Type::LARGE_STRING: case arrow::Type::STRING_VIEW: return ColumnKind::UTF8;
    case arrow::Type::BINARY: case arrow::Type::LARGE_BINARY: case arrow::Type::BINARY_VIEW:
    case arrow::Type::FIXED_SIZE_BINARY:
      return ColumnKind::BINARY;
    case arrow::Type::STRUCT: return ColumnKind::STRUCT;
    case arrow::Type::LIST: case arrow::Type::LARGE_LIST: case arrow::Type::FIXED_SIZE_LIST:
    case arrow::Type::LIST_VIEW: case arrow::Type::LARGE_LIST_VIEW:
      return ColumnKind::LIST;
    case arrow::Type::DICTIONARY:
      return kind_of(*static_cast<const arrow::DictionaryType&>(type).value_type());
    default: return ColumnKind::OTHER;
  }
}

// A type as pyarrow names it, without its parameters: "int64", "large_string", "float32", "list", "struct",
// "timestamp"; a dictionary column by its values' type.
std::string type_name(const arrow::DataType& type) {
  switch (type.id()) {
    case arrow::Type::HALF_FLOAT: return "float16";
    case arrow::Type::FLOAT: return "float32";
    case arrow::Type::DOUBLE: return "float64";
    case arrow::Type::DICTIONARY: return type_name(*static_cast<const arrow::DictionaryType&>(type).value_type());
    default: {
      const std::string full = type.ToString();
      return full.substr(0, full.find_first_of("[<"));
    }
  }
}

std::string_view binary_at(const arrow::Array& a, int64_t i) {
  switch (a.type_id()) {
    case arrow::Type::STRING: case arrow::Type::BINARY:
      return static_cast<const arrow::BinaryArray&>(a).GetView(i);
    case arrow::Type::LARGE_STRING: case arrow::Type::LARGE_BINARY:
      return static_cast<const arrow::LargeBinaryArray&>(a).GetView(i);
    case arrow::Type::STRING_VIEW: case arrow::Type::BINARY_VIEW:
      return static_cast<const arrow::BinaryViewArray&>(a).GetView(i);
    case arrow::Type::FIXED_SIZE_BINARY:
      return static_cast<const arrow::FixedSizeBinaryArray&>(a).GetView(i);
    default: throw std::logic_error("binary_at: " + a.type()->ToString());
  }
}

template <typename T>
int64_t numeric_at(const arrow::Array& a, int64_t i) {
  return static_cast<int64_t>(static_cast<const arrow::NumericArray<T>&>(a).Value(i));
}

int64_t whole_at(const arrow::Array& a, int64_t i) {
  switch (a.type_id()) {
    case arrow::Type::BOOL: return static_cast<const arrow::BooleanArray&>(a).Value(i) ? 1 : 0;
    case arrow::Type::INT8: return numeric_at<arrow::Int8Type>(a, i);
    case arrow::Type::INT16: return numeric_at<arrow::Int16Type>(a, i);
    case arrow::Type::INT32: return numeric_at<arrow::Int32Type>(a, i);
    case arrow::Type::INT64: return numeric_at<arrow::Int64Type>(a, i);
    case arrow::Type::UINT8: return numeric_at<arrow::UInt8Type>(a, i);
    case arrow::Type::UINT16: return numeric_at<arrow::UInt16Type>(a, i);
    case arrow::Type::UINT32: return numeric_at<arrow::UInt32Type>(a, i);
    case arrow::Type::UINT64: return numeric_at<arrow::UInt64Type>(a, i);
    default: throw std::logic_error("whole_at: " + a.type()->ToString());
  }
}

template <typename T>
void append_numeric(const arrow::Array& a, int64_t begin, int64_t end, std::vector<int64_t>& out) {
  const auto* values = static_cast<const arrow::NumericArray<T>&>(a).raw_values();
  for (int64_t i = begin; i < end; ++i) out.push_back(static_cast<int64_t>(values[i]));
}

// whole_at of items [begin, end), the type looked at once (a tokenized row: hundreds of ids).
void append_wholes(const arrow::Array& a, int64_t begin, int64_t end, std::vector<int64_t>& out) {
  switch (a.type_id()) {
    case arrow::Type::INT8: return append_numeric<arrow::Int8Type>(a, begin, end, out);
    case arrow::Type::INT16: return append_numeric<arrow::Int16Type>(a, begin, end, out);
    case arrow::Type::INT32: return append_numeric<arrow::Int32Type>(a, begin, end, out);
    case arrow::Type::INT64: return append_numeric<arrow::Int64Type>(a, begin, end, out);
    case arrow::Type::UINT8: return append_numeric<arrow::UInt8Type>(a, begin, end, out);
    case arrow::Type::UINT16: return append_numeric<arrow::UInt16Type>(a, begin, end, out);
    case arrow::Type::UINT32: return append_numeric<arrow::UInt32Type>(a, begin, end, out);
    default:
      for (int64_t i = begin; i < end; ++i) out.push_back(whole_at(a, i));
  }
}

double float_at(const arrow::Array& a, int64_t i) {
  switch (a.type_id()) {
    case arrow::Type::HALF_FLOAT:
      return arrow::util::Float16::FromBits(static_cast<const arrow::HalfFloatArray&>(a).Value(i)).ToDouble();
    case arrow::Type::FLOAT: return static_cast<const arrow::FloatArray&>(a).Value(i);
    case arrow::Type::DOUBLE: return static_cast<const arrow::DoubleArray&>(a).Value(i);
    default: throw std::logic_error("float_at: " + a.type()->ToString());
  }
}

template <typename List>
std::pair<int64_t, int64_t> range_in(const arrow::Array& a, int64_t i) {
  const auto& l = static_cast<const List&>(a);
  return {l.value_offset(i), l.value_offset(i) + l.value_length(i)};
}

// The items of list row `i`: [begin, end) in the list's values array.
std::pair<int64_t, int64_t> item_range(const arrow::Array& a, int64_t i) {
  switch (a.type_id()) {
    case arrow::Type::LIST: return range_in<arrow::ListArray>(a, i);
    case arrow::Type::LARGE_LIST: return range_in<arrow::LargeListArray>(a, i);
    case arrow::Type::FIXED_SIZE_LIST: return range_in<arrow::FixedSizeListArray>(a, i);
    case arrow::Type::LIST_VIEW: return range_in<arrow::ListViewArray>(a, i);
    case arrow::Type::LARGE_LIST_VIEW: return range_in<arrow::LargeListViewArray>(a, i);
    default: throw std::logic_error("item_range: " + a.type()->ToString());
  }
}

std::shared_ptr<arrow::Array> list_values(const arrow::Array& a) {
  switch (a.type_id()) {
    case arrow::Type::LIST: return static_cast<const arrow::ListArray&>(a).values();
    case arrow::Type::LARGE_LIST: return static_cast<const arrow::LargeListArray&>(a).values();
    case arrow::Type::FIXED_SIZE_LIST: return static_cast<const arrow::FixedSizeListArray&>(a).values();
    case arrow::Type::LIST_VIEW: return static_cast<const arrow::ListViewArray&>(a).values();
    case arrow::Type::LARGE_LIST_VIEW: return static_cast<const arrow::LargeListViewArray&>(a).values();
    default: throw std::logic_error("list_values: " + a.type()->ToString());
  }
}

// A dictionary column's value `i`: where it is in the dictionary.
int64_t dictionary_index(const arrow::Array& a, int64_t i) {
  return static_cast<const arrow::DictionaryArray&>(a).GetValueIndex(i);
}

}  // namespace

ArrowColumns::ArrowColumns(const arrow::Schema& schema, std::string name, const arrow::RecordBatchVector& batches)
    : name_(std::move(name)), metadata_(schema.metadata()) {
  for (int f = 0; f < schema.num_fields(); ++f) {
    field_column_.push_back(static_cast<int>(columns_.size()));
    add_field(*schema.field(f), schema.field(f)->name(), -1, true);
  }
  for (const auto& batch : batches) {
    Batch b;
    b.first_row = rows_;
    b.arrays.resize(columns_.size());
    b.dictionaries.resize(columns_.size());
    for (int f = 0; f < batch->num_columns(); ++f) {
      const std::shared_ptr<arrow::Array>& array = batch->column(f);
      const arrow::Status valid = array->ValidateFull();
      if (!valid.ok()) {
        fail("column '" + columns_[static_cast<size_t>(field_column_[static_cast<size_t>(f)])].path +
             "' is damaged at rows " + std::to_string(rows_) + "-" + std::to_string(rows_ + batch->num_rows()) +
             ": " + valid.message());
      }
      fill(b, field_column_[static_cast<size_t>(f)], array);
    }
    if (batch->num_rows() == 0) continue;
    rows_ += batch->num_rows();
    batches_.push_back(std::move(b));
  }
}

void ArrowColumns::add_field(const arrow::Field& field, const std::string& path, int parent, bool per_row) {
  const int self = static_cast<int>(columns_.size());
  TableColumn c;
  c.path = path;
  c.kind = kind_of(*field.type());
  c.type = type_name(*field.type());
  c.parent = parent;
  c.per_row = per_row;
  columns_.push_back(c);
  children_.emplace_back();
  if (parent >= 0) children_[static_cast<size_t>(parent)].push_back(self);
  if (field.type()->id() == arrow::Type::DICTIONARY) return;
  const bool list = c.kind == ColumnKind::LIST;
  for (const auto& child : field.type()->fields()) {
    const int at = static_cast<int>(columns_.size());
    add_field(*child, path + "." + child->name(), self, per_row && !list);
    const ColumnKind item = columns_[static_cast<size_t>(at)].kind;
    if (list && item != ColumnKind::LIST && item != ColumnKind::STRUCT) columns_[static_cast<size_t>(self)].items = at;
  }
}

std::string ArrowColumns::metadata(const std::string& key) const {
  if (!metadata_) return "";
  const int at = metadata_->FindKey(key);
  return at < 0 ? "" : metadata_->value(at);
}

void ArrowColumns::fail(const std::string& what) const { throw std::runtime_error(name_ + ": " + what); }

void ArrowColumns::fill(Batch& batch, int column, const std::shared_ptr<arrow::Array>& array) const {
  batch.arrays[static_cast<size_t>(column)] = array;
  const std::vector<int>& children = children_[static_cast<size_t>(column)];
  switch (array->type_id()) {
    case arrow::Type::DICTIONARY:
      batch.dictionaries[static_cast<size_t>(column)] = static_cast<const arrow::DictionaryArray&>(*array).dictionary();
      break;
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(*array);
      for (size_t k = 0; k < children.size(); ++k) fill(batch, children[k], s.field(static_cast<int>(k)));
      break;
    }
    default:
      if (columns_[static_cast<size_t>(column)].kind == ColumnKind::LIST && !children.empty()) {
        fill(batch, children[0], list_values(*array));
      }
  }
}

const TableColumn& ArrowColumns::per_row(int column) const {
  if (column < 0 || static_cast<size_t>(column) >= columns_.size()) fail("no column " + std::to_string(column));
  const TableColumn& c = columns_[static_cast<size_t>(column)];
  if (!c.per_row) fail("column '" + c.path + "' holds a list's items, not a value per row");
  return c;
}

ArrowColumns::Cell ArrowColumns::cell(int column, int64_t row) const {
  per_row(column);
  if (row < 0 || row >= rows_) fail("row " + std::to_string(row) + " of " + std::to_string(rows_));
  Cell out;
  out.batch = &*(std::upper_bound(batches_.begin(), batches_.end(), row,
                                  [](int64_t r, const Batch& b) { return r < b.first_row; }) - 1);
  out.index = row - out.batch->first_row;
  for (int up = column; up >= 0 && !out.null; up = columns_[static_cast<size_t>(up)].parent) {
    out.null = out.batch->arrays[static_cast<size_t>(up)]->IsNull(out.index);
  }
  out.array = out.batch->arrays[static_cast<size_t>(column)].get();
  if (const auto& dictionary = out.batch->dictionaries[static_cast<size_t>(column)]; dictionary && !out.null) {
    out.index = dictionary_index(*out.array, out.index);
    out.array = dictionary.get();
    out.null = out.array->IsNull(out.index);
  }
  return out;
}

bool ArrowColumns::is_null(int column, int64_t row) const { return cell(column, row).null; }

std::string ArrowColumns::bytes(int column, int64_t row) const {
  const TableColumn& c = per_row(column);
  if (c.kind != ColumnKind::UTF8 && c.kind != ColumnKind::BINARY) {
    fail("column '" + c.path + "' holds " + c.type + ", not strings or bytes");
  }
  const Cell v = cell(column, row);
  return v.null ? std::string() : std::string(binary_at(*v.array, v.index));
}

int64_t ArrowColumns::integer(int column, int64_t row) const {
  const TableColumn& c = per_row(column);
  if (c.kind != ColumnKind::INT && c.kind != ColumnKind::BOOL) {
    fail("column '" + c.path + "' holds " + c.type + ", not whole numbers");
  }
  const Cell v = cell(column, row);
  return v.null ? 0 : whole_at(*v.array, v.index);
}

double ArrowColumns::number(int column, int64_t row) const {
  const TableColumn& c = per_row(column);
  if (c.kind == ColumnKind::INT || c.kind == ColumnKind::BOOL) return static_cast<double>(integer(column, row));
  if (c.kind != ColumnKind::FLOAT) fail("column '" + c.path + "' holds " + c.type + ", not numbers");
  const Cell v = cell(column, row);
  return v.null ? 0 : float_at(*v.array, v.index);
}

ArrowColumns::Items ArrowColumns::items(int column, int64_t row, bool whole_numbers) const {
  const TableColumn& c = per_row(column);
  const TableColumn* item = c.items >= 0 ? &columns_[static_cast<size_t>(c.items)] : nullptr;
  const bool readable = item && (whole_numbers ? item->kind == ColumnKind::INT || item->kind == ColumnKind::BOOL
                                               : item->kind == ColumnKind::UTF8);
  if (!readable) {
    fail("column '" + c.path + "' holds " + c.type + (item ? " of " + item->type : "") + ", not lists of " +
         (whole_numbers ? "whole numbers" : "strings"));
  }
  Items out;
  out.list = cell(column, row);
  if (out.list.null) return out;
  std::tie(out.begin, out.end) = item_range(*out.list.array, out.list.index);
  out.values = out.list.batch->arrays[static_cast<size_t>(c.items)].get();
  out.dictionary = out.list.batch->dictionaries[static_cast<size_t>(c.items)].get();
  if (out.values->null_count() == 0 && (!out.dictionary || out.dictionary->null_count() == 0)) return out;
  for (int64_t i = out.begin; i < out.end; ++i) {
    if (out.values->IsNull(i) || (out.dictionary && out.dictionary->IsNull(dictionary_index(*out.values, i)))) {
      fail("column '" + c.path + "' has a null item (" + std::to_string(i - out.begin) + ") in row " +
           std::to_string(row));
    }
  }
  return out;
}

std::vector<int64_t> ArrowColumns::integers(int column, int64_t row) const {
  const Items list = items(column, row, true);
  std::vector<int64_t> out;
  if (list.list.null) return out;
  out.reserve(static_cast<size_t>(list.end - list.begin));
  if (!list.dictionary) {
    append_wholes(*list.values, list.begin, list.end, out);
    return out;
  }
  for (int64_t i = list.begin; i < list.end; ++i) {
    out.push_back(whole_at(*list.dictionary, dictionary_index(*list.values, i)));
  }
  return out;
}

std::vector<std::string> ArrowColumns::strings(int column, int64_t row) const {
  const Items list = items(column, row, false);
  std::vector<std::string> out;
  if (list.list.null) return out;
  out.reserve(static_cast<size_t>(list.end - list.begin));
  for (int64_t i = list.begin; i < list.end; ++i) {
    out.emplace_back(list.dictionary ? binary_at(*list.dictionary, dictionary_index(*list.values, i))
                                     : binary_at(*list.values, i));
  }
  return out;
}

}  // namespace shardtrain::data
