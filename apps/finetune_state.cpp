// corolla finetune's checkpoint of the client (apps/finetune_state.hpp).
#include "apps/finetune_state.hpp"

#include <algorithm>
#include <stdexcept>
#include <system_error>

#include <spdlog/fmt/fmt.h>

#include "apps/train_args.hpp"
#include "model/error.hpp"
#include "model/fingerprint.hpp"
#include "model/safetensors.hpp"

namespace corolla::app {
namespace {

namespace fs = std::filesystem;

const char* const data_position_key = "corolla.finetune.data_position";

std::string data_fingerprint(const token_dataset& data) {
  fingerprint f;
  const auto tokens = data.tokens();
  f.mix(tokens.data(), tokens.size_bytes());
  return f.hex();
}

}  // namespace

finetune_checkpoint::finetune_checkpoint(const fs::path& dir, const finetune_run& run, const token_dataset& data)
    : file_(dir / "finetune_state.safetensors") {
  std::error_code ec;
  const fs::path model = fs::weakly_canonical(run.model, ec), here = fs::weakly_canonical(dir, ec);
  const auto inside = std::mismatch(model.begin(), model.end(), here.begin(), here.end()).first == model.end();
  if (!model.empty() && inside)
    throw std::invalid_argument("--checkpoint-dir " + dir.string() + " is inside the model directory: keep the "
                                "state elsewhere (the model's files make its fingerprint)");
  std::string lora = "none";
  if (run.adapter) {
    const lora_config& c = run.adapter->config();
    // Shortest round-trip numbers: 1e-6 and 1.4e-6 are other runs.
    lora = fmt::format("r {}, alpha {}{}, {}", c.rank, c.alpha, c.rslora ? ", rsLoRA" : "", c.targets_text());
  }
  key_ = {{"corolla.finetune.model", frozen_model_digest(run.model)},
          {"corolla.finetune.tuning", run.tuning},
          {"corolla.finetune.prompt_len", std::to_string(run.prompt_len)},
          {"corolla.finetune.adapter", lora},
          {"corolla.finetune.batch", std::to_string(run.batch)},
          {"corolla.finetune.seq", std::to_string(run.seq)},
          {"corolla.finetune.lr", fmt::format("{}", run.lr)},
          {"corolla.finetune.data", data_fingerprint(data)}};
}

std::int64_t finetune_checkpoint::resume(prompt_tuner& tuner, token_dataset& data, int steps) const {
  std::error_code ec;
  if (!fs::exists(file_, ec))
    throw model_error("--resume: " + file_.string() + " does not exist (a run with --checkpoint-dir writes it)");
  // The key first, from the header alone: a refused file changes nothing.
  const auto meta = safetensors_file::open(file_)->metadata();
  for (const auto& [name, want] : key_) {
    const auto got = meta.find(name);
    const std::string what = name.substr(name.rfind('.') + 1);
    if (got == meta.end() || got->second != want)
      throw model_error("--resume: " + file_.string() + " was written by another run: its " + what + " is " +
                        (got == meta.end() ? std::string("not recorded") : "'" + got->second + "'") +
                        ", this run's '" + want + "'");
  }
  std::int64_t step = -1, position = -1;
  try {
    step = std::stoll(meta.at(tuning_state_step_key));
    position = std::stoll(meta.at(data_position_key));
  } catch (const std::exception&) {
    throw model_error("--resume: " + file_.string() + " records no step or data position");
  }
  if (step >= steps)
    throw model_error("--resume: " + file_.string() + " is at step " + std::to_string(step) + ", and --steps " +
                      std::to_string(steps) + " leaves nothing to train (give more steps)");
  if (position < 0 || position > data.size())
    throw model_error("--resume: " + file_.string() + " records data position " + std::to_string(position) +
                      ", beyond the data's " + std::to_string(data.size()) + " tokens");
  tuner.load_state(file_);
  data.set_position(position);
  return step;
}

bool finetune_checkpoint::write(const prompt_tuner& tuner, std::int64_t position) {
  if (!tuner.state_is_finite()) return false;
  std::map<std::string, std::string> meta = key_;
  meta[data_position_key] = std::to_string(position);
  tuner.save_state(file_, meta);
  written_ = tuner.steps();
  return true;
}

}  // namespace corolla::app
