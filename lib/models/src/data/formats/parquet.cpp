#include "data/formats/parquet.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "data/formats/compression.h"
#include "data/formats/table_files.h"

namespace shardtrain::data {

namespace {

// Thrift's compact encoding, read with every byte checked against the end: a struct is fields until a 0 byte, each
// headed by a byte [id delta (4 bits, 0: a zigzag varint id follows) | type (4 bits)]; integers are zigzag varints,
// binaries a varint length then the bytes, a list a byte [size (4 bits, 15: a varint follows) | element type].
enum ThriftType { kStop = 0, kTrue = 1, kFalse = 2, kByte = 3, kI16 = 4, kI32 = 5, kI64 = 6, kDouble = 7,
                  kBinary = 8, kList = 9, kSet = 10, kMap = 11, kStruct = 12 };
constexpr int kMaxThriftDepth = 32;

class Thrift {
 public:
  Thrift(const char* begin, const char* end, std::string what) : p_(begin), end_(end), what_(std::move(what)) {}
  const char* position() const { return p_; }

  uint8_t byte() {
    if (p_ >= end_) fail("ends early");
    return static_cast<uint8_t>(*p_++);
  }
  void advance(uint64_t n) {  // past n bytes
    if (n > static_cast<uint64_t>(end_ - p_)) fail("ends early");
    p_ += n;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("has a varint longer than 10 bytes");
  }
  int64_t zigzag() {
    const uint64_t v = varint();
    return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
  }
  int64_t integer(int type) {  // a field of any integer type
    if (type == kByte) return static_cast<int8_t>(byte());
    if (type == kI16 || type == kI32 || type == kI64) return zigzag();
    fail("has an integer field of type " + std::to_string(type));
  }
  std::string_view binary() {
    const uint64_t n = varint();
    if (n > static_cast<uint64_t>(end_ - p_)) fail("has a string past its end");
    const std::string_view s(p_, n);
    p_ += n;
    return s;
  }
  // The next field of a struct; false at its end. `last` is the previous field's id (ids are deltas).
  bool field(int16_t& last, int16_t& id, int& type) {
    const uint8_t b = byte();
    if (b == kStop) return false;
    type = b & 0x0f;
    const int delta = b >> 4;
    id = delta ? static_cast<int16_t>(last + delta) : static_cast<int16_t>(zigzag());
    last = id;
    return true;
  }
  int64_t list(int& element_type) {  // the list's size
    const uint8_t b = byte();
    element_type = b & 0x0f;
    const int64_t n = (b >> 4) == 15 ? static_cast<int64_t>(varint()) : b >> 4;
    if (n < 0 || n > end_ - p_) fail("has a list of " + std::to_string(n) + " elements in fewer bytes");
    return n;
  }
  void skip(int type, int depth = 0) {
    if (depth > kMaxThriftDepth) fail("nests deeper than " + std::to_string(kMaxThriftDepth));
    switch (type) {
      case kTrue: case kFalse: return;
      case kByte: byte(); return;
      case kI16: case kI32: case kI64: varint(); return;
      case kDouble:
        if (end_ - p_ < 8) fail("ends early");
        p_ += 8;
        return;
      case kBinary: binary(); return;
      case kList: case kSet: {
        int element = 0;
        const int64_t n = list(element);
        for (int64_t i = 0; i < n; ++i) element == kTrue || element == kFalse ? (void)byte() : skip(element, depth + 1);
        return;
      }
      case kMap: {
        const uint64_t n = varint();
        if (n == 0) return;
        if (n > static_cast<uint64_t>(end_ - p_)) fail("has a map larger than its bytes");
        const uint8_t types = byte();
        for (uint64_t i = 0; i < n; ++i) skip(types >> 4, depth + 1), skip(types & 0x0f, depth + 1);
        return;
      }
      case kStruct: {
        int16_t last = 0, id = 0;
        int t = 0;
        while (field(last, id, t)) skip(t, depth + 1);
        return;
      }
      default: fail("has a field of unknown type " + std::to_string(type));
    }
  }
  [[noreturn]] void fail(const std::string& why) const { throw std::runtime_error(what_ + " " + why); }

 private:
  const char* p_;
  const char* end_;
  std::string what_;  // for errors: "file.parquet: column 'text' in row group 2's values"
};

// Parquet's enums (parquet.thrift).
enum Physical { kBoolean = 0, kInt32 = 1, kInt64 = 2, kInt96 = 3, kFloat = 4, kDouble64 = 5, kByteArray = 6,
                kFixedLenByteArray = 7 };
enum Repetition { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum PageType { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };
enum Encoding { kPlain = 0, kPlainDictionary = 2, kRle = 3, kDeltaBinaryPacked = 5, kDeltaLengthByteArray = 6,
                kDeltaByteArray = 7, kRleDictionary = 8, kByteStreamSplit = 9 };
constexpr int64_t kMaxPageBytes = int64_t{1} << 30;  // what a page may decompress to: 1 GiB

}  // namespace

// What the footer says, as the table's constructor reads it (declared in parquet.h).
namespace parquet_footer {

struct SchemaElement {
  int type = -1, repetition = kRequired, num_children = 0, converted = -1;
  int logical = 0;                   // the LogicalType union's member: STRING 1, MAP 2, LIST 3, ..., INTEGER 10
  int int_bits = 0;                  // INTEGER's bitWidth
  bool int_signed = true;
  std::string name;
};

struct ChunkMeta {
  int type = -1, codec = 0;
  int64_t values = 0, compressed = 0, data_page = -1, dictionary_page = -1;
  bool external = false;  // the chunk lives in another file (file_path)
};

}  // namespace parquet_footer

namespace {

using parquet_footer::ChunkMeta;
using parquet_footer::SchemaElement;

SchemaElement read_schema_element(Thrift& t) {
  SchemaElement e;
  int16_t last = 0, id = 0;
  int type = 0;
  while (t.field(last, id, type)) {
    if (id == 1 && type == kI32) e.type = static_cast<int>(t.zigzag());
    else if (id == 3 && type == kI32) e.repetition = static_cast<int>(t.zigzag());
    else if (id == 4 && type == kBinary) e.name = std::string(t.binary());
    else if (id == 5 && type == kI32) e.num_children = static_cast<int>(t.zigzag());
    else if (id == 6 && type == kI32) e.converted = static_cast<int>(t.zigzag());
    else if (id == 10 && type == kStruct) {
      int16_t l2 = 0, member = 0;
      int t2 = 0;
      while (t.field(l2, member, t2)) {
        if (t2 != kStruct) { t.skip(t2); continue; }
        e.logical = member;
        int16_t l3 = 0, f = 0;
        int t3 = 0;
        while (t.field(l3, f, t3)) {
          if (member == 10 && f == 1) e.int_bits = static_cast<int>(t.integer(t3));
          else if (member == 10 && f == 2) e.int_signed = t3 == kTrue;
          else t.skip(t3);
        }
      }
    } else {
      t.skip(type);
    }
  }
  return e;
}

ChunkMeta read_chunk(Thrift& t) {
  ChunkMeta c;
  int16_t last = 0, id = 0;
  int type = 0;
  while (t.field(last, id, type)) {
    if (id == 1 && type == kBinary) {
      c.external = !t.binary().empty();
    } else if (id == 3 && type == kStruct) {  // ColumnMetaData
      int16_t l2 = 0, f = 0;
      int t2 = 0;
      while (t.field(l2, f, t2)) {
        if (f == 1 && t2 == kI32) c.type = static_cast<int>(t.zigzag());
        else if (f == 4 && t2 == kI32) c.codec = static_cast<int>(t.zigzag());
        else if (f == 5 && t2 == kI64) c.values = t.zigzag();
        else if (f == 7 && t2 == kI64) c.compressed = t.zigzag();
        else if (f == 9 && t2 == kI64) c.data_page = t.zigzag();
        else if (f == 11 && t2 == kI64) c.dictionary_page = t.zigzag();
        else t.skip(t2);
      }
    } else {
      t.skip(type);
    }
  }
  return c;
}

// The footer's FileMetaData: the schema (field 2), the row count (3), each row group's row count and column chunks
// (4), the key/value metadata (5).
struct FileMetadata {
  std::vector<SchemaElement> schema;
  int64_t num_rows = -1;
  std::vector<std::pair<int64_t, std::vector<ChunkMeta>>> row_groups;  // (rows, a chunk per leaf)
  std::vector<std::pair<std::string, std::string>> key_values;
};

std::pair<int64_t, std::vector<ChunkMeta>> read_row_group(Thrift& t) {
  std::pair<int64_t, std::vector<ChunkMeta>> group{-1, {}};
  int16_t last = 0, id = 0;
  int type = 0;
  while (t.field(last, id, type)) {
    if (id == 1 && type == kList) {
      int element = 0;
      const int64_t chunks = t.list(element);
      for (int64_t c = 0; c < chunks; ++c) group.second.push_back(read_chunk(t));
    } else if (id == 3 && type == kI64) {
      group.first = t.zigzag();
    } else {
      t.skip(type);
    }
  }
  return group;
}

std::pair<std::string, std::string> read_key_value(Thrift& t) {
  std::pair<std::string, std::string> out;
  int16_t last = 0, id = 0;
  int type = 0;
  while (t.field(last, id, type)) {
    if (id == 1 && type == kBinary) out.first = std::string(t.binary());
    else if (id == 2 && type == kBinary) out.second = std::string(t.binary());
    else t.skip(type);
  }
  return out;
}

FileMetadata read_file_metadata(Thrift& t) {
  FileMetadata out;
  int16_t last = 0, id = 0;
  int type = 0;
  while (t.field(last, id, type)) {
    int element = 0;
    if (id == 2 && type == kList) {
      const int64_t n = t.list(element);
      for (int64_t i = 0; i < n; ++i) out.schema.push_back(read_schema_element(t));
    } else if (id == 3 && type == kI64) {
      out.num_rows = t.zigzag();
    } else if (id == 4 && type == kList) {
      const int64_t n = t.list(element);
      for (int64_t i = 0; i < n; ++i) out.row_groups.push_back(read_row_group(t));
    } else if (id == 5 && type == kList) {
      const int64_t n = t.list(element);
      for (int64_t i = 0; i < n; ++i) out.key_values.push_back(read_key_value(t));
    } else {
      t.skip(type);
    }
  }
  return out;
}

// A leaf's kind and type name, from its physical type and annotations.
void describe_leaf(const SchemaElement& e, TableColumn& c) {
  const bool annotated_int = e.logical == 10 || (e.converted >= 11 && e.converted <= 18);
  if (e.type == kBoolean) {
    c.kind = ColumnKind::BOOL, c.type = "bool";
  } else if ((e.type == kInt32 || e.type == kInt64) && (annotated_int || (e.converted < 0 && e.logical == 0))) {
    int bits = e.type == kInt32 ? 32 : 64;
    bool is_signed = true;
    if (e.logical == 10) bits = e.int_bits, is_signed = e.int_signed;
    else if (e.converted >= 11 && e.converted <= 14) bits = 8 << (e.converted - 11), is_signed = false;
    else if (e.converted >= 15) bits = 8 << (e.converted - 15);
    c.kind = ColumnKind::INT, c.width = bits / 8, c.is_signed = is_signed;
    c.type = std::string(is_signed ? "int" : "uint") + std::to_string(bits);
  } else if (e.type == kByteArray) {
    const bool text = e.converted == 0 || e.logical == 1 || e.logical == 12;  // UTF8, STRING, JSON
    c.kind = text ? ColumnKind::UTF8 : ColumnKind::BINARY;
    c.type = text ? "string" : "binary";
  } else if (e.type == kFloat || e.type == kDouble64) {
    c.kind = ColumnKind::FLOAT, c.width = e.type == kFloat ? 4 : 8;
    c.type = e.type == kFloat ? "float32" : "float64";
  } else {
    c.type = e.type == kInt96 ? "int96" : e.type == kFixedLenByteArray ? "fixed_size_binary" : "annotated " +
             std::string(e.type == kInt32 ? "int32" : "int64");  // dates, times, timestamps, decimals
  }
}

struct PageHeader {
  int type = -1;
  int64_t uncompressed = 0, compressed = 0, values = 0;
  int encoding = 0;
  int64_t def_bytes = 0, rep_bytes = 0;  // v2: the levels' sizes, stored uncompressed before the values
  bool compressed_values = true;         // v2's is_compressed
  int64_t rows = -1;                     // v2: the rows the page holds (for a list, fewer than its values)
};

PageHeader read_page_header(Thrift& t) {
  PageHeader h;
  int16_t last = 0, id = 0;
  int type = 0;
  while (t.field(last, id, type)) {
    if (id == 1 && type == kI32) h.type = static_cast<int>(t.zigzag());
    else if (id == 2 && type == kI32) h.uncompressed = t.zigzag();
    else if (id == 3 && type == kI32) h.compressed = t.zigzag();
    else if ((id == 5 || id == 7 || id == 8) && type == kStruct) {  // data, dictionary, data v2 page headers
      int16_t l2 = 0, f = 0;
      int t2 = 0;
      while (t.field(l2, f, t2)) {
        if (f == 1 && t2 == kI32) h.values = t.zigzag();
        else if (id == 5 && f == 2 && t2 == kI32) h.encoding = static_cast<int>(t.zigzag());
        else if (id == 7 && f == 2 && t2 == kI32) h.encoding = static_cast<int>(t.zigzag());
        else if (id == 8 && f == 3 && t2 == kI32) h.rows = t.zigzag();
        else if (id == 8 && f == 4 && t2 == kI32) h.encoding = static_cast<int>(t.zigzag());
        else if (id == 8 && f == 5 && t2 == kI32) h.def_bytes = t.zigzag();
        else if (id == 8 && f == 6 && t2 == kI32) h.rep_bytes = t.zigzag();
        else if (id == 8 && f == 7 && (t2 == kTrue || t2 == kFalse)) h.compressed_values = t2 == kTrue;
        else t.skip(t2);
      }
    } else {
      t.skip(type);
    }
  }
  return h;
}

uint32_t load_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The value of `width` bits (at most 32) at bit `bit` of the bit-packed bytes p[0, size), LSB first; the value
// must lie inside them. Read through one little-endian 64-bit load (the value spans at most 5 bytes).
uint32_t unpack(const uint8_t* p, uint64_t size, uint64_t bit, int width) {
  const uint64_t byte = bit >> 3;
  uint64_t word = 0;
  std::memcpy(&word, p + byte, static_cast<size_t>(std::min<uint64_t>(8, size - byte)));
  return static_cast<uint32_t>((word >> (bit & 7)) & ((uint64_t{1} << width) - 1));
}

// unpack() for widths up to 64 (DELTA_BINARY_PACKED's deltas): two loads above 32 bits.
uint64_t unpack_wide(const uint8_t* p, uint64_t size, uint64_t bit, int width) {
  if (width <= 32) return unpack(p, size, bit, width);
  return unpack(p, size, bit, 32) | static_cast<uint64_t>(unpack(p, size, bit + 32, width - 32)) << 32;
}

// DELTA_BINARY_PACKED: a header (values per block, a multiple of 128; miniblocks per block, each a multiple of 32
// values; the value count; the first value, zigzag), then blocks: the block's minimum delta (zigzag), a bit width
// per miniblock, the miniblocks' deltas bit-packed (a miniblock padded to its full size; those after the last value
// absent). Each value is the previous plus the minimum plus its delta, in wrapping 64-bit arithmetic. Appends the
// `count` values it must hold to `out`; t is left after them.
void read_delta(Thrift& t, const char* end, int64_t count, std::vector<int64_t>& out) {
  const uint64_t block = t.varint(), miniblocks = t.varint(), total = t.varint();
  uint64_t value = static_cast<uint64_t>(t.zigzag());
  if (block == 0 || block % 128 != 0 || block > (uint64_t{1} << 20) || miniblocks == 0 || block % miniblocks != 0 ||
      (block / miniblocks) % 32 != 0) {
    t.fail("has delta blocks of " + std::to_string(block) + " values in " + std::to_string(miniblocks) +
           " miniblocks");
  }
  if (total != static_cast<uint64_t>(count)) {
    t.fail("holds " + std::to_string(total) + " delta-encoded values where the page has " + std::to_string(count));
  }
  if (count == 0) return;
  const uint64_t per_miniblock = block / miniblocks;
  out.push_back(static_cast<int64_t>(value));
  int64_t n = 1;
  while (n < count) {
    const uint64_t min_delta = static_cast<uint64_t>(t.zigzag());
    if (miniblocks > static_cast<uint64_t>(end - t.position())) t.fail("ends inside a delta block's bit widths");
    const auto* widths = reinterpret_cast<const uint8_t*>(t.position());
    t.advance(miniblocks);
    for (uint64_t m = 0; m < miniblocks && n < count; ++m) {
      const int width = widths[m];
      if (width > 64) t.fail("has a delta bit width of " + std::to_string(width));
      const uint64_t bytes = per_miniblock * static_cast<uint64_t>(width) / 8;
      if (bytes > static_cast<uint64_t>(end - t.position())) t.fail("ends inside a delta miniblock");
      const auto* p = reinterpret_cast<const uint8_t*>(t.position());
      for (uint64_t i = 0; i < per_miniblock && n < count; ++i, ++n) {
        value += min_delta + (width == 0 ? 0 : unpack_wide(p, bytes, i * static_cast<uint64_t>(width), width));
        out.push_back(static_cast<int64_t>(value));
      }
      t.advance(bytes);
    }
  }
}

// DELTA_LENGTH_BYTE_ARRAY (the lengths delta-encoded, then the bytes end to end) and DELTA_BYTE_ARRAY (each value
// the previous one's first `prefix` bytes then a suffix: the prefix lengths delta-encoded, then the suffixes as
// DELTA_LENGTH_BYTE_ARRAY): `count` values appended to data, each one's end to offsets. Prefixes repeat bytes, so
// the values are bounded in all by kMaxPageBytes, as a decompressed page is.
void read_delta_strings(Thrift& t, const char* end, int64_t count, bool prefixed, std::string& data,
                        std::vector<int64_t>& offsets) {
  std::vector<int64_t> prefixes, lengths;
  if (prefixed) read_delta(t, end, count, prefixes);
  read_delta(t, end, count, lengths);
  std::string previous;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t n = lengths[static_cast<size_t>(i)], keep = prefixed ? prefixes[static_cast<size_t>(i)] : 0;
    if (n < 0 || n > end - t.position()) t.fail("has a value of " + std::to_string(n) + " bytes past its end");
    if (keep < 0 || keep > static_cast<int64_t>(previous.size())) {
      t.fail("has a prefix of " + std::to_string(keep) + " bytes of a " + std::to_string(previous.size()) +
             "-byte value");
    }
    previous.resize(static_cast<size_t>(keep));
    previous.append(t.position(), static_cast<size_t>(n));
    t.advance(static_cast<uint64_t>(n));
    if (previous.size() > static_cast<uint64_t>(kMaxPageBytes) - data.size()) {
      t.fail("has values of more than " + std::to_string(kMaxPageBytes) + " bytes in all");
    }
    data += previous;
    offsets.push_back(static_cast<int64_t>(data.size()));
  }
}

// A 64-bit delta-decoded value as the column's physical type holds it: INT32 wraps to 32 bits, signed or not.
int64_t as_physical(int64_t v, int physical, bool is_signed) {
  if (physical != kInt32) return v;
  const auto low = static_cast<uint32_t>(static_cast<uint64_t>(v));
  return is_signed ? static_cast<int32_t>(low) : static_cast<int64_t>(low);
}

// The RLE / bit-packing hybrid: runs headed by a varint, odd: (header >> 1) groups of 8 values bit-packed LSB
// first, even: (header >> 1) repeats of one value in ceil(bit_width / 8) bytes. Appends `count` values to `out`.
void read_hybrid(Thrift& t, const char* end, int bit_width, int64_t count, std::vector<uint32_t>& out) {
  if (bit_width < 0 || bit_width > 32) t.fail("has a bit width of " + std::to_string(bit_width));
  const size_t target = out.size() + static_cast<size_t>(count);
  while (out.size() < target) {
    const uint64_t header = t.varint();
    const uint64_t left = target - out.size();
    if (header & 1) {
      const uint64_t groups = header >> 1;
      if (groups == 0) t.fail("has an empty bit-packed run");
      const int64_t available = end - t.position();
      if (bit_width > 0 && groups > static_cast<uint64_t>(available) / static_cast<uint64_t>(bit_width)) {
        t.fail("has a bit-packed run past its end");
      }
      const auto* p = reinterpret_cast<const uint8_t*>(t.position());
      const uint64_t n = std::min<uint64_t>(groups * 8, left), size = groups * static_cast<uint64_t>(bit_width);
      for (uint64_t i = 0; i < n; ++i) {
        out.push_back(bit_width == 0 ? 0 : unpack(p, size, i * static_cast<uint64_t>(bit_width), bit_width));
      }
      t.advance(groups * static_cast<uint64_t>(bit_width));
    } else {
      const uint64_t n = header >> 1;
      if (n == 0) t.fail("has an empty run");
      uint32_t v = 0;
      for (int b = 0; b < (bit_width + 7) / 8; ++b) v |= static_cast<uint32_t>(t.byte()) << (8 * b);
      if (bit_width < 32 && (v >> bit_width) != 0) t.fail("has a run value wider than its bit width");
      out.insert(out.end(), static_cast<size_t>(std::min(n, left)), v);
    }
  }
}

// One run of the hybrid encoding, found without decoding it: `count` values from value `first` on, bit-packed at
// byte `offset` of the encoded bytes, or (not packed) all `value`.
struct HybridRun {
  int64_t first = 0;
  uint32_t offset = 0, value = 0;
  bool packed = false;
};

// The runs holding `count` values of `bit_width` bits in `bytes`: only their headers are read, so that one value can
// be decoded without those before it. Throws std::runtime_error (naming `what`) for runs past the bytes' end.
std::vector<HybridRun> index_hybrid(std::string_view bytes, int bit_width, int64_t count, const std::string& what) {
  Thrift t(bytes.data(), bytes.data() + bytes.size(), what);
  if (bit_width < 0 || bit_width > 32) t.fail("has a bit width of " + std::to_string(bit_width));
  std::vector<HybridRun> runs;
  for (int64_t n = 0; n < count;) {
    const uint64_t header = t.varint();
    HybridRun run;
    run.first = n;
    if (header & 1) {
      const uint64_t groups = header >> 1;
      if (groups == 0) t.fail("has an empty bit-packed run");
      if (bit_width > 0 && groups > static_cast<uint64_t>(bytes.data() + bytes.size() - t.position()) /
                                        static_cast<uint64_t>(bit_width)) {
        t.fail("has a bit-packed run past its end");
      }
      run.packed = true, run.offset = static_cast<uint32_t>(t.position() - bytes.data());
      t.advance(groups * static_cast<uint64_t>(bit_width));
      n += static_cast<int64_t>(std::min<uint64_t>(groups * 8, static_cast<uint64_t>(count - n)));
    } else {
      const uint64_t length = header >> 1;
      if (length == 0) t.fail("has an empty run");
      for (int b = 0; b < (bit_width + 7) / 8; ++b) run.value |= static_cast<uint32_t>(t.byte()) << (8 * b);
      if (bit_width < 32 && (run.value >> bit_width) != 0) t.fail("has a run value wider than its bit width");
      n += static_cast<int64_t>(std::min<uint64_t>(length, static_cast<uint64_t>(count - n)));
    }
    runs.push_back(run);
  }
  return runs;
}

int bit_width_of(int max_value) {
  int w = 0;
  while ((1 << w) <= max_value) ++w;
  return w;
}

// The n bytes at p of a page compressed with `codec` (data/formats/compression.h), which its header says are `expected`
// bytes decompressed: into `buffer`, or in place when uncompressed. `what` names the chunk.
std::string_view decompress(int codec, const char* p, int64_t n, int64_t expected, std::string& buffer,
                            const std::string& what) {
  // Bounded before allocating: by kMaxPageBytes, and by what deflate can expand n bytes to (1032:1).
  if (expected < 0 || expected > kMaxPageBytes || (codec == 2 && expected > 1032 * n + 1024)) {
    throw std::runtime_error(what + ": a page of " + std::to_string(n) + " bytes that says it holds " +
                             std::to_string(expected));
  }
  if (codec == 0) {
    if (n != expected) throw std::runtime_error(what + ": an uncompressed page of " + std::to_string(n) +
                                                " bytes that says " + std::to_string(expected));
    return {p, static_cast<size_t>(n)};
  }
  buffer.resize(static_cast<size_t>(expected));
  decompress_page(codec, p, n, buffer, what);
  return buffer;
}

// A data page's parts: its repetition levels, definition levels (each RLE / bit-packing hybrid runs; empty when the
// leaf has no such levels) and values. v1 compresses all three, each level block headed by its length; v2 stores
// the levels uncompressed before the values, their lengths in the header.
struct PageParts {
  std::string_view repetition, definition, values;
};
PageParts split_page(const PageHeader& h, const char* page, int codec, int max_repetition, int max_definition,
                     std::string& buffer, const std::string& what) {
  PageParts parts;
  if (h.type == kDataPage) {
    std::string_view rest = decompress(codec, page, h.compressed, h.uncompressed, buffer, what);
    auto levels = [&](int max_level, const char* kind) -> std::string_view {
      if (max_level == 0) return {};
      if (rest.size() < 4 || load_u32(rest.data()) > rest.size() - 4) {
        throw std::runtime_error(what + ": a page's " + kind + " levels pass its end");
      }
      const std::string_view out = rest.substr(4, load_u32(rest.data()));
      rest.remove_prefix(4 + out.size());
      return out;
    };
    parts.repetition = levels(max_repetition, "repetition");
    parts.definition = levels(max_definition, "definition");
    parts.values = rest;
    return parts;
  }
  if (h.rep_bytes < 0 || h.def_bytes < 0 || h.rep_bytes > h.compressed - h.def_bytes) {
    throw std::runtime_error(what + ": a v2 page's levels pass its end");
  }
  parts.repetition = std::string_view(page, static_cast<size_t>(h.rep_bytes));
  parts.definition = std::string_view(page + h.rep_bytes, static_cast<size_t>(h.def_bytes));
  const int64_t skip = h.rep_bytes + h.def_bytes;
  parts.values = h.compressed_values
                     ? decompress(codec, page + skip, h.compressed - skip, h.uncompressed - skip, buffer, what)
                     : std::string_view(page + skip, static_cast<size_t>(h.compressed - skip));
  return parts;
}

// `count` levels of at most max_level from hybrid runs (all 0 when max_level is 0: the level is implied).
std::vector<uint32_t> read_levels(std::string_view bytes, int max_level, int64_t count, const std::string& what) {
  std::vector<uint32_t> levels;
  if (max_level == 0) {
    levels.assign(static_cast<size_t>(count), 0);
    return levels;
  }
  Thrift t(bytes.data(), bytes.data() + bytes.size(), what);
  read_hybrid(t, bytes.data() + bytes.size(), bit_width_of(max_level), count, levels);
  for (uint32_t l : levels) {
    if (l > static_cast<uint32_t>(max_level)) t.fail("has a level above the leaf's");
  }
  return levels;
}

// The rows of a list leaf's data page: v2 says; v1's repetition levels are read (the page decompressed) and their
// zeros counted.
int64_t list_page_rows(const PageHeader& h, const char* page, int codec, int max_repetition, int max_definition,
                       const std::string& what) {
  if (h.type == kDataPageV2 && h.rows >= 0) return h.rows;
  std::string buffer;
  const PageParts parts = split_page(h, page, codec, max_repetition, max_definition, buffer, what);
  if (h.values < 0) throw std::runtime_error(what + ": a page of " + std::to_string(h.values) + " values");
  const std::vector<uint32_t> levels = read_levels(parts.repetition, max_repetition, h.values,
                                                   what + "'s repetition levels");
  return std::count(levels.begin(), levels.end(), 0u);
}

}  // namespace

// A leaf's values in one page: per row its definition level, and its value (whole numbers, or byte ranges).
//
// A list's leaf: per row the level of its first slot, whether an item is null (holes), and its items' range
// [offsets[r], offsets[r + 1]) of the page's values, which stay encoded in `data` and are decoded one by one when
// read (item()): a page of dictionary indices, 6 bits each for a vocabulary of 50 words, would decode to 10 times
// its bytes, and a shuffled epoch reads one row of a page at a time.
struct ParquetTable::Values {
  std::vector<uint8_t> level;
  std::vector<int64_t> ints;     // BOOLEAN, INT32, INT64
  std::vector<int64_t> offsets;  // BYTE_ARRAY: row r is data[offsets[r], offsets[r + 1]); a list's leaf: its items
  std::string data;
  std::vector<int64_t> item_bytes;  // a list of strings' leaf: item k is data[item_bytes[k], item_bytes[k + 1])
  std::vector<uint8_t> holes;
  // A list's leaf: PLAIN values of `width` bytes (0: booleans, a bit each), or the hybrid `runs` of `bit_width`
  // values: indices into `dictionary`'s ints, or (no dictionary) RLE booleans.
  int width = 0, bit_width = 0;
  bool is_signed = true;
  std::vector<HybridRun> runs;
  std::shared_ptr<const Values> dictionary;

  int64_t item(int64_t k) const;
  int64_t bytes() const {
    return static_cast<int64_t>(level.size() + holes.size() + 8 * (ints.size() + offsets.size() + item_bytes.size()) +
                                data.size() +
                                sizeof(HybridRun) * runs.size());
  }
};

int64_t ParquetTable::Values::item(int64_t k) const {
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  if (runs.empty()) {  // PLAIN: decode_page checked that every value lies in data
    if (width == 0) return (p[k >> 3] >> (k & 7)) & 1;
    if (width == 4) {
      int32_t v;
      std::memcpy(&v, p + 4 * k, 4);
      return is_signed ? v : static_cast<int64_t>(static_cast<uint32_t>(v));
    }
    int64_t v;
    std::memcpy(&v, p + 8 * k, 8);
    return v;
  }
  const HybridRun& run = *(std::upper_bound(runs.begin(), runs.end(), k,
                                            [](int64_t x, const HybridRun& r) { return x < r.first; }) - 1);
  const uint32_t v = !run.packed ? run.value
                                 : unpack(p + run.offset, data.size() - run.offset,
                                          static_cast<uint64_t>(k - run.first) * static_cast<uint64_t>(bit_width),
                                          bit_width);
  if (!dictionary) return v;
  if (v >= dictionary->ints.size()) {
    throw std::runtime_error("a dictionary index " + std::to_string(v) + " of " +
                             std::to_string(dictionary->ints.size()));
  }
  return dictionary->ints[v];
}

ParquetTable::ParquetTable(std::string_view bytes, std::string name) : bytes_(bytes), name_(std::move(name)) {
  const size_t size = bytes_.size();
  if (size >= 4 && bytes_.substr(size - 4) == "PARE") fail("an encrypted Parquet file, which is not read");
  if (size < 12 || bytes_.substr(0, 4) != "PAR1" || bytes_.substr(size - 4) != "PAR1") {
    fail("not a Parquet file (no PAR1 at its start and end; cut short?)");
  }
  const uint32_t footer = load_u32(bytes_.data() + size - 8);
  if (footer > size - 12) {
    fail("a footer of " + std::to_string(footer) + " bytes in a " + std::to_string(size) + "-byte file");
  }
  const std::string what = name_ + ": the footer";
  Thrift t(bytes_.data() + size - 8 - footer, bytes_.data() + size - 8, what);
  const FileMetadata file = read_file_metadata(t);
  if (file.schema.empty() || file.num_rows < 0) fail("a footer without a schema or a row count");
  metadata_ = file.key_values;

  // The schema's tree, depth first from the root (schema[0], the table itself, not a column).
  size_t next = 1;
  for (int i = 0; i < file.schema[0].num_children; ++i) add_column(file.schema, next, -1, 0, 0, 0, 0);
  if (next != file.schema.size()) {
    fail("a schema of " + std::to_string(file.schema.size()) + " elements, its tree " + std::to_string(next));
  }
  add_row_groups(file.row_groups, file.num_rows, static_cast<int64_t>(size - 8 - footer));
}

void ParquetTable::add_column(const std::vector<SchemaElement>& schema, size_t& next, int parent, int level,
                              int repetition, int item_level, int depth) {
  if (next >= schema.size()) fail("a schema whose groups claim more children than it has");
  if (depth > kMaxThriftDepth) fail("a schema nested deeper than " + std::to_string(kMaxThriftDepth));
  const SchemaElement& e = schema[next++];
  TableColumn c;
  Node node;
  c.path = parent < 0 ? e.name : columns_[static_cast<size_t>(parent)].path + "." + e.name;
  c.parent = parent;
  node.level = level + (e.repetition != kRequired ? 1 : 0);
  node.repetition = repetition + (e.repetition == kRepeated ? 1 : 0);
  node.item_level = e.repetition == kRepeated ? node.level : item_level;
  const TableColumn* up = parent < 0 ? nullptr : &columns_[static_cast<size_t>(parent)];
  c.per_row = e.repetition != kRepeated && (!up || (up->kind == ColumnKind::STRUCT && up->per_row));
  const bool group = e.num_children > 0 || e.type < 0;
  if (group) {
    const bool list = e.converted == 1 || e.converted == 3 || e.logical == 2 || e.logical == 3;
    c.kind = list ? ColumnKind::LIST : ColumnKind::STRUCT;
    c.type = list ? "list" : "struct";
  } else {
    node.physical = e.type;
    node.leaf = static_cast<int>(leaves_.size());
    leaves_.push_back(static_cast<int>(columns_.size()));
    describe_leaf(e, c);
  }
  columns_.push_back(c);
  nodes_.push_back(node);
  const int self_index = static_cast<int>(columns_.size()) - 1;
  for (int i = 0; i < e.num_children; ++i) {
    add_column(schema, next, self_index, node.level, node.repetition, node.item_level, depth + 1);
  }
  // A list of one scalar leaf one repetition below it (pyarrow's `list.element`, the legacy `array`): its items.
  const size_t last = columns_.size() - 1;
  if (c.kind == ColumnKind::LIST && nodes_[last].leaf >= 0 && nodes_[last].repetition == node.repetition + 1 &&
      std::count_if(nodes_.begin() + self_index, nodes_.end(), [](const Node& n) { return n.leaf >= 0; }) == 1 &&
      columns_[last].kind != ColumnKind::OTHER) {
    columns_[static_cast<size_t>(self_index)].items = static_cast<int>(last);
  }
  nodes_[static_cast<size_t>(self_index)].first_leaf =
      node.leaf >= 0 ? node.leaf : (static_cast<size_t>(self_index) + 1 < columns_.size()
                                        ? nodes_[static_cast<size_t>(self_index) + 1].first_leaf : -1);
}

void ParquetTable::add_row_groups(const std::vector<std::pair<int64_t, std::vector<ChunkMeta>>>& row_groups,
                                  int64_t num_rows, int64_t footer_start) {
  for (const auto& [group_rows, chunks] : row_groups) {
    const std::string where = "row group " + std::to_string(groups_.size());
    if (group_rows < 0 || group_rows > num_rows - rows_) fail(where + " has " + std::to_string(group_rows) + " rows");
    if (chunks.size() != leaves_.size()) {
      fail(where + " has " + std::to_string(chunks.size()) + " column chunks for " + std::to_string(leaves_.size()) +
           " columns");
    }
    Group g;
    g.first_row = rows_, g.rows = group_rows;
    for (size_t l = 0; l < chunks.size(); ++l) {
      const ChunkMeta& m = chunks[l];
      const std::string& column = columns_[static_cast<size_t>(leaves_[l])].path;
      if (m.external) fail(where + ": column '" + column + "' is stored in another file, which is not read");
      Chunk c;
      c.codec = m.codec;
      c.start = m.dictionary_page > 0 && m.dictionary_page < m.data_page ? m.dictionary_page : m.data_page;
      c.size = m.compressed;
      if (c.start < 4 || c.size < 0 || c.start > footer_start || c.size > footer_start - c.start) {
        fail(where + ": column '" + column + "' has " + std::to_string(c.size) + " bytes at " +
             std::to_string(c.start) + ", outside the data before the footer (" + std::to_string(footer_start) + ")");
      }
      if (m.type != nodes_[static_cast<size_t>(leaves_[l])].physical) {
        fail(where + ": column '" + column + "' holds type " + std::to_string(m.type) + ", its schema says " +
             std::to_string(nodes_[static_cast<size_t>(leaves_[l])].physical));
      }
      g.chunks.push_back(c);
    }
    rows_ += group_rows;
    groups_.push_back(std::move(g));
  }
  if (rows_ != num_rows) fail("row groups of " + std::to_string(rows_) + " rows, the footer says " +
                              std::to_string(num_rows));
}

ParquetTable::~ParquetTable() = default;

void ParquetTable::fail(const std::string& what) const { throw std::runtime_error(name_ + ": " + what); }

std::string ParquetTable::metadata(const std::string& key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return v;
  }
  return "";
}

std::shared_ptr<const ParquetTable::Values> ParquetTable::values(int column, int64_t& row) const {
  if (column < 0 || static_cast<size_t>(column) >= columns_.size()) fail("no column " + std::to_string(column));
  const TableColumn& c = columns_[static_cast<size_t>(column)];
  if (!c.per_row) fail("column '" + c.path + "' holds a list's items, not a value per row");
  if (row < 0 || row >= rows_) fail("row " + std::to_string(row) + " of " + std::to_string(rows_));
  const int leaf =
      c.items >= 0 ? nodes_[static_cast<size_t>(c.items)].leaf : nodes_[static_cast<size_t>(column)].first_leaf;
  if (leaf < 0) fail("column '" + c.path + "' has no values (an empty group)");
  if (c.items < 0 && (c.kind == ColumnKind::LIST ||
                      !columns_[static_cast<size_t>(leaves_[static_cast<size_t>(leaf)])].per_row)) {
    fail("column '" + c.path + "' is a list of lists or structs (or a struct whose first field is a list), whose rows "
         "are not read");
  }
  const auto g = std::upper_bound(groups_.begin(), groups_.end(), row,
                                  [](int64_t r, const Group& x) { return r < x.first_row; }) - 1;
  const auto group = static_cast<size_t>(g - groups_.begin());
  row -= g->first_row;
  const std::shared_ptr<const Pages> index = pages(leaf, group);
  const auto page = std::upper_bound(index->data.begin(), index->data.end(), row,
                                     [](int64_t r, const Page& x) { return r < x.first_row; }) - 1;
  row -= page->first_row;
  const auto page_number = static_cast<int64_t>(page - index->data.begin());
  const int64_t chunk = static_cast<int64_t>(group) * static_cast<int64_t>(leaves_.size()) + leaf;
  if (auto hit = cached({chunk, page_number})) return hit;
  // Decoded outside the lock (another thread may decode the same page meanwhile: the same values, kept once).
  std::shared_ptr<const Values> dictionary;
  if (index->dictionary >= 0) {
    dictionary = cached({chunk, -1});
    if (!dictionary) dictionary = keep({chunk, -1}, decode_page(leaf, group, index->dictionary, 0, nullptr));
  }
  return keep({chunk, page_number}, decode_page(leaf, group, page->header, page->rows, std::move(dictionary)));
}

std::shared_ptr<const ParquetTable::Values> ParquetTable::cached(std::pair<int64_t, int64_t> key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if (it->first != key) continue;
    cache_.splice(cache_.begin(), cache_, it);
    return cache_.front().second;
  }
  return nullptr;
}

std::shared_ptr<const ParquetTable::Values> ParquetTable::keep(std::pair<int64_t, int64_t> key,
                                                               std::shared_ptr<const Values> values) const {
  std::lock_guard<std::mutex> lock(mutex_);
  cache_.emplace_front(key, values);
  cached_bytes_ += values->bytes();
  while (cache_.size() > 1 && cached_bytes_ > kCacheBytes) {
    cached_bytes_ -= cache_.back().second->bytes();
    cache_.pop_back();
  }
  return values;
}

std::shared_ptr<const ParquetTable::Pages> ParquetTable::pages(int leaf, size_t group) const {
  const int64_t chunk_key = static_cast<int64_t>(group) * static_cast<int64_t>(leaves_.size()) + leaf;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = pages_.find(chunk_key);
    if (it != pages_.end()) return it->second;
  }
  // The page headers, read one after another through the chunk (no page is decompressed).
  const Group& g = groups_[group];
  const Chunk& chunk = g.chunks[static_cast<size_t>(leaf)];
  const Node& node = nodes_[static_cast<size_t>(leaves_[static_cast<size_t>(leaf)])];
  const std::string what = where(leaf, group);
  auto out = std::make_shared<Pages>();
  const char* begin = bytes_.data();
  const char* p = begin + chunk.start;
  const char* end = p + chunk.size;
  int64_t rows = 0;
  while (rows < g.rows) {
    if (p >= end) {
      throw std::runtime_error(what + " ends after " + std::to_string(rows) + " of " + std::to_string(g.rows) +
                               " rows");
    }
    Thrift t(p, end, what + "'s page header");
    const PageHeader h = read_page_header(t);
    if (h.compressed < 0 || h.compressed > end - t.position()) {
      throw std::runtime_error(what + ": a page of " + std::to_string(h.compressed) + " bytes past the chunk's end");
    }
    if (h.type == kDictionaryPage) {
      if (out->dictionary >= 0 || !out->data.empty()) throw std::runtime_error(what + ": a second dictionary page");
      out->dictionary = p - begin;
    } else if (h.type == kDataPage || h.type == kDataPageV2) {
      const int64_t page_rows =
          node.repetition == 0 ? h.values
                               : list_page_rows(h, t.position(), chunk.codec, node.repetition, node.level, what);
      if (page_rows < 0 || page_rows > g.rows - rows) {
        throw std::runtime_error(what + ": a page of " + std::to_string(page_rows) + " rows with " +
                                 std::to_string(g.rows - rows) + " rows left");
      }
      if (page_rows > 0) out->data.push_back(Page{p - begin, rows, page_rows});
      rows += page_rows;
    } else if (h.type != kIndexPage) {
      throw std::runtime_error(what + ": a page of unknown type " + std::to_string(h.type));
    }
    p = t.position() + h.compressed;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return pages_.emplace(chunk_key, out).first->second;
}

std::string ParquetTable::where(int leaf, size_t group) const {
  return name_ + ": column '" + columns_[static_cast<size_t>(leaves_[static_cast<size_t>(leaf)])].path +
         "' in row group " + std::to_string(group);
}

namespace {

// `count` PLAIN values of Parquet type `physical` from `t` (up to `end`) into `out` (a ParquetTable::Values): ints
// (a float's or double's bits) or (offsets, data).
template <class Values>
void read_plain(Thrift& t, const char* end, int64_t count, int physical, bool is_signed, Values& out) {
  if (physical == kBoolean) {
    for (int64_t i = 0; i < count; ++i) {
      if (i % 8 == 0 && end - t.position() < 1) t.fail("ends inside its booleans");
      out.ints.push_back((static_cast<uint8_t>(t.position()[0]) >> (i % 8)) & 1);
      if (i % 8 == 7 || i + 1 == count) t.byte();
    }
  } else if (physical != kByteArray) {
    const int width = physical == kInt32 || physical == kFloat ? 4 : 8;
    if (count > (end - t.position()) / width) t.fail("ends inside its values");
    for (int64_t i = 0; i < count; ++i) {
      int64_t v = 0;
      if (width == 4) {
        int32_t w;
        std::memcpy(&w, t.position(), 4);
        v = is_signed ? w : static_cast<int64_t>(static_cast<uint32_t>(w));
      } else {
        std::memcpy(&v, t.position(), 8);
      }
      out.ints.push_back(v);
      t.advance(static_cast<uint64_t>(width));
    }
  } else {
    if (out.offsets.empty()) out.offsets.push_back(0);
    for (int64_t i = 0; i < count; ++i) {
      if (end - t.position() < 4) t.fail("ends inside its values");
      const uint32_t n = load_u32(t.position());
      t.advance(4);
      if (n > static_cast<uint64_t>(end - t.position())) t.fail("has a value past its end");
      out.data.append(t.position(), n);
      t.advance(n);
      out.offsets.push_back(static_cast<int64_t>(out.data.size()));
    }
  }
}

// The `present` values of a data page (header `h`, its values' bytes `values_bytes`), decoded whole: ints, or
// (offsets, data) for byte arrays. `dictionary`: the chunk's (null: none), for dictionary indices.
template <class Values>
Values read_present(const PageHeader& h, std::string_view values_bytes, int64_t present, int physical,
                    bool is_signed, const Values* dictionary, const std::string& what) {
  Values present_values;
  Thrift vt(values_bytes.data(), values_bytes.data() + values_bytes.size(), what + "'s values");
  const char* values_end = values_bytes.data() + values_bytes.size();
  if (h.encoding == kPlain) {
    read_plain(vt, values_end, present, physical, is_signed, present_values);
  } else if (h.encoding == kPlainDictionary || h.encoding == kRleDictionary) {
    if (!dictionary) throw std::runtime_error(what + ": dictionary indices without a dictionary page");
    std::vector<uint32_t> indices;
    if (present > 0) read_hybrid(vt, values_end, vt.byte(), present, indices);
    const size_t dict_size = physical == kByteArray ? dictionary->offsets.size() - 1 : dictionary->ints.size();
    if (physical == kByteArray) present_values.offsets.push_back(0);
    for (uint32_t i : indices) {
      if (i >= dict_size) throw std::runtime_error(what + ": dictionary index " + std::to_string(i) + " of " +
                                                   std::to_string(dict_size));
      if (physical == kByteArray) {
        present_values.data.append(dictionary->data, static_cast<size_t>(dictionary->offsets[i]),
                                   static_cast<size_t>(dictionary->offsets[i + 1] - dictionary->offsets[i]));
        present_values.offsets.push_back(static_cast<int64_t>(present_values.data.size()));
      } else {
        present_values.ints.push_back(dictionary->ints[i]);
      }
    }
  } else if (h.encoding == kDeltaBinaryPacked && (physical == kInt32 || physical == kInt64)) {
    read_delta(vt, values_end, present, present_values.ints);
    for (int64_t& v : present_values.ints) v = as_physical(v, physical, is_signed);
  } else if ((h.encoding == kDeltaLengthByteArray || h.encoding == kDeltaByteArray) && physical == kByteArray) {
    present_values.offsets.push_back(0);
    read_delta_strings(vt, values_end, present, h.encoding == kDeltaByteArray, present_values.data,
                       present_values.offsets);
  } else if (h.encoding == kByteStreamSplit && (physical == kFloat || physical == kDouble64)) {
    // value i's byte b at b * present + i: the streams of each byte position one after another
    const auto width = static_cast<size_t>(physical == kFloat ? 4 : 8), n = static_cast<size_t>(present);
    if (values_bytes.size() / width < n) throw std::runtime_error(what + ": its split bytes end inside the values");
    for (size_t i = 0; i < n; ++i) {
      uint64_t v = 0;
      for (size_t b = 0; b < width; ++b) v |= uint64_t{static_cast<uint8_t>(values_bytes[b * n + i])} << (8 * b);
      present_values.ints.push_back(static_cast<int64_t>(v));
    }
  } else if (h.encoding == kRle && physical == kBoolean) {  // v2 pages' booleans: a length, then width-1 runs
    if (values_bytes.size() < 4 || load_u32(values_bytes.data()) > values_bytes.size() - 4) {
      throw std::runtime_error(what + ": RLE booleans pass the page's end");
    }
    const char* runs_end = values_bytes.data() + 4 + load_u32(values_bytes.data());
    Thrift rt(values_bytes.data() + 4, runs_end, what + "'s values");
    std::vector<uint32_t> bits;
    read_hybrid(rt, runs_end, 1, present, bits);
    present_values.ints.assign(bits.begin(), bits.end());
  } else {
    throw std::runtime_error(what + " is in encoding " + std::to_string(h.encoding) +
                             ", which is not read (PLAIN, dictionary, DELTA_* and a float's BYTE_STREAM_SPLIT "
                             "are)");
  }
  return present_values;
}

}  // namespace

std::shared_ptr<const ParquetTable::Values> ParquetTable::decode_page(int leaf, size_t group, int64_t header,
                                                                      int64_t rows,
                                                                      std::shared_ptr<const Values> dictionary) const {
  const int column = leaves_[static_cast<size_t>(leaf)];
  const TableColumn& c = columns_[static_cast<size_t>(column)];
  const Node& node = nodes_[static_cast<size_t>(column)];
  const Chunk& chunk = groups_[group].chunks[static_cast<size_t>(leaf)];
  const std::string what = where(leaf, group);
  const int physical = node.physical;
  if (physical != kBoolean && physical != kInt32 && physical != kInt64 && physical != kFloat &&
      physical != kDouble64 && physical != kByteArray) {
    throw std::runtime_error(what + " holds " + c.type + " values, which are not read");
  }
  std::string buffer;  // the decompressed page
  const char* chunk_end = bytes_.data() + chunk.start + chunk.size;
  Thrift ht(bytes_.data() + header, chunk_end, what + "'s page header");
  const PageHeader h = read_page_header(ht);
  const char* page = ht.position();  // pages() checked that the page lies inside the chunk
  auto out = std::make_shared<Values>();
  out->is_signed = c.is_signed;
  if (h.type == kDictionaryPage) {
    if (h.encoding != kPlain && h.encoding != kPlainDictionary) {
      throw std::runtime_error(what + ": a dictionary page in encoding " + std::to_string(h.encoding));
    }
    if (h.values < 0) throw std::runtime_error(what + ": a dictionary of " + std::to_string(h.values) + " values");
    const std::string_view d = decompress(chunk.codec, page, h.compressed, h.uncompressed, buffer, what);
    Thrift t(d.data(), d.data() + d.size(), what + "'s dictionary");
    read_plain(t, d.data() + d.size(), h.values, physical, c.is_signed, *out);
    if (physical == kByteArray && out->offsets.empty()) out->offsets.push_back(0);
    return out;
  }
  // The levels, then the values; a list's leaf has a slot per item (an empty or null list: one slot), each
  // repetition level 0 starting a row.
  const int max_level = node.level, max_repetition = node.repetition;
  const int64_t slots = max_repetition > 0 ? h.values : rows;
  if (slots < 0) throw std::runtime_error(what + ": a page of " + std::to_string(slots) + " values");
  const PageParts parts = split_page(h, page, chunk.codec, max_repetition, max_level, buffer, what);
  const std::vector<uint32_t> repetitions = read_levels(parts.repetition, max_repetition, slots,
                                                        what + "'s repetition levels");
  const std::vector<uint32_t> levels = read_levels(parts.definition, max_level, slots, what + "'s definition levels");
  auto decode_present = [&](int64_t present) {
    return read_present(h, parts.values, present, physical, c.is_signed, dictionary.get(), what);
  };
  if (max_repetition > 0) {
    fill_list(*out, what, physical, h.encoding, parts.values, repetitions, levels, max_level, node.item_level, rows,
              dictionary);
    if (physical == kByteArray) {  // a list of strings: its items decoded whole (at most a page's)
      Values strings = decode_present(out->offsets.back());
      out->data = std::move(strings.data);
      out->item_bytes = std::move(strings.offsets);
    }
    return out;
  }
  int64_t present = 0;
  for (uint32_t l : levels) present += l == static_cast<uint32_t>(max_level);
  // The present values, then spread over the rows (a null row: no value, an empty range).
  Values present_values = decode_present(present);
  // A null row holds nothing: the bytes are the present values' as they are, each row's range an offset apart.
  out->data = std::move(present_values.data);
  out->offsets.push_back(0);
  size_t k = 0;
  for (uint32_t l : levels) {
    out->level.push_back(static_cast<uint8_t>(l));
    const bool defined = l == static_cast<uint32_t>(max_level);
    if (physical == kByteArray) {
      out->offsets.push_back(defined ? present_values.offsets[k + 1] : out->offsets.back());
    } else {
      out->ints.push_back(defined ? present_values.ints[k] : 0);
    }
    k += defined;
  }
  return out;
}

void ParquetTable::fill_list(Values& out, const std::string& what, int physical, int encoding,
                             std::string_view values, const std::vector<uint32_t>& repetitions,
                             const std::vector<uint32_t>& levels, int max_level, int item_level, int64_t rows,
                             std::shared_ptr<const Values> dictionary) {
  if (physical == kFloat || physical == kDouble64) {
    throw std::runtime_error(what + " holds lists of floats, which are not read");
  }
  int64_t present = 0;
  for (size_t i = 0; i < levels.size(); ++i) {
    if (repetitions[i] == 0) {
      out.offsets.push_back(present);
      out.level.push_back(static_cast<uint8_t>(levels[i]));
      out.holes.push_back(0);
    } else if (i == 0) {
      throw std::runtime_error(what + ": a page that starts inside a row, which is not read");
    }
    if (levels[i] == static_cast<uint32_t>(max_level)) {
      ++present;
    } else if (levels[i] >= static_cast<uint32_t>(item_level)) {
      out.holes.back() = 1;  // a null item
    }
  }
  out.offsets.push_back(present);
  if (static_cast<int64_t>(out.level.size()) != rows) {
    throw std::runtime_error(what + ": a page of " + std::to_string(out.level.size()) + " rows, its index says " +
                             std::to_string(rows));
  }
  if (physical == kByteArray) return;  // strings: decode_page decodes the items whole
  if (encoding == kPlain) {
    out.width = physical == kBoolean ? 0 : physical == kInt32 ? 4 : 8;
    const int64_t needed = out.width == 0 ? (present + 7) / 8 : present * out.width;
    if (needed > static_cast<int64_t>(values.size())) {
      throw std::runtime_error(what + ": a page of " + std::to_string(present) + " values in " +
                               std::to_string(values.size()) + " bytes");
    }
    out.data = std::string(values.substr(0, static_cast<size_t>(needed)));
    return;
  }
  if (encoding == kDeltaBinaryPacked && (physical == kInt32 || physical == kInt64)) {
    // Each value depends on all before it: decoded whole, kept as PLAIN values.
    std::vector<int64_t> decoded;
    Thrift t(values.data(), values.data() + values.size(), what + "'s values");
    read_delta(t, values.data() + values.size(), present, decoded);
    out.width = physical == kInt32 ? 4 : 8;  // as PLAIN values of the physical type: INT32 keeps 4 bytes each
    out.data.resize(decoded.size() * static_cast<size_t>(out.width));
    for (size_t i = 0; i < decoded.size(); ++i) {
      const auto v = static_cast<uint64_t>(decoded[i]);  // little-endian: the low bytes first
      std::memcpy(out.data.data() + i * static_cast<size_t>(out.width), &v, static_cast<size_t>(out.width));
    }
    return;
  }
  if (encoding == kPlainDictionary || encoding == kRleDictionary) {
    if (!dictionary) throw std::runtime_error(what + ": dictionary indices without a dictionary page");
    if (values.empty() && present > 0) throw std::runtime_error(what + ": a page without its indices' bit width");
    out.bit_width = values.empty() ? 0 : static_cast<uint8_t>(values[0]);
    out.data = std::string(values.substr(values.empty() ? 0 : 1));
    out.dictionary = std::move(dictionary);
  } else if (encoding == kRle && physical == kBoolean) {  // v2 pages' booleans: a length, then width-1 runs
    if (values.size() < 4 || load_u32(values.data()) > values.size() - 4) {
      throw std::runtime_error(what + ": RLE booleans pass the page's end");
    }
    out.bit_width = 1;
    out.data = std::string(values.substr(4, load_u32(values.data())));
  } else {
    throw std::runtime_error(what + " is in encoding " + std::to_string(encoding) +
                             ", which is not read (PLAIN, dictionary and DELTA_BINARY_PACKED encodings are)");
  }
  out.runs = index_hybrid(out.data, out.bit_width, present, what + "'s values");
  if (out.runs.empty()) out.runs.push_back(HybridRun{});  // no values: item() is never asked, runs marks the kind
}

bool ParquetTable::is_null(int column, int64_t row) const {
  const auto v = values(column, row);
  return v->level[static_cast<size_t>(row)] < nodes_[static_cast<size_t>(column)].level;
}

std::string ParquetTable::bytes(int column, int64_t row) const {
  const TableColumn& c = columns_.at(static_cast<size_t>(column));
  if (c.kind != ColumnKind::UTF8 && c.kind != ColumnKind::BINARY) {
    fail("column '" + c.path + "' holds " + c.type + ", not strings or bytes");
  }
  const auto v = values(column, row);
  const auto r = static_cast<size_t>(row);
  return v->data.substr(static_cast<size_t>(v->offsets[r]), static_cast<size_t>(v->offsets[r + 1] - v->offsets[r]));
}

std::vector<int64_t> ParquetTable::integers(int column, int64_t row) const {
  const TableColumn& c = columns_.at(static_cast<size_t>(column));
  const TableColumn* items = c.items >= 0 ? &columns_[static_cast<size_t>(c.items)] : nullptr;
  if (!items || (items->kind != ColumnKind::INT && items->kind != ColumnKind::BOOL)) {
    fail("column '" + c.path + "' holds " + c.type + (items ? " of " + items->type : "") +
         ", not lists of whole numbers");
  }
  const int64_t asked = row;
  const auto v = values(column, row);
  const auto r = static_cast<size_t>(row);
  if (v->level[r] < nodes_[static_cast<size_t>(column)].level) return {};  // a null list
  if (v->holes[r]) fail("column '" + c.path + "' has a null item in row " + std::to_string(asked));
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(v->offsets[r + 1] - v->offsets[r]));
  try {
    for (int64_t k = v->offsets[r]; k < v->offsets[r + 1]; ++k) out.push_back(v->item(k));
  } catch (const std::runtime_error& e) {
    fail("column '" + c.path + "' in row " + std::to_string(asked) + ": " + e.what());
  }
  return out;
}

std::vector<std::string> ParquetTable::strings(int column, int64_t row) const {
  const TableColumn& c = columns_.at(static_cast<size_t>(column));
  const TableColumn* items = c.items >= 0 ? &columns_[static_cast<size_t>(c.items)] : nullptr;
  if (!items || items->kind != ColumnKind::UTF8) {
    fail("column '" + c.path + "' holds " + c.type + (items ? " of " + items->type : "") + ", not lists of strings");
  }
  const int64_t asked = row;
  const auto v = values(column, row);
  const auto r = static_cast<size_t>(row);
  if (v->level[r] < nodes_[static_cast<size_t>(column)].level) return {};  // a null list
  if (v->holes[r]) fail("column '" + c.path + "' has a null item in row " + std::to_string(asked));
  std::vector<std::string> out;
  for (int64_t k = v->offsets[r]; k < v->offsets[r + 1]; ++k) {
    const auto first = static_cast<size_t>(v->item_bytes[static_cast<size_t>(k)]);
    out.push_back(v->data.substr(first, static_cast<size_t>(v->item_bytes[static_cast<size_t>(k) + 1]) - first));
  }
  return out;
}

double ParquetTable::number(int column, int64_t row) const {
  const TableColumn& c = columns_.at(static_cast<size_t>(column));
  if (c.kind == ColumnKind::INT || c.kind == ColumnKind::BOOL) return static_cast<double>(integer(column, row));
  if (c.kind != ColumnKind::FLOAT) fail("column '" + c.path + "' holds " + c.type + ", not numbers");
  const auto v = values(column, row);
  const int64_t bits = v->ints[static_cast<size_t>(row)];  // 0 for a null row
  if (c.width == 4) {
    const auto low = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &low, 4);
    return f;
  }
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

int64_t ParquetTable::integer(int column, int64_t row) const {
  const TableColumn& c = columns_.at(static_cast<size_t>(column));
  if (c.kind != ColumnKind::INT && c.kind != ColumnKind::BOOL) {
    fail("column '" + c.path + "' holds " + c.type + ", not whole numbers");
  }
  const auto v = values(column, row);
  return v->ints[static_cast<size_t>(row)];
}

const char* parquet_codec_name(int codec) {
  static constexpr const char* kNames[] = {"uncompressed", "snappy", "gzip", "lzo", "brotli", "lz4", "zstd", "lz4_raw"};
  return codec >= 0 && codec <= 7 ? kNames[codec] : "an unknown codec";
}

std::unique_ptr<ColumnTable> open_parquet(std::string_view bytes, std::string name) {
  return std::make_unique<ParquetTable>(bytes, std::move(name));
}

}  // namespace shardtrain::data
