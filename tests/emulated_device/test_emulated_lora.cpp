// A LoRA adapter (model/lora.hpp) training on a device: the device code path
// of the frozen weights' backward (input gradients only, by products with the
// weights) and of the adapter's merge and projected gradients gives the
// cpu's losses exactly in f32, and tracks them with bf16 compute copies that
// follow each merge.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/backend.hpp"
#include "model/lora.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "tests/emulated_device/emulated_device.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::emulated_device_backend;
using corolla::testing::some_ids;

TEST_CASE("emulated device: a LoRA adapter trains to the cpu's losses, and with bf16 compute close to them") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    testing::temp_dir_guard dir("emulated-lora");
    testing::write_tiny_model(dir.path(), testing::tiny_options_for(arch, 64));
    lora_config c;
    c.rank = 4;
    c.targets = {"all-linear"};
    train_options opts;
    opts.batch = 2;
    opts.seq = 16;
    opts.steps = 6;
    opts.optimizer.adamw.lr = 2e-2f;
    const auto run = [&](Backend& be, dtype compute) {
      transformer m = transformer::load(dir.path(), be);
      m.set_compute_dtype(compute);
      lora_adapter a = lora_adapter::init(m.config(), c, 8, be);
      const int vocab = m.config().vocab_size;
      // A repeated phrase: something an adapter of a few steps can learn.
      const std::vector<std::int32_t> phrase = some_ids(8, vocab, 17);
      std::vector<std::int32_t> tokens;
      for (int i = 0; i < 40; ++i) tokens.insert(tokens.end(), phrase.begin(), phrase.end());
      token_dataset d = token_dataset::from_tokens(tokens, vocab);
      train_options o = opts;
      o.adapter = &a;
      return trainer(m, d, o).run().losses;
    };
    const std::vector<float> cpu = run(cpu_backend(), dtype::f32);
    REQUIRE(cpu.back() < 0.5f * cpu.front());  // the adapter's updates matter
    emulated_device_backend dev;
    CHECK(run(dev, dtype::f32) == cpu);
    const std::vector<float> bf16 = run(dev, dtype::bf16);
    REQUIRE(bf16.size() == cpu.size());
    CHECK(bf16.back() < 0.5f * bf16.front());  // the compute copies followed the merges
    for (std::size_t s = 0; s < cpu.size(); ++s) {
      CAPTURE(s);
      // bf16's rounding, as the mixed-precision tests allow; an adapter
      // whose merges the compute copies missed would stay at the base's loss.
      CHECK(std::abs(bf16[s] - cpu[s]) <= 5e-2f * std::max(1.0f, std::abs(cpu[s])));
    }
  }
}
