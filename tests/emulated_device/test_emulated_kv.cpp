// A kv_sequence on a device keeps its page tables in the device's memory
// (kv_pages_view::device_pages), so a device backend's attention uploads
// nothing: the tables must say what the host arrays say through every
// change of the sequence. The decode tests of this folder then generate the
// cpu's tokens with the emulated device reading its pages only through
// these tables (emulated_ops.cpp's attention_cached).
#include <doctest/doctest.h>

#include <memory>
#include <utility>

#include "model/kv_cache.hpp"
#include "tests/emulated_device/emulated_device.hpp"

using namespace corolla;
using corolla::testing::emulated_device_backend;

namespace {

/// Checks every used layer's device table of `seq` against its host arrays;
/// returns the table's address.
const void* check_tables(const kv_sequence& seq, const emulated_device_backend& dev) {
  const void* table = nullptr;
  const std::int64_t stride = 2 * (seq.last_layer() - seq.first_layer());
  for (int layer = seq.first_layer(); layer < seq.last_layer(); ++layer) {
    CAPTURE(layer);
    const kv_pages_view v = seq.view(layer);
    REQUIRE(v.device_pages != nullptr);
    CHECK(v.pages_device == dev.dev());
    CHECK(v.page_stride == stride);
    CHECK(v.key_entry == 2 * (layer - seq.first_layer()));
    REQUIRE(v.k_pages.size() == v.v_pages.size());
    for (std::size_t p = 0; p < v.k_pages.size(); ++p) {
      CAPTURE(p);
      const auto at = static_cast<std::size_t>(v.key_entry + static_cast<std::int64_t>(p) * v.page_stride);
      CHECK(v.device_pages[at] == v.k_pages[p]);
      CHECK(v.device_pages[at + 1] == v.v_pages[p]);
    }
    if (table == nullptr) table = v.device_pages;
    CHECK(v.device_pages == table);  // one table for every layer
  }
  return table;
}

}  // namespace

TEST_CASE("emulated device: a kv_sequence's device page tables follow its pages through growth, rollback and moves") {
  emulated_device_backend dev;
  const int page_tokens = 4;
  auto pool = std::make_shared<kv_pool>(std::size_t{1} << 22, 4, 2, 8, page_tokens, &dev);
  kv_sequence seq(pool, 1, 3);  // layers 1 and 2 of 4
  CHECK(seq.view(1).device_pages == nullptr);  // no pages, no table yet

  REQUIRE(seq.reserve(5).ok);  // two pages a layer
  CHECK(seq.view(1).k_pages.size() == 2);
  const void* first = check_tables(seq, dev);
  CHECK(seq.view(0).device_pages == nullptr);  // not a layer of the sequence

  REQUIRE(seq.reserve(70).ok);  // 18 pages: past the first table's room for 16, a new table written whole
  CHECK(seq.view(2).k_pages.size() == 18);
  const void* grown = check_tables(seq, dev);
  CHECK(grown != first);

  // Rollback returns pages to the pool; another sequence takes some of them,
  // and growing again writes the entries past the kept pages anew.
  seq.truncate(9);
  CHECK(seq.view(1).k_pages.size() == 3);
  check_tables(seq, dev);
  kv_sequence other(pool, 1, 3);
  REQUIRE(other.reserve(12).ok);
  check_tables(other, dev);
  REQUIRE(seq.reserve(40).ok);
  CHECK(seq.view(1).k_pages.size() == 10);
  CHECK(check_tables(seq, dev) == grown);  // still room: the same table

  kv_sequence moved(std::move(seq));
  CHECK(check_tables(moved, dev) == grown);
  kv_sequence assigned(pool, 1, 3);
  REQUIRE(assigned.reserve(4).ok);
  assigned = std::move(moved);
  CHECK(check_tables(assigned, dev) == grown);
  CHECK(assigned.view(2).k_pages.size() == 10);
}

TEST_CASE("a kv_sequence on the host keeps no device tables") {
  auto pool = std::make_shared<kv_pool>(std::size_t{1} << 20, 2, 2, 8, 4);
  kv_sequence seq(pool);
  REQUIRE(seq.reserve(20).ok);
  CHECK(seq.view(0).device_pages == nullptr);
  CHECK(seq.view(0).k_pages.size() == 5);
}

TEST_CASE("emulated device: a sequence sharing another's pages has tables of its own, rewritten after a copy") {
  emulated_device_backend dev;
  auto pool = std::make_shared<kv_pool>(std::size_t{1} << 22, 3, 2, 8, 4, &dev);
  kv_sequence a(pool);
  REQUIRE(a.reserve(14).ok);
  for (int l = 0; l < 3; ++l)
    for (std::int64_t pos = 0; pos < 14; ++pos) a.claim_row(l, pos);
  kv_sequence b(pool);
  REQUIRE(b.share_prefix(a, 14) == 14);
  const void* table = check_tables(b, dev);
  CHECK(table != check_tables(a, dev));
  CHECK(b.view(1).k_pages[2] == a.view(1).k_pages[2]);
  CHECK(b.view(1).k_pages[3] != a.view(1).k_pages[3]);  // the page the prefix ends inside: a copy
  // Writing from inside a shared page copies it and writes the table
  // again from there (no new page: the same table).
  b.truncate(6);
  REQUIRE(b.reserve(8, 6).ok);
  CHECK(b.view(1).k_pages[1] != a.view(1).k_pages[1]);
  CHECK(b.view(1).k_pages[0] == a.view(1).k_pages[0]);
  CHECK(check_tables(b, dev) == table);
  REQUIRE(b.reserve(20).ok);
  check_tables(b, dev);
  check_tables(a, dev);
}
