// faultlab's built-in models and data (apps/faultlab.hpp): scenarios that
// ship with corolla (scenarios/*.toml) name `builtin:llama`, `builtin:gpt2`
// and `builtin:tokens` instead of paths, and faultlab writes them as real
// HuggingFace files (random weights, seeded) into the report directory.
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>

#include "apps/commands.hpp"
#include "apps/faultlab.hpp"
#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/transformer.hpp"

namespace corolla::app {

namespace {

constexpr const char* prefix = "builtin:";

model_config builtin_config(const std::string& name) {
  if (name == "llama") return tiny_random_config(architecture::llama, 4);
  if (name == "gpt2") return tiny_random_config(architecture::gpt2, 4);
  throw std::invalid_argument("model: 'builtin:" + name + "' is not a built-in model (builtin:llama, builtin:gpt2)");
}

}  // namespace

model_config model_config_of(const std::string& model) {
  return model.rfind(prefix, 0) == 0 ? builtin_config(model.substr(8)) : load_config(model);
}

void materialize_builtins(faultlab::scenario& s, const std::filesystem::path& dir) {
  const auto builtin = [](const std::string& v) { return v.rfind(prefix, 0) == 0 ? v.substr(8) : std::string(); };
  std::string* model = s.swarm ? &s.swarm->model : s.train ? &s.train->model : nullptr;
  if (model) {
    if (const std::string name = builtin(*model); !name.empty()) {
      const model_config cfg = builtin_config(name);
      const std::filesystem::path out = dir / ("builtin-" + name);
      if (!std::filesystem::exists(out / "config.json")) transformer::init(cfg, 1, cpu_backend()).save(out);
      *model = out.string();
    }
  }
  if (s.train) {
    if (const std::string name = builtin(s.train->data); !name.empty()) {
      if (name != "tokens") throw std::invalid_argument("data: 'builtin:" + name + "' is not built in (builtin:tokens)");
      // 4000 raw uint16 ids of a repeating pattern with some noise: a
      // corpus a tiny model learns from within a few steps.
      const std::filesystem::path out = dir / "builtin-tokens.bin";
      std::ofstream f(out, std::ios::binary | std::ios::trunc);
      std::uint32_t x = 12345;
      for (int i = 0; i < 4000; ++i) {
        x = x * 1664525u + 1013904223u;
        const auto id = static_cast<std::uint16_t>((i % 16) * 7 % 200 + ((x >> 24) % 8 == 0 ? (x >> 16) % 50 : 0));
        f.write(reinterpret_cast<const char*>(&id), sizeof id);
      }
      if (!f) throw std::runtime_error("cannot write " + out.string());
      s.train->data = out.string();
    }
  }
}

}  // namespace corolla::app
