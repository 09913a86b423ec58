// model/block_range.hpp — a half-open range of a model's transformer blocks:
// what a swarm server holds and announces (net/server_record.hpp), what
// routing and block selection reason about (schedule/swarm.hpp), what a
// client's route hop covers. One type in the lowest layer both net/ and
// schedule/ see.
#pragma once

#include <string>

namespace corolla {

/// The blocks [start, end) of a model.
struct block_range {
  int start = 0;  ///< first block
  int end = 0;    ///< one past the last block

  /// Number of blocks (0 when empty or inverted).
  int length() const { return end > start ? end - start : 0; }
  /// True when the range holds no block.
  bool empty() const { return end <= start; }
  /// True when block `b` lies in [start, end).
  bool contains(int b) const { return start <= b && b < end; }
  /// True when the two ranges share at least one block.
  bool overlaps(const block_range& o) const { return start < o.end && o.start < end; }
  friend bool operator==(const block_range&, const block_range&) = default;
};

/// "[3, 7)": how ranges appear in messages and logs.
inline std::string to_string(const block_range& r) {
  // Appending to a named string (not "[" + temporary) also avoids GCC 12's
  // false -Wrestrict warning on operator+(const char*, string&&).
  std::string out = "[";
  out += std::to_string(r.start);
  out += ", ";
  out += std::to_string(r.end);
  out += ")";
  return out;
}

}  // namespace corolla
