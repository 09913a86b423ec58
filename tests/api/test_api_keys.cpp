// The keys corolla api accepts, each a tenant's (api/api_keys.hpp).
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "api/adapter_access.hpp"
#include "api/api_keys.hpp"

using namespace corolla::api;

TEST_CASE("an API key file names each key's tenant, and a tenant may hold several keys") {
  const api_keys keys = api_keys::parse(
      "# tenant  key\n"
      "acme   sk-acme-1\n"
      "\n"
      "  acme\tsk-acme-rotated\r\n"
      "globex sk-globex.7_e-01\n"
      "   # an indented comment\n",
      "keys.txt");
  CHECK(keys.required());
  CHECK(keys.size() == 3);
  CHECK(keys.tenant_of("sk-acme-1") == "acme");
  CHECK(keys.tenant_of("sk-acme-rotated") == "acme");
  CHECK(keys.tenant_of("sk-globex.7_e-01") == "globex");
  // A key is matched whole: a prefix, an extension or another case is none.
  CHECK_FALSE(keys.tenant_of("sk-acme-"));
  CHECK_FALSE(keys.tenant_of("sk-acme-11"));
  CHECK_FALSE(keys.tenant_of("SK-ACME-1"));
  CHECK_FALSE(keys.tenant_of(""));
  CHECK_FALSE(api_keys().required());
  const api_keys one = api_keys::single("sekrit");
  CHECK(one.tenant_of("sekrit") == "");
  CHECK_FALSE(one.tenant_of("sekri"));
  CHECK_THROWS_AS(api_keys::single(""), std::invalid_argument);
}

TEST_CASE("a malformed API key file is refused naming its line") {
  const auto refusal = [](const std::string& text) {
    try {
      (void)api_keys::parse(text, "keys.txt");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refusal("acme\n") == "keys.txt:1: expected a tenant and a key, got 1 field");
  CHECK(refusal("# c\nacme k1 extra\n") == "keys.txt:2: expected a tenant and a key, got 3 fields");
  CHECK(refusal("ac/me k1\n") == "keys.txt:1: a tenant is 1 to 64 of A-Z a-z 0-9 . _ -");
  CHECK(refusal(std::string(65, 't') + " k1\n").find("keys.txt:1: a tenant is") == 0);
  CHECK(refusal("acme k\x01y\n") == "keys.txt:1: a key is 1 to 512 printable ASCII characters without spaces");
  CHECK(refusal("acme " + std::string(513, 'k') + "\n").find("keys.txt:1: a key is") == 0);
  CHECK(refusal("acme k1\nglobex k1\n") == "keys.txt:2: this key was given before (of tenant 'acme')");
  CHECK(refusal("") == "keys.txt holds no key (lines of a tenant and a key)");
  CHECK(refusal("# only comments\n\n") == "keys.txt holds no key (lines of a tenant and a key)");
}

TEST_CASE("adapter rules: NAME=TENANT,... makes an adapter private to those tenants, others stay everyone's") {
  const adapter_access none;
  CHECK_FALSE(none.any());
  CHECK(none.allows("style", "acme"));
  const adapter_access access = adapter_access::parse({"legal=acme,globex", "style=acme", "style=initech"});
  CHECK(access.any());
  CHECK(access.allows("legal", "globex"));
  CHECK_FALSE(access.allows("legal", "initech"));
  CHECK_FALSE(access.allows("legal", ""));  // --api-key's tenant is no one's name
  CHECK(access.allows("style", "initech"));  // a name given twice: the union
  CHECK(access.allows("open", "anyone"));
  CHECK(access.is_private("style"));
  CHECK_FALSE(access.is_private("open"));
  CHECK(access.visible({"legal", "open", "style"}, "globex") == std::vector<std::string>{"legal", "open"});
  CHECK(access.visible({"legal", "open", "style"}, "acme") == std::vector<std::string>{"legal", "open", "style"});

  CHECK_THROWS_WITH_AS(adapter_access::parse({"legal"}), "--adapter-tenants legal: expected NAME=TENANT[,TENANT...]",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(adapter_access::parse({"=acme"}), "--adapter-tenants =acme: the adapter's name is empty",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(adapter_access::parse({"legal="}), doctest::Contains("no tenant is named"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(adapter_access::parse({"legal=acme,,globex"}), doctest::Contains("'' is not a tenant's name"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(adapter_access::parse({"legal=ac me"}), doctest::Contains("'ac me' is not a tenant's name"),
                       std::invalid_argument);

  const api_keys keys = api_keys::parse("acme k1\nglobex k2\n", "keys");
  CHECK_NOTHROW(access.check({"legal", "style"}, api_keys::parse("acme k1\nglobex k2\ninitech k3\n", "keys")));
  CHECK_THROWS_WITH_AS(access.check({"legal", "style"}, keys), doctest::Contains("the tenant 'initech' holds no key"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(access.check({"legal"}, keys), doctest::Contains("no adapter 'style' is served (these are: legal)"),
                       std::invalid_argument);
  // Adapters found later (a swarm's, --adapter '*'): any adapter name may be ruled.
  CHECK_NOTHROW(access.check({}, api_keys::parse("acme k1\nglobex k2\ninitech k3\n", "keys"), false));
  CHECK_THROWS_WITH_AS(adapter_access::parse({"a@b=acme"}).check({}, keys, false),
                       doctest::Contains("--adapter-tenants a@b=...: the name 'a@b' has a space"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(access.check({}, keys, false), doctest::Contains("the tenant 'initech' holds no key"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(adapter_access::parse({"legal=acme"}).check({"legal"}, api_keys{}),
                       doctest::Contains("give --api-key-file"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(adapter_access::parse({"legal=acme"}).check({"legal"}, api_keys::single("k")),
                       doctest::Contains("give --api-key-file"), std::invalid_argument);
}
