#include "data/arrow_ipc.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <stdexcept>

namespace shardtrain::data {
namespace {

// A flatbuffer (one message's metadata) read with every position checked against its size: a table is a signed
// offset back to its vtable ([vtable size, table size, one uint16 offset per field, 0 = absent]); a field holding a
// table, string or vector holds an unsigned offset to it from the field itself; a vector or string starts with its
// element count. Field ids count a union as two fields (its type, then its value).
class Flat {
 public:
  Flat(const char* data, size_t size, const std::string& name) : data_(data), size_(size), name_(name) {}

  template <typename T>
  T scalar(size_t pos) const {
    check(pos, sizeof(T));
    T value;
    std::memcpy(&value, data_ + pos, sizeof(T));
    return value;
  }
  size_t follow(size_t pos) const {  // the position an unsigned offset at `pos` points at
    const size_t target = pos + scalar<uint32_t>(pos);
    check(target, 0);
    return target;
  }
  void check(size_t pos, size_t n) const {
    if (pos > size_ || n > size_ - pos) {
      damaged(std::to_string(n) + " bytes at " + std::to_string(pos) + " of a " + std::to_string(size_) +
              "-byte message");
    }
  }
  [[noreturn]] void damaged(const std::string& what) const {
    throw std::runtime_error(name_ + ": damaged metadata (" + what + ")");
  }
  const char* data() const { return data_; }

 private:
  const char* data_;
  size_t size_;
  const std::string& name_;
};

struct Table {
  const Flat* flat = nullptr;
  size_t pos = 0, vtable = 0;
  uint16_t vtable_size = 0;

  static Table at(const Flat& f, size_t pos) {
    Table t{&f, pos, 0, 0};
    const int64_t back = f.scalar<int32_t>(pos);
    const int64_t vtable = static_cast<int64_t>(pos) - back;
    if (vtable < 0) f.damaged("a vtable " + std::to_string(-vtable) + " bytes before the message");
    f.check(static_cast<size_t>(vtable), 4);
    t.vtable = static_cast<size_t>(vtable);
    t.vtable_size = f.scalar<uint16_t>(t.vtable);
    f.check(t.vtable, t.vtable_size);
    return t;
  }
  size_t field(int id) const {  // the field's position; 0 when absent
    const size_t slot = 4 + 2 * static_cast<size_t>(id);
    if (slot + 2 > vtable_size) return 0;
    const uint16_t offset = flat->scalar<uint16_t>(vtable + slot);
    return offset == 0 ? 0 : pos + offset;
  }
  template <typename T>
  T get(int id, T fallback) const {
    const size_t p = field(id);
    return p == 0 ? fallback : flat->scalar<T>(p);
  }
  bool has(int id) const { return field(id) != 0; }
  Table table(int id) const {  // throws when absent: the callers ask only for tables they need
    const size_t p = field(id);
    if (p == 0) flat->damaged("table field " + std::to_string(id) + " is missing");
    return at(*flat, flat->follow(p));
  }
  std::string_view string(int id) const {
    const size_t p = field(id);
    if (p == 0) return {};
    const size_t s = flat->follow(p);
    const uint32_t n = flat->scalar<uint32_t>(s);
    flat->check(s + 4, n);
    return {flat->data() + s + 4, n};
  }
  // The position of a vector's first element and its length; elements of `element_size` bytes (4: offsets to
  // tables) checked to lie inside.
  std::pair<size_t, size_t> vector(int id, size_t element_size) const {
    const size_t p = field(id);
    if (p == 0) return {0, 0};
    const size_t v = flat->follow(p);
    const uint32_t n = flat->scalar<uint32_t>(v);
    flat->check(v + 4, static_cast<size_t>(n) * element_size);
    return {v + 4, n};
  }
  Table element(std::pair<size_t, size_t> vector, size_t i) const {
    return at(*flat, flat->follow(vector.first + 4 * i));
  }
};

// Type union tags (Schema.fbs).
enum TypeTag : uint8_t {
  kNull = 1, kInt = 2, kFloat = 3, kBinary = 4, kUtf8 = 5, kBool = 6, kDecimal = 7, kDate = 8, kTime = 9,
  kTimestamp = 10, kInterval = 11, kList = 12, kStruct = 13, kUnion = 14, kFixedSizeBinary = 15,
  kFixedSizeList = 16, kMap = 17, kDuration = 18, kLargeBinary = 19, kLargeUtf8 = 20, kLargeList = 21,
  kRunEndEncoded = 22, kBinaryView = 23, kUtf8View = 24, kListView = 25, kLargeListView = 26,
};
constexpr const char* kTypeNames[] = {
    "none", "null", "int", "float", "binary", "string", "bool", "decimal", "date", "time", "timestamp",
    "interval", "list", "struct", "union", "fixed_size_binary", "fixed_size_list", "map", "duration",
    "large_binary", "large_string", "large_list", "run_end_encoded", "binary_view", "string_view", "list_view",
    "large_list_view"};

constexpr int16_t kMetadataV5 = 4;
constexpr int kMaxDepth = 64;  // nesting of the schema's fields; deeper is refused, not recursed into

bool bit(const char* bitmap, int64_t i) { return (static_cast<uint8_t>(bitmap[i >> 3]) >> (i & 7)) & 1; }

int64_t offset_at(const char* p, int width, int64_t i) {
  if (width == 4) {
    int32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p + 8 * i, 8);
  return v;
}

// Value i of a column of whole numbers (INT of its width and sign, or BOOL bits) whose data starts at p.
int64_t value_at(const TableColumn& c, const char* p, int64_t i) {
  if (c.kind == ColumnKind::BOOL) return bit(p, i);
  switch (c.width) {
    case 1: { int8_t v; std::memcpy(&v, p + i, 1); return c.is_signed ? v : static_cast<uint8_t>(v); }
    case 2: { int16_t v; std::memcpy(&v, p + 2 * i, 2); return c.is_signed ? v : static_cast<uint16_t>(v); }
    case 4: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return c.is_signed ? v : static_cast<uint32_t>(v); }
    default: { int64_t v; std::memcpy(&v, p + 8 * i, 8); return v; }
  }
}

// An IEEE half-precision value's bits as a double: (1024 + mantissa) 2^(exponent - 25), subnormals
// mantissa 2^-24.
double half_to_double(uint16_t h) {
  const int exponent = (h >> 10) & 31, mantissa = h & 1023;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa ? std::nan("") : sign * HUGE_VAL;
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

}  // namespace

ArrowTable::ArrowTable(std::string_view bytes, std::string name) : bytes_(bytes), name_(std::move(name)) {
  size_t pos = 0;
  if (bytes_.size() >= 8 && bytes_.substr(0, 6) == "ARROW1") pos = 8;  // the file format: the stream follows
  bool schema = false;
  for (int64_t message = 0;; ++message) {
    if (bytes_.size() - pos < 4) {
      fail("cut short after " + std::to_string(message) + " messages: no end-of-stream marker at byte " +
           std::to_string(pos));
    }
    uint32_t size;
    std::memcpy(&size, bytes_.data() + pos, 4);
    pos += 4;
    if (size == 0xFFFFFFFFu) {  // the continuation marker; streams before Arrow 0.15 have none
      if (bytes_.size() - pos < 4) fail("cut short inside message " + std::to_string(message) + "'s size");
      std::memcpy(&size, bytes_.data() + pos, 4);
      pos += 4;
    }
    if (size == 0) break;  // end of stream
    if (size > bytes_.size() - pos) {
      fail("cut short: message " + std::to_string(message) + " needs " + std::to_string(size) + " bytes at " +
           std::to_string(pos) + ", the file has " + std::to_string(bytes_.size()));
    }
    const Flat flat(bytes_.data() + pos, size, name_);
    const Table m = Table::at(flat, flat.follow(0));
    const int64_t body_size = m.get<int64_t>(3, 0);
    const size_t body = pos + size;
    if (body_size < 0 || static_cast<uint64_t>(body_size) > bytes_.size() - body) {
      fail("cut short: message " + std::to_string(message) + "'s body of " + std::to_string(body_size) +
           " bytes at " + std::to_string(body) + " passes the file's end (" + std::to_string(bytes_.size()) + ")");
    }
    const uint8_t header = m.get<uint8_t>(1, 0);
    if (header == 1) {  // Schema
      if (schema) fail("a second schema in message " + std::to_string(message));
      version_ = m.get<int16_t>(0, 0);
      read_schema(bytes_.data() + pos, size);
      schema = true;
    } else if (header == 3) {  // RecordBatch
      if (!schema) fail("a record batch before the schema");
      read_batch(bytes_.data() + pos, size, static_cast<int64_t>(body), body_size);
    } else if (header != 2) {  // DictionaryBatch: the values of dictionary-encoded columns, which are not read
      fail("message " + std::to_string(message) + " is of kind " + std::to_string(header) +
           ", not a schema or record batch (a tensor?)");
    }
    pos = body + static_cast<size_t>(body_size);
  }
  if (!schema) fail("no schema");
}

void ArrowTable::fail(const std::string& what) const { throw std::runtime_error(name_ + ": " + what); }

void ArrowTable::read_schema(const char* metadata, size_t size) {
  const Flat flat(metadata, size, name_);
  const Table schema = Table::at(flat, flat.follow(0)).table(2);
  if (schema.get<int16_t>(0, 0) != 0) fail("big-endian data, which is not read");
  const auto kv = schema.vector(2, 4);
  for (size_t i = 0; i < kv.second; ++i) {
    const Table entry = schema.element(kv, i);
    metadata_.emplace_back(entry.string(0), entry.string(1));
  }
  // Depth first, as record batches list the fields' nodes and buffers.
  auto add = [&](auto&& self, const Table& field, int parent, int depth) -> void {
    if (depth > kMaxDepth) fail("fields nested more than " + std::to_string(kMaxDepth) + " deep");
    TableColumn c;
    c.path = std::string(field.string(0));
    if (parent >= 0) c.path = columns_[static_cast<size_t>(parent)].path + "." + c.path;
    c.parent = parent;
    c.per_row = parent < 0 || (columns_[static_cast<size_t>(parent)].kind == ColumnKind::STRUCT &&
                               columns_[static_cast<size_t>(parent)].per_row);
    const uint8_t tag = field.get<uint8_t>(2, 0);
    c.type = tag < std::size(kTypeNames) ? kTypeNames[tag] : "type " + std::to_string(tag);
    int buffers = 2;  // validity + data: the fixed-width types
    int32_t list_size = 0;
    const bool dictionary = field.has(4);
    if (dictionary) {
      c.type = "dictionary";  // the record batch holds its integer indices
    } else if (tag == kNull) {
      c.kind = ColumnKind::NULL_TYPE, buffers = 0;
    } else if (tag == kInt) {
      const Table t = field.table(3);
      const int32_t bits = t.get<int32_t>(0, 0);
      if (bits != 8 && bits != 16 && bits != 32 && bits != 64) fail("column '" + c.path + "': an int of " +
                                                                     std::to_string(bits) + " bits");
      c.kind = ColumnKind::INT, c.width = bits / 8, c.is_signed = t.get<uint8_t>(1, 0) != 0;
      c.type = std::string(c.is_signed ? "int" : "uint") + std::to_string(bits);
    } else if (tag == kFloat) {
      const int16_t precision = field.table(3).get<int16_t>(0, 0);  // HALF, SINGLE, DOUBLE
      if (precision < 0 || precision > 2) fail("column '" + c.path + "': float precision " + std::to_string(precision));
      c.kind = ColumnKind::FLOAT, c.width = 2 << precision;
      c.type = "float" + std::to_string(16 << precision);
    } else if (tag == kBool) {
      c.kind = ColumnKind::BOOL;
    } else if (tag == kUtf8 || tag == kLargeUtf8 || tag == kBinary || tag == kLargeBinary) {
      c.kind = tag == kUtf8 || tag == kLargeUtf8 ? ColumnKind::UTF8 : ColumnKind::BINARY;
      c.width = tag == kUtf8 || tag == kBinary ? 4 : 8, buffers = 3;
    } else if (tag == kStruct) {
      c.kind = ColumnKind::STRUCT, buffers = 1;
    } else if (tag == kList || tag == kLargeList || tag == kMap) {
      c.kind = ColumnKind::LIST, c.width = tag == kLargeList ? 8 : 4;
    } else if (tag == kFixedSizeList) {
      c.kind = ColumnKind::LIST, buffers = 1;
      list_size = field.table(3).get<int32_t>(0, 0);
      if (list_size < 0) fail("column '" + c.path + "': a fixed_size_list of " + std::to_string(list_size) + " items");
    } else if (tag == kListView || tag == kLargeListView) {
      buffers = 3;
    } else if (tag == kRunEndEncoded) {
      buffers = 0;
    } else if (tag == kUnion) {  // type ids, dense: offsets; before V5 also a validity bitmap
      buffers = (version_ < kMetadataV5 ? 1 : 0) + 1 + (field.table(3).get<int16_t>(0, 0) == 1 ? 1 : 0);
    } else if (tag == kBinaryView || tag == kUtf8View) {
      buffers = -1;
    } else if (tag < kDecimal || tag > kLargeListView) {
      fail("column '" + c.path + "' has an unknown type (" + std::to_string(tag) + ")");
    }
    columns_.push_back(c);
    buffers_.push_back(buffers);
    list_size_.push_back(list_size);
    const int self_index = static_cast<int>(columns_.size()) - 1;
    if (dictionary) return;  // its value type's children live in the dictionary batch
    const auto children = field.vector(5, 4);
    for (size_t i = 0; i < children.second; ++i) self(self, field.element(children, i), self_index, depth + 1);
    // A list (not a map) of one scalar column: its items can be read as a row's list.
    const auto item = static_cast<size_t>(self_index) + 1;
    const ColumnKind k = item < columns_.size() ? columns_[item].kind : ColumnKind::OTHER;
    if (c.kind == ColumnKind::LIST && tag != kMap && children.second == 1 && item + 1 == columns_.size() &&
        k != ColumnKind::LIST && k != ColumnKind::STRUCT && k != ColumnKind::OTHER &&
        columns_[item].type != "dictionary") {
      columns_[static_cast<size_t>(self_index)].items = static_cast<int>(item);
    }
  };
  const auto fields = schema.vector(1, 4);
  for (size_t i = 0; i < fields.second; ++i) add(add, schema.element(fields, i), -1, 0);
}

void ArrowTable::read_batch(const char* metadata, size_t size, int64_t body, int64_t body_size) {
  const Flat flat(metadata, size, name_);
  const Table rb = Table::at(flat, flat.follow(0)).table(2);
  const std::string where = "record batch " + std::to_string(batches_.size());
  if (rb.has(3)) {
    fail(where + " is compressed (" + (rb.table(3).get<int8_t>(0, 0) == 1 ? "zstd" : "lz4") +
         "), which is not read: write it without compression (pyarrow's default)");
  }
  Batch b;
  b.first_row = rows_;
  b.rows = rb.get<int64_t>(0, 0);
  if (b.rows < 0 || b.rows > INT64_MAX - rows_) fail(where + " has " + std::to_string(b.rows) + " rows");
  const auto nodes = rb.vector(1, 16), buffers = rb.vector(2, 16), variadic = rb.vector(4, 8);
  if (nodes.second != columns_.size()) {
    fail(where + " has " + std::to_string(nodes.second) + " field nodes, the schema " +
         std::to_string(columns_.size()) + " fields");
  }
  size_t next_buffer = 0, next_variadic = 0;
  std::vector<std::pair<size_t, int64_t>> item_ends;  // (a list's item column, the items its rows need)
  // The file position of the next buffer (-1 when it is empty) after checking it lies inside the body.
  auto take = [&](const std::string& column, int64_t& length) -> int64_t {
    if (next_buffer >= buffers.second) fail(where + ": too few buffers for column '" + column + "'");
    const int64_t offset = flat.scalar<int64_t>(buffers.first + 16 * next_buffer);
    length = flat.scalar<int64_t>(buffers.first + 16 * next_buffer + 8);
    ++next_buffer;
    if (offset < 0 || length < 0 || offset > body_size || length > body_size - offset) {
      fail(where + ": column '" + column + "' has a buffer of " + std::to_string(length) + " bytes at " +
           std::to_string(offset) + ", outside the " + std::to_string(body_size) + "-byte body");
    }
    return length == 0 ? -1 : body + offset;
  };
  for (size_t i = 0; i < columns_.size(); ++i) {
    const TableColumn& c = columns_[i];
    Slice s;
    s.length = flat.scalar<int64_t>(nodes.first + 16 * i);
    s.null_count = flat.scalar<int64_t>(nodes.first + 16 * i + 8);
    const int64_t above = c.parent < 0 ? b.rows : b.slices[static_cast<size_t>(c.parent)].length;
    if (s.length < 0 || s.null_count < 0 || s.null_count > s.length || (c.per_row && s.length < above)) {
      fail(where + ": column '" + c.path + "' has " + std::to_string(s.length) + " values (" +
           std::to_string(s.null_count) + " null) for " + std::to_string(above) + " rows");
    }
    int count = buffers_[i];
    if (count < 0) {
      if (next_variadic >= variadic.second) fail(where + ": no data buffer count for column '" + c.path + "'");
      count = 2 + static_cast<int>(std::clamp<int64_t>(flat.scalar<int64_t>(variadic.first + 8 * next_variadic++), 0,
                                                        1 << 20));
    }
    std::vector<std::pair<int64_t, int64_t>> got;  // (position, bytes)
    for (int k = 0; k < count; ++k) {
      int64_t length = 0;
      const int64_t at = take(c.path, length);
      got.emplace_back(at, length);
    }
    // Sizes compared by division: a node's length is the file's word, as large as an int64 holds.
    const int64_t bitmap_bytes = s.length / 8 + (s.length % 8 != 0);
    const bool has_validity = count > 0 && c.type != "union";  // a union's first buffer holds type ids
    if (has_validity && s.null_count > 0) {
      if (got[0].second < bitmap_bytes) fail(where + ": column '" + c.path + "' has nulls and a short bitmap");
      s.validity = got[0].first;
    }
    if ((c.kind == ColumnKind::INT || c.kind == ColumnKind::FLOAT || c.kind == ColumnKind::BOOL) && s.length > 0) {
      if (c.kind == ColumnKind::BOOL ? got[1].second < bitmap_bytes : got[1].second / c.width < s.length) {
        fail(where + ": column '" + c.path + "' has " + std::to_string(s.length) + " values in " +
             std::to_string(got[1].second) + " bytes");
      }
      s.data = got[1].first;
    } else if ((c.kind == ColumnKind::UTF8 || c.kind == ColumnKind::BINARY || (c.kind == ColumnKind::LIST &&
                                                                                   c.width > 0)) && s.length > 0) {
      if (got[1].second / c.width <= s.length) fail(where + ": column '" + c.path + "' has too few offsets");
      s.offsets = got[1].first;
      // Offsets start at or after 0, never go backwards, and end inside the data (a list's: inside its items,
      // checked below): every value lies in the file.
      const char* o = bytes_.data() + s.offsets;
      int64_t previous = offset_at(o, c.width, 0);
      if (previous < 0) fail(where + ": column '" + c.path + "' starts at offset " + std::to_string(previous));
      for (int64_t r = 1; r <= s.length; ++r) {
        const int64_t next = offset_at(o, c.width, r);
        if (next < previous) fail(where + ": column '" + c.path + "' has offsets going backwards at row " +
                                  std::to_string(b.first_row + r - 1));
        previous = next;
      }
      if (c.kind == ColumnKind::LIST) {
        item_ends.emplace_back(i + 1, previous);
      } else {
        s.data = got[2].first;
        if (previous > got[2].second) {
          fail(where + ": column '" + c.path + "' ends at byte " + std::to_string(previous) + " of a " +
               std::to_string(got[2].second) + "-byte data buffer");
        }
      }
    } else if (c.kind == ColumnKind::LIST && s.length > 0) {  // fixed_size_list
      const int64_t n = list_size_[i];
      if (n > 0 && s.length > INT64_MAX / n) fail(where + ": column '" + c.path + "' has too many items");
      item_ends.emplace_back(i + 1, s.length * n);
    }
    b.slices.push_back(s);
  }
  for (const auto& [item, needed] : item_ends) {
    if (item >= b.slices.size() || b.slices[item].length < needed) {
      fail(where + ": column '" + columns_[item - 1].path + "' has rows of " + std::to_string(needed) +
           " items in all, its items column " +
           std::to_string(item < b.slices.size() ? b.slices[item].length : 0));
    }
  }
  if (next_buffer != buffers.second) {
    fail(where + " has " + std::to_string(buffers.second) + " buffers, the schema's fields " +
         std::to_string(next_buffer));
  }
  rows_ += b.rows;
  batches_.push_back(std::move(b));
}

std::string ArrowTable::metadata(const std::string& key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return v;
  }
  return "";
}

const ArrowTable::Batch& ArrowTable::locate(int column, int64_t& row) const {
  if (column < 0 || static_cast<size_t>(column) >= columns_.size()) fail("no column " + std::to_string(column));
  if (!columns_[static_cast<size_t>(column)].per_row) {
    fail("column '" + columns_[static_cast<size_t>(column)].path + "' holds a list's items, not a value per row");
  }
  if (row < 0 || row >= rows_) fail("row " + std::to_string(row) + " of " + std::to_string(rows_));
  const auto b = std::upper_bound(batches_.begin(), batches_.end(), row,
                                  [](int64_t r, const Batch& x) { return r < x.first_row; }) - 1;
  row -= b->first_row;
  return *b;
}

bool ArrowTable::is_null(int column, int64_t row) const {
  for (int c = column; c >= 0; c = columns_[static_cast<size_t>(c)].parent) {
    int64_t r = row;
    const Slice& s = locate(c, r).slices[static_cast<size_t>(c)];
    if (columns_[static_cast<size_t>(c)].kind == ColumnKind::NULL_TYPE) return true;
    if (s.validity >= 0 && !bit(bytes_.data() + s.validity, r)) return true;
  }
  return false;
}

std::string_view ArrowTable::view(int column, int64_t row) const {
  int64_t r = row;
  const Slice& s = locate(column, r).slices[static_cast<size_t>(column)];
  const TableColumn& c = columns_[static_cast<size_t>(column)];
  if (c.kind != ColumnKind::UTF8 && c.kind != ColumnKind::BINARY) {
    fail("column '" + c.path + "' holds " + c.type + ", not strings or bytes");
  }
  if (is_null(column, row) || s.offsets < 0) return {};
  const char* o = bytes_.data() + s.offsets;
  const int64_t start = offset_at(o, c.width, r), end = offset_at(o, c.width, r + 1);
  if (end == start) return {};
  return {bytes_.data() + s.data + start, static_cast<size_t>(end - start)};
}

int64_t ArrowTable::integer(int column, int64_t row) const {
  int64_t r = row;
  const Slice& s = locate(column, r).slices[static_cast<size_t>(column)];
  const TableColumn& c = columns_[static_cast<size_t>(column)];
  if (c.kind != ColumnKind::INT && c.kind != ColumnKind::BOOL) {
    fail("column '" + c.path + "' holds " + c.type + ", not whole numbers");
  }
  if (is_null(column, row) || s.data < 0) return 0;
  return value_at(c, bytes_.data() + s.data, r);
}

double ArrowTable::number(int column, int64_t row) const {
  const TableColumn& c = columns_[static_cast<size_t>(column)];
  if (c.kind == ColumnKind::INT || c.kind == ColumnKind::BOOL) return static_cast<double>(integer(column, row));
  if (c.kind != ColumnKind::FLOAT) fail("column '" + c.path + "' holds " + c.type + ", not numbers");
  int64_t r = row;
  const Slice& s = locate(column, r).slices[static_cast<size_t>(column)];
  if (is_null(column, row) || s.data < 0) return 0;
  const char* p = bytes_.data() + s.data + c.width * r;
  if (c.width == 2) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return half_to_double(h);
  }
  if (c.width == 4) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  double d;
  std::memcpy(&d, p, 8);
  return d;
}

// A list column's row as the range [begin, end) of its items' indexes (empty for a null list).
std::pair<int64_t, int64_t> ArrowTable::item_range(int column, int64_t row) const {
  int64_t r = row;
  const Batch& b = locate(column, r);
  const TableColumn& c = columns_[static_cast<size_t>(column)];
  if (is_null(column, row)) return {0, 0};
  const Slice& s = b.slices[static_cast<size_t>(column)];
  if (c.width == 0) {  // a fixed_size_list
    const int64_t n = list_size_[static_cast<size_t>(column)];
    return {r * n, r * n + n};
  }
  if (s.offsets < 0) return {0, 0};
  const char* offsets = bytes_.data() + s.offsets;
  return {offset_at(offsets, c.width, r), offset_at(offsets, c.width, r + 1)};
}

// The slice of a list column's items in the batch holding `row`; fails naming the column for a null item.
const ArrowTable::Slice& ArrowTable::items_of(int column, int64_t row, std::pair<int64_t, int64_t> range) const {
  int64_t r = row;
  const TableColumn& c = columns_[static_cast<size_t>(column)];
  const Slice& values = locate(column, r).slices[static_cast<size_t>(c.items)];
  for (int64_t i = range.first; i < range.second; ++i) {
    if (values.validity >= 0 && !bit(bytes_.data() + values.validity, i)) {
      fail("column '" + c.path + "' has a null item (" + std::to_string(i - range.first) + ") in row " +
           std::to_string(row));
    }
  }
  return values;
}

std::vector<int64_t> ArrowTable::integers(int column, int64_t row) const {
  const TableColumn& c = columns_.at(static_cast<size_t>(column));
  const TableColumn* items = c.items >= 0 ? &columns_[static_cast<size_t>(c.items)] : nullptr;
  if (!items || (items->kind != ColumnKind::INT && items->kind != ColumnKind::BOOL)) {
    fail("column '" + c.path + "' holds " + c.type + (items ? " of " + items->type : "") +
         ", not lists of whole numbers");
  }
  const auto range = item_range(column, row);
  const Slice& values = items_of(column, row, range);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(range.second - range.first));
  for (int64_t i = range.first; i < range.second; ++i) {
    out.push_back(values.data < 0 ? 0 : value_at(*items, bytes_.data() + values.data, i));
  }
  return out;
}

std::vector<std::string> ArrowTable::strings(int column, int64_t row) const {
  const TableColumn& c = columns_.at(static_cast<size_t>(column));
  const TableColumn* items = c.items >= 0 ? &columns_[static_cast<size_t>(c.items)] : nullptr;
  if (!items || items->kind != ColumnKind::UTF8) {
    fail("column '" + c.path + "' holds " + c.type + (items ? " of " + items->type : "") + ", not lists of strings");
  }
  const auto range = item_range(column, row);
  const Slice& values = items_of(column, row, range);
  std::vector<std::string> out;
  if (values.offsets < 0) return std::vector<std::string>(static_cast<size_t>(range.second - range.first));
  const char* o = bytes_.data() + values.offsets;
  for (int64_t i = range.first; i < range.second; ++i) {
    const int64_t start = offset_at(o, items->width, i), end = offset_at(o, items->width, i + 1);
    out.emplace_back(bytes_.data() + values.data + start, static_cast<size_t>(end - start));
  }
  return out;
}

}  // namespace shardtrain::data
