#include "ckpt/copy_checked.h"

#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace shardtrain::ckpt {
namespace {

#if defined(__x86_64__)
// 16 bytes at a time (SSE2, every x86-64 has it): loaded, streamed to `dst`, and their exponent fields compared with
// all ones — `exponent` the field's bits in each lane of `lane_bytes` (2 or 4; an 8-byte double's field is in the
// upper 4 bytes, `select` keeps only those lanes' results). The tail (under 16 bytes) as plain bytes, checked by the
// caller's scalar rule.
bool any_all_ones(void* dst, const void* src, int64_t nbytes, __m128i exponent, __m128i select, int lane_bytes) {
  const auto* from = static_cast<const char*>(src);
  auto* to = static_cast<char*>(dst);
  __m128i hits = _mm_setzero_si128();
  const int64_t whole = nbytes / 16 * 16;
  for (int64_t at = 0; at < whole; at += 16) {
    const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + at));
    _mm_stream_si128(reinterpret_cast<__m128i*>(to + at), w);
    const __m128i field = _mm_and_si128(w, exponent);
    const __m128i equal = lane_bytes == 2 ? _mm_cmpeq_epi16(field, exponent) : _mm_cmpeq_epi32(field, exponent);
    hits = _mm_or_si128(hits, _mm_and_si128(equal, select));
  }
  _mm_sfence();  // the streamed stores are seen by the writer thread (and any other) before what follows
  std::memcpy(to + whole, from + whole, static_cast<size_t>(nbytes - whole));
  return _mm_movemask_epi8(hits) != 0;
}
#endif

// The elements of bytes [from_byte, nbytes) one at a time (the tail the 16-byte loop left): `field` the exponent's
// bits of one.
template <typename Word>
bool tail_not_finite(const void* src, int64_t from_byte, int64_t nbytes, Word field) {
  const auto* bytes = static_cast<const char*>(src);
  for (int64_t at = from_byte; at + static_cast<int64_t>(sizeof(Word)) <= nbytes; at += sizeof(Word)) {
    Word w;
    std::memcpy(&w, bytes + at, sizeof(Word));
    if ((w & field) == field) return true;
  }
  return false;
}

}  // namespace

Finiteness copy_checked(void* dst, const void* src, int64_t nbytes, c10::ScalarType dtype) {
  const bool floating = c10::isFloatingType(dtype);
  uint64_t field = 0;  // the exponent's bits in one element
  int lane_bytes = 0;
  switch (dtype) {
    case c10::ScalarType::Float: field = 0x7F800000u, lane_bytes = 4; break;
    case c10::ScalarType::BFloat16: field = 0x7F80u, lane_bytes = 2; break;
    case c10::ScalarType::Half: field = 0x7C00u, lane_bytes = 2; break;
    case c10::ScalarType::Double: field = 0x7FF0000000000000ull, lane_bytes = 8; break;
    default: break;
  }
#if defined(__x86_64__)
  if (floating && lane_bytes == 0) {  // float8 and the rest: copied, checked elsewhere
    std::memcpy(dst, src, static_cast<size_t>(nbytes));
    return Finiteness::UNCHECKED;
  }
  if (!floating) {  // bytes to copy, nothing to check: the same streamed copy
    any_all_ones(dst, src, nbytes, _mm_setzero_si128(), _mm_setzero_si128(), 4);
    return Finiteness::FINITE;
  }
  __m128i exponent, select = _mm_set1_epi32(-1);
  if (lane_bytes == 2) {
    exponent = _mm_set1_epi16(static_cast<int16_t>(field));
  } else if (lane_bytes == 4) {
    exponent = _mm_set1_epi32(static_cast<int32_t>(field));
  } else {  // a double's exponent in the upper half of each 8 bytes (little-endian): compare those lanes only
    exponent = _mm_set_epi32(0x7FF00000, 0, 0x7FF00000, 0);
    select = _mm_set_epi32(-1, 0, -1, 0);
    lane_bytes = 4;
  }
  const bool hit = any_all_ones(dst, src, nbytes, exponent, select, lane_bytes);
  const int64_t tail = nbytes / 16 * 16;
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  const bool tail_hit = element == 2   ? tail_not_finite<uint16_t>(src, tail, nbytes, static_cast<uint16_t>(field))
                        : element == 4 ? tail_not_finite<uint32_t>(src, tail, nbytes, static_cast<uint32_t>(field))
                                       : tail_not_finite<uint64_t>(src, tail, nbytes, field);
  return hit || tail_hit ? Finiteness::NOT_FINITE : Finiteness::FINITE;
#else
  std::memcpy(dst, src, static_cast<size_t>(nbytes));
  return floating ? Finiteness::UNCHECKED : Finiteness::FINITE;
#endif
}

}  // namespace shardtrain::ckpt
