// The keys corolla api accepts (api/api_keys.hpp).
#include "api/api_keys.hpp"

#include <algorithm>
#include <stdexcept>

namespace corolla::api {

namespace {

constexpr std::size_t kMaxTenant = 64, kMaxKey = 512;

bool tenant_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

bool key_char(char c) { return c > ' ' && c < 0x7f; }

bool blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/// Whether `a` equals `b`, comparing every byte of `b` whatever the first
/// difference (the time says nothing of how much of a key was right).
bool same_secret(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < b.size(); ++i)
    diff |= static_cast<unsigned char>(b[i]) ^ static_cast<unsigned char>(i < a.size() ? a[i] : 0);
  return diff == 0;
}

}  // namespace

bool api_keys::valid_tenant(std::string_view name) {
  return !name.empty() && name.size() <= kMaxTenant && std::all_of(name.begin(), name.end(), tenant_char);
}

bool api_keys::has_tenant(std::string_view tenant) const {
  return std::any_of(keys_.begin(), keys_.end(), [&](const entry& e) { return e.tenant == tenant; });
}

api_keys api_keys::single(std::string key) {
  if (key.empty()) throw std::invalid_argument("an API key must not be empty");
  api_keys k;
  k.keys_.push_back({"", std::move(key)});
  return k;
}

api_keys api_keys::parse(std::string_view text, const std::string& source) {
  api_keys out;
  std::size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const auto end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    const auto where = [&] { return source + ":" + std::to_string(line_no) + ": "; };
    std::size_t i = 0;
    while (i < line.size() && blank(line[i])) ++i;
    if (i == line.size() || line[i] == '#') continue;
    std::vector<std::string_view> fields;
    while (i < line.size()) {
      const std::size_t start = i;
      while (i < line.size() && !blank(line[i])) ++i;
      fields.push_back(line.substr(start, i - start));
      while (i < line.size() && blank(line[i])) ++i;
    }
    if (fields.size() != 2)
      throw std::invalid_argument(where() + "expected a tenant and a key, got " + std::to_string(fields.size()) +
                                  " field" + (fields.size() == 1 ? "" : "s"));
    const std::string_view tenant = fields[0], key = fields[1];
    if (!valid_tenant(tenant))
      throw std::invalid_argument(where() + "a tenant is 1 to 64 of A-Z a-z 0-9 . _ -");
    if (key.size() > kMaxKey || !std::all_of(key.begin(), key.end(), key_char))
      throw std::invalid_argument(where() + "a key is 1 to 512 printable ASCII characters without spaces");
    for (const entry& e : out.keys_)
      if (e.key == key)
        throw std::invalid_argument(where() + "this key was given before (of tenant '" + e.tenant + "')");
    out.keys_.push_back({std::string(tenant), std::string(key)});
  }
  if (out.keys_.empty()) throw std::invalid_argument(source + " holds no key (lines of a tenant and a key)");
  return out;
}

std::optional<std::string> api_keys::tenant_of(std::string_view given) const {
  const entry* found = nullptr;
  for (const entry& e : keys_)  // all of them, whichever matches
    if (same_secret(given, e.key)) found = &e;
  if (!found) return std::nullopt;
  return found->tenant;
}

}  // namespace corolla::api
