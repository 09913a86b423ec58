#include "net/collectives.hpp"

#include <string>

#include "kernels/backend.hpp"

namespace corolla {

// ---- host rings -------------------------------------------------------------------

std::pair<std::int64_t, std::int64_t> chunk_range(std::int64_t n, int g, int c) {
  return {n * c / g, n * (c + 1) / g};
}

int owned_chunk(const ring& r) { return (r.position + 1) % r.size(); }

namespace {

Tensor chunk_of(const Tensor& flat, int g, int c) {
  auto [b, e] = chunk_range(flat.numel(), g, c);
  return flat.slice(b, e);
}

int mod(int a, int g) { return ((a % g) + g) % g; }

}  // namespace

ring_pass::ring_pass(ring_phase phase, const ring& r, Tensor flat) : phase_(phase), r_(r), flat_(std::move(flat)) {}

Tensor ring_pass::outgoing() const {
  const int g = r_.size();
  const int c = phase_ == ring_phase::reduce_scatter ? mod(r_.position - hop_, g) : mod(r_.position + 1 - hop_, g);
  return chunk_of(flat_, g, c).clone();
}

Tensor ring_pass::target() const {
  const int g = r_.size();
  const int c = phase_ == ring_phase::reduce_scatter ? mod(r_.position - hop_ - 1, g) : mod(r_.position - hop_, g);
  return chunk_of(flat_, g, c);
}

std::int64_t ring_pass::incoming_numel() const { return target().numel(); }

void ring_pass::apply(const Tensor& in) {
  if (done()) throw tensor_error("ring_pass: a chunk after the last hop");
  Tensor dst = target();
  if (in.numel() != dst.numel())
    throw tensor_error("ring_pass: hop " + std::to_string(hop_) + " expects " + std::to_string(dst.numel()) +
                       " values, got " + std::to_string(in.numel()));
  if (phase_ == ring_phase::reduce_scatter)
    cpu_backend().add(dst, in, dst);
  else
    dst.copy_from(in);
  ++hop_;
}

namespace {

/// Runs `pass` to its end over `ch`, blocking on each chunk.
void run_blocking(ring_channel& ch, ring_pass pass, std::int64_t step, int bucket) {
  const ring& r = pass.members();
  while (!pass.done()) {
    ch.send_chunk(r.next(), pass.phase(), step, bucket, pass.hop(), pass.outgoing());
    pass.apply(ch.receive_chunk(r.prev(), pass.phase(), step, bucket, pass.hop(), pass.incoming_numel()));
  }
}

}  // namespace

void ring_reduce_scatter(ring_channel& ch, const ring& r, Tensor& flat, std::int64_t step, int bucket) {
  run_blocking(ch, ring_pass(ring_phase::reduce_scatter, r, flat), step, bucket);
}

void ring_all_gather(ring_channel& ch, const ring& r, Tensor& flat, std::int64_t step, int bucket) {
  run_blocking(ch, ring_pass(ring_phase::all_gather, r, flat), step, bucket);
}

// ---- device collectives ---------------------------------------------------------

namespace {

/// The slot of chunk `k` in the padded layout: chunk k is owned by ring
/// position k - 1 (owned_chunk), which is also its group rank.
std::int64_t slot_of_chunk(int k, int g) { return mod(k - 1, g); }

/// Throws unless `group` is `r`'s, `shard` holds the padded chunk of
/// `flat` and `scratch` the whole padded layout.
void check_padded_layout(const device_group& group, const ring& r, const Tensor& flat, const Tensor& scratch,
                         const Tensor& shard, const char* what) {
  const int g = r.size();
  if (group.size() != g || group.rank() != r.position || shard.numel() != device_chunk_pad(flat.numel(), g) ||
      scratch.numel() < g * shard.numel())
    throw tensor_error(std::string(what) + ": the group, ring, shard and scratch do not match");
}

}  // namespace

std::int64_t device_chunk_pad(std::int64_t n, int g) { return (n + g - 1) / g; }

void device_reduce_scatter(device_group& group, Backend& on, const ring& r, const Tensor& flat, Tensor& scratch,
                           Tensor& shard) {
  check_padded_layout(group, r, flat, scratch, shard, "device_reduce_scatter");
  const int g = r.size();
  const std::int64_t pad = shard.numel();
  Tensor in = scratch.slice(0, g * pad);
  for (int k = 0; k < g; ++k) {
    const auto [lo, hi] = chunk_range(flat.numel(), g, k);
    Tensor dst = in.slice(slot_of_chunk(k, g) * pad, slot_of_chunk(k, g) * pad + (hi - lo));
    on.copy(flat.slice(lo, hi), dst);
  }
  group.reduce_scatter(on, in, shard);
}

void device_all_gather(device_group& group, Backend& on, const ring& r, Tensor& flat, Tensor& scratch, Tensor& shard) {
  check_padded_layout(group, r, flat, scratch, shard, "device_all_gather");
  const int g = r.size();
  const std::int64_t pad = shard.numel();
  const auto [own_lo, own_hi] = chunk_range(flat.numel(), g, owned_chunk(r));
  Tensor mine = shard.slice(0, own_hi - own_lo);
  on.copy(flat.slice(own_lo, own_hi), mine);
  Tensor out = scratch.slice(0, g * pad);
  group.all_gather(on, shard, out);
  for (int k = 0; k < g; ++k) {
    if (k == owned_chunk(r)) continue;
    const auto [lo, hi] = chunk_range(flat.numel(), g, k);
    Tensor dst = flat.slice(lo, hi);
    on.copy(out.slice(slot_of_chunk(k, g) * pad, slot_of_chunk(k, g) * pad + (hi - lo)), dst);
  }
}

}  // namespace corolla
