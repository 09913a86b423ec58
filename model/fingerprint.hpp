// model/fingerprint.hpp — FNV-1a 64 over bytes, written as 16 hex digits:
// the fingerprints that tell apart things meant to be equal (an adapter's
// copies, a model's weight files on each machine). They catch accidents,
// not forgery.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace corolla {

class fingerprint {
 public:
  /// Folds `n` bytes at `data` in.
  void mix(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * 1099511628211ull;
  }
  /// The hash so far as 16 lowercase hex digits.
  std::string hex() const {
    static const char* const digits = "0123456789abcdef";
    std::string out(16, '0');
    std::uint64_t h = h_;
    for (int i = 15; i >= 0; --i, h >>= 4) out[static_cast<std::size_t>(i)] = digits[h & 15];
    return out;
  }

 private:
  std::uint64_t h_ = 14695981039346656037ull;  // FNV-1a 64's offset basis
};

}  // namespace corolla
