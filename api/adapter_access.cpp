// Which tenants may use which adapters (api/adapter_access.hpp).
#include "api/adapter_access.hpp"

#include "actors/swarm_client.hpp"

#include <algorithm>
#include <stdexcept>

namespace corolla::api {

adapter_access adapter_access::parse(const std::vector<std::string>& specs) {
  adapter_access out;
  for (const std::string& spec : specs) {
    const auto bad = [&](const std::string& why) {
      return std::invalid_argument("--adapter-tenants " + spec + ": " + why);
    };
    const auto eq = spec.find('=');
    if (eq == std::string::npos) throw bad("expected NAME=TENANT[,TENANT...]");
    const std::string name = spec.substr(0, eq);
    if (name.empty()) throw bad("the adapter's name is empty");
    std::set<std::string>& tenants = out.tenants_[name];
    std::string rest = spec.substr(eq + 1);
    if (rest.empty()) throw bad("no tenant is named (an adapter no tenant may use: do not serve it)");
    for (std::size_t start = 0; start <= rest.size();) {
      const auto comma = std::min(rest.find(',', start), rest.size());
      const std::string tenant = rest.substr(start, comma - start);
      if (!api_keys::valid_tenant(tenant))
        throw bad("'" + tenant + "' is not a tenant's name (1 to 64 of A-Z a-z 0-9 . _ -, as --api-key-file's)");
      tenants.insert(tenant);
      start = comma + 1;
    }
  }
  return out;
}

bool adapter_access::allows(const std::string& adapter, const std::string& tenant) const {
  const auto it = tenants_.find(adapter);
  return it == tenants_.end() || it->second.count(tenant) != 0;
}

std::vector<std::string> adapter_access::visible(const std::vector<std::string>& adapters,
                                                 const std::string& tenant) const {
  std::vector<std::string> out;
  for (const std::string& a : adapters)
    if (allows(a, tenant)) out.push_back(a);
  return out;
}

void adapter_access::check(const std::vector<std::string>& adapters, const api_keys& keys, bool names_known) const {
  for (const auto& [name, tenants] : tenants_) {
    if (const std::string why = adapter_ref::name_problem(name); !why.empty())
      throw std::invalid_argument("--adapter-tenants " + name + "=...: " + why);
    if (names_known && std::find(adapters.begin(), adapters.end(), name) == adapters.end()) {
      std::string served;
      for (const std::string& a : adapters) served += (served.empty() ? "" : ", ") + a;
      throw std::invalid_argument("--adapter-tenants " + name + "=...: no adapter '" + name + "' is served (" +
                                  (served.empty() ? std::string("none is: give --adapter") : "these are: " + served) +
                                  ")");
    }
    if (!keys.required() || keys.has_tenant(""))  // none, or --api-key's one key of no tenant
      throw std::invalid_argument("--adapter-tenants needs tenants: give --api-key-file (lines of a tenant and a key)");
    for (const std::string& t : tenants)
      if (!keys.has_tenant(t))
        throw std::invalid_argument("--adapter-tenants " + name + "=...: the tenant '" + t +
                                    "' holds no key in the --api-key-file");
  }
}

}  // namespace corolla::api
