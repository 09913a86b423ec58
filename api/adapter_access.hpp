// api/adapter_access.hpp — which tenants may use which LoRA adapters of
// `corolla api` (`--adapter-tenants NAME=TENANT,...`).
//
// An adapter no rule names is open to every tenant. One a rule names is
// private to the tenants it lists (each holds keys in --api-key-file): to
// every other tenant it does not exist, as OpenAI's fine-tuned models of
// another organisation do not: it is not listed by GET /v1/models, and a
// request or GET /v1/models/{id} naming it is the same 404
// `model_not_found` a name nobody serves gets, naming only what that
// tenant may use. Its per-adapter series are left out of the API port's
// public /metrics (a --metrics-listen listener still shows them).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "api/api_keys.hpp"

namespace corolla::api {

class adapter_access {
 public:
  /// Every adapter open to every tenant.
  adapter_access() = default;
  /// The rules `specs` give, each "NAME=TENANT[,TENANT...]" (a name given
  /// twice takes the union of its tenants). Throws std::invalid_argument
  /// naming the spec: no '=', an empty name or tenant, a tenant not of
  /// --api-key-file's form.
  static adapter_access parse(const std::vector<std::string>& specs);

  /// Whether any adapter is private.
  bool any() const { return !tenants_.empty(); }
  /// Whether `adapter` is private to some tenants.
  bool is_private(const std::string& adapter) const { return tenants_.count(adapter) != 0; }
  /// Whether `tenant` may use `adapter`.
  bool allows(const std::string& adapter, const std::string& tenant) const;
  /// Of `adapters`, those `tenant` may use, in their order.
  std::vector<std::string> visible(const std::vector<std::string>& adapters, const std::string& tenant) const;

  /// Checks the rules against what is served: every name one of
  /// `adapters` (unless `names_known` is false: the adapters are found
  /// later, a swarm's; then each must only be an adapter name), every
  /// tenant one of `keys`' (so a typo does not leave an adapter open or
  /// closed to all). Throws std::invalid_argument.
  void check(const std::vector<std::string>& adapters, const api_keys& keys, bool names_known = true) const;

 private:
  std::map<std::string, std::set<std::string>> tenants_;  ///< private adapter -> its tenants
};

}  // namespace corolla::api
