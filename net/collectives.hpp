// net/collectives.hpp — the collectives of a data-parallel group: ring
// reduce-scatter and all-gather of a flat f32 buffer in host memory, either
// stepped hop by hop by a caller that cannot block (ring_pass: the training
// runtime's DP-group actor) or run to the end over whatever moves chunks
// between the ring's members (a ring_channel), and the same two over a
// device group
// (kernels/device_group.hpp: NCCL behind the Backend), with the same shard
// ownership so checkpoints do not depend on which ran.
//
// A buffer of n values is split into g balanced chunks (chunk_range); after
// a reduce-scatter, ring member p holds the sum of chunk (p + 1) mod g
// (owned_chunk), and an all-gather spreads each owner's chunk to everyone.
// Each member sends g - 1 chunks per collective: 2 (g - 1) / g of the
// buffer per reduce-scatter + all-gather, the bandwidth-optimal figure.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/device_group.hpp"
#include "kernels/tensor.hpp"

namespace corolla {

class Backend;

/// The members of one ring and this member's position in it.
struct ring {
  std::vector<int> ranks;  ///< in ring order (the caller's ids: ranks of a job)
  int position = 0;        ///< index of this member in `ranks`
  int size() const { return static_cast<int>(ranks.size()); }
  int next() const { return ranks[static_cast<std::size_t>((position + 1) % size())]; }
  int prev() const { return ranks[static_cast<std::size_t>((position + size() - 1) % size())]; }
};

/// Elements [begin, end) of chunk `c` when `n` elements are split into `g`
/// balanced chunks.
std::pair<std::int64_t, std::int64_t> chunk_range(std::int64_t n, int g, int c);
/// The chunk a ring member owns after ring_reduce_scatter: (position + 1) mod g.
int owned_chunk(const ring& r);

/// Which collective a chunk belongs to.
enum class ring_phase { reduce_scatter, all_gather };

/// How the blocking ring collectives move chunks between members, for a
/// caller that can block in them (the tests' in-memory channel; the
/// training runtime steps ring_pass instead). A chunk is addressed by (phase, step,
/// bucket, hop), so a receive takes exactly the chunk it needs whatever
/// order chunks arrive in. Both calls may block; a failure (a member gone,
/// a timeout, a malformed chunk) is thrown by the channel and leaves the
/// collective at once.
class ring_channel {
 public:
  virtual ~ring_channel() = default;
  /// Sends `chunk` (f32, host, not written by the caller afterwards) to member `to`.
  virtual void send_chunk(int to, ring_phase phase, std::int64_t step, int bucket, int hop, Tensor chunk) = 0;
  /// The chunk member `from` sent for (phase, step, bucket, hop), checked to
  /// hold `numel` f32 values.
  virtual Tensor receive_chunk(int from, ring_phase phase, std::int64_t step, int bucket, int hop,
                               std::int64_t numel) = 0;
};

/// One ring collective of `flat` (f32 [n], host), hop by hop, for a caller
/// that cannot block (the DP-group actor): at each hop it sends outgoing()
/// to r.next(), and once the chunk r.prev() sent for that hop came, apply()
/// adds it in (reduce-scatter) or copies it (all-gather) and moves to the
/// next hop. After g - 1 hops done() is true and `flat` holds what
/// ring_reduce_scatter or ring_all_gather leave; those two run a ring_pass
/// over a channel. `flat` is shared, not copied: it must outlive the pass.
class ring_pass {
 public:
  ring_pass(ring_phase phase, const ring& r, Tensor flat);
  ring_phase phase() const { return phase_; }
  const ring& members() const { return r_; }
  int hop() const { return hop_; }
  bool done() const { return hop_ >= r_.size() - 1; }
  /// This hop's chunk for r.next(): a copy, since the wire may still hold
  /// it when the buffer changes (the next step zeroes the gradients).
  Tensor outgoing() const;
  /// How many values the chunk from r.prev() for this hop holds.
  std::int64_t incoming_numel() const;
  /// This hop's chunk from r.prev(), checked to hold incoming_numel()
  /// values: added or copied in; then the next hop. Throws tensor_error
  /// when done() or on a chunk of the wrong size.
  void apply(const Tensor& in);

 private:
  /// Where this hop's incoming chunk goes.
  Tensor target() const;

  ring_phase phase_;
  ring r_;
  Tensor flat_;
  int hop_ = 0;
};

/// Ring reduce-scatter of `flat` (f32 [n], host) summed over the ring: g-1
/// hops, each sending one chunk to the next member and adding the one
/// received from the previous. Afterwards chunk owned_chunk(r) of `flat`
/// holds the sum over all members; the other chunks hold partial sums.
/// `bucket` and `step` key the chunks (one reduction per bucket and step).
void ring_reduce_scatter(ring_channel& ch, const ring& r, Tensor& flat, std::int64_t step, int bucket);
/// Ring all-gather: afterwards every chunk of `flat` holds the value its
/// owner (owned_chunk) had.
void ring_all_gather(ring_channel& ch, const ring& r, Tensor& flat, std::int64_t step, int bucket);

// Device collectives over a bucket (kernels/device_group.hpp), with the
// ring's shards: member p of `r` ends up owning chunk owned_chunk(r) as in
// ring_reduce_scatter, so checkpoints are the same under both. NCCL's
// reduce-scatter takes equal chunks, so the bucket goes through a padded
// layout in `scratch` (on the device, at least size * pad values): the
// group's member p has slot p, `pad` values, holding the chunk p owns.
// Both are queued on `on` (a backend of the member's device) and return at
// once; the caller orders them after the gradients' producer and waits
// (device_group::synchronize) before reading the results on another queue.

/// Values per member in the padded layout of `n` values over `g` members:
/// the longest chunk.
std::int64_t device_chunk_pad(std::int64_t n, int g);
/// `flat` (this member's gradients, n values, device) summed over the group;
/// the sum of the member's owned chunk lands in shard[0, its length).
/// `shard`: pad values on the device.
void device_reduce_scatter(device_group& group, Backend& on, const ring& r, const Tensor& flat, Tensor& scratch,
                           Tensor& shard);
/// Every member's owned chunk, read from `flat` (n values, device) where
/// its owner updated it, into every member's `flat`. `shard` is overwritten.
void device_all_gather(device_group& group, Backend& on, const ring& r, Tensor& flat, Tensor& scratch, Tensor& shard);

}  // namespace corolla
