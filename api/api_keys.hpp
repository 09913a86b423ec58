// api/api_keys.hpp — the keys `corolla api` accepts, each a tenant's.
//
// `--api-key KEY` gives one key; `--api-key-file FILE` gives many, one a
// line, each with the tenant it belongs to:
//
//   # tenant  key
//   acme      sk-acme-2d8f...
//   acme      sk-acme-rotated-91c2...   (a second key of the same tenant)
//   globex    sk-globex-7e01...
//
// A request's tenant is the one whose key it carries. Tenants never share
// caches (api/http_api.cpp: the tenant is part of every request's cache
// domain, with the request's cache_salt), so `cached_tokens` and the time
// to the first token tell no tenant anything of another's prompts.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace corolla::api {

class api_keys {
 public:
  /// No key: every request is admitted, as the tenant "".
  api_keys() = default;
  /// The one key `key` (not empty), of the tenant "".
  static api_keys single(std::string key);
  /// The keys in `text` (an --api-key-file): lines of a tenant name (1 to
  /// 64 of A-Z a-z 0-9 . _ -) and a key (1 to 512 printable ASCII
  /// characters, no space), separated by spaces or tabs; blank lines and
  /// lines starting with '#' are skipped. Throws std::invalid_argument
  /// naming `source` and the line: a malformed line, a key given twice, or
  /// no key at all.
  static api_keys parse(std::string_view text, const std::string& source);

  /// Whether `name` is a tenant name as a key file gives them (1 to 64 of
  /// A-Z a-z 0-9 . _ -).
  static bool valid_tenant(std::string_view name);
  /// Whether some key is `tenant`'s.
  bool has_tenant(std::string_view tenant) const;

  /// Whether any key is required.
  bool required() const { return !keys_.empty(); }
  /// How many keys there are.
  std::size_t size() const { return keys_.size(); }
  /// The tenant whose key `given` is, or nothing. Every key is compared
  /// whole, in time independent of where `given` first differs (keys are
  /// secrets).
  std::optional<std::string> tenant_of(std::string_view given) const;

 private:
  struct entry {
    std::string tenant, key;
  };
  std::vector<entry> keys_;
};

}  // namespace corolla::api
