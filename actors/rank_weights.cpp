// Where a training rank gets its parameters (actors/train_job.hpp: rank_weights).
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_store.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/initialisation.hpp"
#include "model/safetensors.hpp"
#include "model/head.hpp"
#include "model/stage.hpp"
#include "model/transformer.hpp"

namespace corolla {

rank_weights weights_of(transformer& model) {
  rank_weights w;
  w.cfg = model.config();
  w.be = &model.backend();
  w.blocks = [&model](int first, int last) {
    return std::vector<param_set>(model.blocks().begin() + first, model.blocks().begin() + last);
  };
  w.head = [&model] { return model.head(); };
  return w;
}

rank_weights weights_from_seed(const model_config& cfg, std::uint64_t seed, Backend& be, const train_layout& l,
                              int rank) {
  // Only this rank's groups are kept: the blocks of every chunk of its
  // stage, and the head on the first and the last stage.
  const std::set<std::string> own = param_buckets(l, rank);
  initial_groups keep;
  keep.head = own.count(bucket_name(head_bucket)) > 0;
  keep.block = [&own](int i) { return own.count(bucket_name(i)) > 0; };
  auto drawn = std::make_shared<initial_params>(draw_initial_params(cfg, seed, keep, be));
  rank_weights w;
  w.cfg = cfg;
  w.be = &be;
  // Each group is handed over, not shared: what the rank places on a
  // device leaves no host copy behind here for the rest of the run.
  w.blocks = [drawn, rank](int first, int last) {
    std::vector<param_set> out;
    for (int i = first; i < last; ++i) {
      auto it = drawn->blocks.find(i);
      if (it == drawn->blocks.end())
        throw train_error("block " + std::to_string(i) + " is not rank " + std::to_string(rank) +
                          "'s, or was handed over already");
      out.push_back(std::move(it->second));
      drawn->blocks.erase(it);
    }
    return out;
  };
  w.head = [drawn, rank] {
    if (!drawn->head)
      throw train_error("the head is not rank " + std::to_string(rank) + "'s, or was handed over already");
    param_set h = std::move(*drawn->head);
    drawn->head.reset();
    return h;
  };
  return w;
}

rank_weights weights_to_restore(const model_config& cfg, Backend& be) {
  rank_weights w;
  w.cfg = cfg;
  w.be = &be;
  w.blocks = [cfg, &be](int first, int last) {
    std::vector<param_set> out;
    const auto layout = block_layout(cfg);
    for (int i = first; i < last; ++i) {
      out.emplace_back(layout);
      place_params(out.back(), be);
    }
    return out;
  };
  w.head = [cfg, &be] {
    param_set h(head_layout(cfg));
    place_params(h, be);
    return h;
  };
  return w;
}

rank_weights weights_from_checkpoint(const std::filesystem::path& dir, Backend& be) {
  auto ck = std::make_shared<checkpoint>(checkpoint::open(dir));
  rank_weights w;
  w.cfg = load_config(dir);
  w.be = &be;
  w.blocks = [ck, cfg = w.cfg, &be](int first, int last) {
    return stage::load(*ck, cfg, first, last, be).params();
  };
  w.head = [ck, cfg = w.cfg, &be] { return head::load(*ck, cfg, be).params(); };
  // One block's f32 at a time, on the rank's own backend (a device rank
  // quantises there), never the stage's f32 parameters at once.
  w.frozen_stage = [ck, cfg = w.cfg](int first, int last, Backend& on, weight_format f) {
    return stage::load_inference(*ck, cfg, first, last, on, f);
  };
  return w;
}

}  // namespace corolla
