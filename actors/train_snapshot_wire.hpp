// actors/train_snapshot_wire.hpp — the wire forms of in-memory snapshots
// (actors/train_snapshots.hpp; net/wire.capnp: TrainSnapshot,
// TrainSnapshotIndex): a snapshot in one message or in parts of bounded
// size, what a keeper holds, and a request for some of it. Decoding
// validates: a malformed body is a bad_message error, never an exception.
//
// A snapshot larger than one message (a node refuses messages over 1 GiB
// by default, and a real model's stage holds several GB of moments) goes
// to its buddy's keeper in parts: each a train.snap of the same header
// carrying pieces of some tensors (each piece: where it starts in its
// tensor and the tensor's whole size) and how many parts there are. The
// keeper keeps the snapshot once every part came. A rank of a new grid
// fetches large tensors the same way, a range of values per request.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "actors/train_snapshots.hpp"

namespace corolla {

/// Snapshots (and requests, and listings) of more tensors than this are
/// refused (three per bucket).
inline constexpr unsigned max_snapshot_tensors = 3 * 4096;
/// The most tensors (or pieces) one train.snap message carries: what a
/// node takes in one message (net::decode_limits).
inline constexpr std::size_t max_snapshot_message_tensors = 64;

/// Values [offset, offset + values.numel()) of a snapshot's tensor `name`,
/// which has `total` values.
struct snapshot_piece {
  std::string name;
  std::int64_t offset = 0, total = 0;
  Tensor values;
  bool whole() const { return offset == 0 && values.numel() == total; }
};

/// One train.snap message: whose snapshot of which step (`header`: no
/// tensors), some of its tensors or pieces of them, and how many messages
/// carry the whole snapshot.
struct snapshot_part {
  rank_snapshot header;
  std::vector<snapshot_piece> pieces;
  int parts = 1;
  /// One message of whole tensors: a snapshot by itself.
  bool whole() const;
  /// The snapshot a whole() part is.
  rank_snapshot snapshot() &&;
};

/// Values [offset, offset + count) of the tensor at index `tensor` of a list.
struct value_range {
  std::size_t tensor = 0;
  std::int64_t offset = 0, count = 0;
};
/// Tensors of `sizes` values, in order, packed into messages of at most
/// `room` values (at least one) and `max_ranges` ranges each: a tensor
/// split where a message's room ends. One message, empty, for no tensors.
/// A snapshot's parts and a fetch's requests are planned by it.
std::vector<std::vector<value_range>> pack_values(const std::vector<std::int64_t>& sizes, std::int64_t room,
                                                  std::size_t max_ranges);

/// `s` as one train.snap message (tensor i is entry i). In-process sends
/// (to a rank's own keeper) and keepers' answers use it.
remote_message encode_snapshot(const rank_snapshot& s);
/// `s` as train.snap messages of at most `max_bytes` of values each (at
/// least one value each; more where the snapshot would need over 2^19
/// parts) and max_snapshot_message_tensors pieces: tensors in order, one
/// split where the room of a message ends. One message when it fits. The
/// pieces are views of `s`'s tensors.
std::vector<remote_message> encode_snapshot_parts(const rank_snapshot& s, std::int64_t max_bytes);
/// `pieces` of the snapshot `header` names as one train.snap message, one
/// of `parts` (a keeper's answer to a ranged train.snapget is one part of
/// one). Offsets and totals travel only when some piece is not a whole tensor.
remote_message encode_snapshot_pieces(const rank_snapshot& header, const std::vector<snapshot_piece>& pieces,
                                      int parts = 1);
/// A train.snap message back, whole or a part; bad_message for a malformed one.
caf::expected<snapshot_part> decode_snapshot_part(const remote_message& m);
/// A train.snap message that is a whole snapshot; bad_message for a
/// malformed one or a part.
caf::expected<rank_snapshot> decode_snapshot(const remote_message& m);

/// `x` as a train.snaps message (wire::TrainSnapshotIndex).
remote_message encode_snapshot_index(const snapshot_index& x);
/// A train.snaps message back; bad_message for a malformed one.
caf::expected<snapshot_index> decode_snapshot_index(const remote_message& m);

/// A train.snapget request: which tensors (and which of their values) of
/// whose snapshot of which step.
struct snapshot_wanted {
  int owner = 0;
  std::int64_t step = 0;
  std::uint64_t job = 0;
  std::vector<std::string> names;  ///< none = every tensor, whole
  /// Per name, the values wanted: [first, first + second). Empty = whole tensors.
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
};
remote_message encode_wanted(const snapshot_wanted& w);
caf::expected<snapshot_wanted> decode_wanted(const remote_message& m);

/// Whether `name` may name a snapshot's tensor ("params.block.3", "m.head", "v.head").
bool valid_snapshot_tensor_name(const std::string& name);

}  // namespace corolla
