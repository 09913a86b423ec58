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

void ring_reduce_scatter(ring_channel& ch, const ring& r, Tensor& flat, std::int64_t step, int bucket) {
  const int g = r.size();
  for (int hop = 0; hop < g - 1; ++hop) {
    // The chunk sent is final for this member (no later hop adds into it),
    // but it is cloned anyway: the wire may still hold it when the next
    // step zeroes the gradients.
    Tensor out = chunk_of(flat, g, mod(r.position - hop, g)).clone();
    ch.send_chunk(r.next(), ring_phase::reduce_scatter, step, bucket, hop, std::move(out));
    Tensor dst = chunk_of(flat, g, mod(r.position - hop - 1, g));
    Tensor in = ch.receive_chunk(r.prev(), ring_phase::reduce_scatter, step, bucket, hop, dst.numel());
    cpu_backend().add(dst, in, dst);
  }
}

void ring_all_gather(ring_channel& ch, const ring& r, Tensor& flat, std::int64_t step, int bucket) {
  const int g = r.size();
  for (int hop = 0; hop < g - 1; ++hop) {
    Tensor out = chunk_of(flat, g, mod(r.position + 1 - hop, g)).clone();
    ch.send_chunk(r.next(), ring_phase::all_gather, step, bucket, hop, std::move(out));
    Tensor dst = chunk_of(flat, g, mod(r.position - hop, g));
    Tensor in = ch.receive_chunk(r.prev(), ring_phase::all_gather, step, bucket, hop, dst.numel());
    dst.copy_from(in);
  }
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
