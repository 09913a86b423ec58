// tests/fuzz/make_corpus.cpp — writes the committed seed corpus of the wire
// decoder fuzzer (tests/fuzz/corpus/): valid messages of every shape of
// interest and a few broken ones, each a small file in the fuzz_input.hpp
// format. Run once after changing the wire format:
//   cmake --build build --target fuzz_make_corpus_run
// (or build/tests/fuzz/fuzz_make_corpus tests/fuzz/corpus).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <caf/sec.hpp>

#include "fuzz_input.hpp"
#include "net/codec.hpp"
#include "net/fragment.hpp"
#include "net/outbox.hpp"

using namespace corolla;
using namespace corolla::net;

namespace {

int failures = 0;

/// Writes one seed and checks that the decoder accepts valid_* seeds and
/// rejects bad_* ones, printing the reason.
void write(const std::filesystem::path& dir, const std::string& name,
           const std::vector<std::uint8_t>& bytes) {
  std::ofstream(dir / name, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  auto input = fuzz::split_input(bytes.data(), bytes.size());
  decode_limits limits;
  limits.verify_checksums = input.verify_checksums;
  caf::expected<message> m = caf::make_error(caf::sec::invalid_argument, std::string("fragments complete no message"));
  if (!input.frames.empty() && is_fragment_header(input.frames[0].data, input.frames[0].size)) {
    reassembler in(limits);  // a seed of fragments: valid when they complete a message that decodes
    for (auto fragment : fuzz::fragment_groups(input.frames)) {
      auto done = in.add(fragment);
      if (!done) m = done.error();
      else if (*done) m = decode(**done, limits);
    }
  } else {
    m = decode(input.frames, limits);
  }
  const bool want_valid = name.rfind("valid_", 0) == 0;
  if (static_cast<bool>(m) != want_valid) ++failures;
  std::printf("%-26s %4zu bytes  %s%s\n", name.c_str(), bytes.size(),
              m ? "decodes" : ("rejected: " + error_text(m.error())).c_str(),
              static_cast<bool>(m) != want_valid ? "  <-- UNEXPECTED" : "");
}

Tensor counting(shape_t shape, dtype t) {
  Tensor x = Tensor::empty(shape, t);
  auto* p = static_cast<unsigned char*>(x.raw());
  for (std::size_t i = 0; i < x.nbytes(); ++i) p[i] = static_cast<unsigned char>(i * 37 + 11);
  return x;
}

message base(message_kind k) {
  message m;
  m.kind = k;
  m.sender_node = "node-a";
  m.sender_actor = "pinger";
  m.target_actor = "echo";
  m.correlation_id = 7;
  m.type = "echo";
  m.sent_at_ns = 123456789;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : "corpus";
  std::filesystem::create_directories(dir);

  // ---- valid ----
  write(dir, "valid_heartbeat", fuzz::join_frames(encode(base(message_kind::heartbeat)), true));

  message one = base(message_kind::request);
  one.body = {1, 2, 3, 4, 5, 6, 7, 8};
  one.tensors.push_back(counting({4, 4}, dtype::f32));
  write(dir, "valid_request_f32", fuzz::join_frames(encode(one), true));
  write(dir, "valid_request_unaligned", fuzz::join_frames(encode(one), false));

  message all = base(message_kind::response);
  all.tensors = {counting({2, 3}, dtype::f32), counting({5}, dtype::bf16), counting({}, dtype::f16),
                 counting({0, 3}, dtype::i32), counting({3, 1, 2}, dtype::i8)};
  write(dir, "valid_all_dtypes", fuzz::join_frames(encode(all), true));
  write(dir, "valid_no_checksums", fuzz::join_frames(encode(all, false), false));

  message q = base(message_kind::oneway);
  std::vector<float> values(40);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) - 20.5f;
  q.tensors = {Tensor::from_f32(values, {5, 8})};
  q.encodings = {tensor_encoding::int8_block};
  write(dir, "valid_int8_block", fuzz::join_frames(encode(q), true));

  message err = base(message_kind::error);
  err.error_code = "unknown_actor";
  err.error_message = "no actor named echo2 on node-b";
  write(dir, "valid_error", fuzz::join_frames(encode(err), false));

  hello_info h;
  h.protocol_version = protocol_version;
  h.node_id = "node-b";
  h.listen_endpoint = "tcp://127.0.0.1:4000";
  h.nic_class = "ethernet";
  h.capabilities = {"int8-tensors"};
  h.max_message_bytes = 1 << 30;
  message hello = base(message_kind::hello);
  hello.body = encode_hello(h);
  write(dir, "valid_hello", fuzz::join_frames(encode(hello), true));

  // Fragments of a message carrying a 6000-byte tensor (4096-byte pieces),
  // and the same with its first fragment lost.
  message large = base(message_kind::oneway);
  large.tensors = {counting({1500}, dtype::f32)};
  out_message whole;
  whole.frames = encode(large);
  for (const auto& f : whole.frames) whole.bytes += f.size;
  outbox box(4096);
  box.push(std::move(whole));
  std::vector<out_frame> pieces, first_lost;
  bool first = true;
  while (auto piece = box.next(true)) {
    pieces.insert(pieces.end(), piece->frames.begin(), piece->frames.end());
    if (!first) first_lost.insert(first_lost.end(), piece->frames.begin(), piece->frames.end());
    first = false;
  }
  write(dir, "valid_fragments", fuzz::join_frames(pieces, true));
  write(dir, "bad_fragment_first_lost", fuzz::join_frames(first_lost, true));

  // ---- invalid ----
  auto frames = encode(one);
  auto truncated = frames;
  truncated[0].size = 24;
  write(dir, "bad_truncated_envelope", fuzz::join_frames(truncated, true));

  auto short_tensor = frames;
  short_tensor[1].size -= 4;
  write(dir, "bad_short_tensor_frame", fuzz::join_frames(short_tensor, true));

  auto missing = frames;
  missing.pop_back();
  write(dir, "bad_missing_frame", fuzz::join_frames(missing, true));

  auto flipped = fuzz::join_frames(frames, true);
  flipped.back() ^= 0x5a;  // last payload byte: checksum mismatch
  write(dir, "bad_checksum", flipped);

  std::vector<std::uint8_t> garbage = {0x00, 0x20, 0x00};
  for (int i = 0; i < 32; ++i) garbage.push_back(static_cast<std::uint8_t>(0xff - i * 7));
  write(dir, "bad_garbage_envelope", garbage);
  return failures == 0 ? 0 : 1;
}
