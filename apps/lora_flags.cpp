// The LoRA flags of train and finetune (apps/lora_flags.hpp).
#include "apps/lora_flags.hpp"

namespace corolla::app {

lora_config lora_flags::config() const {
  lora_config c;
  c.rank = rank;
  c.alpha = alpha != 0.0f ? alpha : static_cast<float>(rank);
  c.rslora = rslora;
  c.targets = targets;
  return c;
}

std::string lora_flags::problem() const {
  const bool shaped = alpha != 0.0f || !targets.empty() || rslora;
  if (!given() && shaped) return "--lora-alpha, --lora-targets and --lora-rslora shape an adapter: add --lora-rank R";
  if (rank != 0 && !adapter.empty())
    return "--lora-rank makes a new adapter and --adapter trains on a saved one: give one of them";
  if (!adapter.empty() && shaped)
    return "--adapter trains on with the saved adapter's own alpha and targets: drop --lora-alpha, --lora-targets "
           "and --lora-rslora";
  return {};
}

void add_lora_flags(CLI::App* cmd, lora_flags& f, const std::string& rank_help) {
  cmd->add_option("--lora-rank", f.rank, rank_help)->check(CLI::Range(1, 65536));
  cmd->add_option("--lora-alpha", f.alpha,
                  "The adapter's alpha: its update is scaled by alpha / R (default: R, a scale of 1)")
      ->check(CLI::Range(1e-6, 1e6));
  cmd->add_option("--lora-targets", f.targets,
                  "Modules to adapt, comma-separated, by their HuggingFace names (q_proj, v_proj, ...; "
                  "GPT-2: c_attn, c_proj, c_fc) or all-linear (default: q_proj,v_proj; GPT-2: c_attn)")
      ->delimiter(',');
  cmd->add_flag("--lora-rslora", f.rslora, "Scale the adapter's update by alpha / sqrt(R) (rsLoRA)");
  cmd->add_option("--adapter", f.adapter,
                  "Train on from the LoRA adapter in DIR (a PEFT directory: its rank, alpha and targets)");
}

}  // namespace corolla::app
