// The paged KV cache: lazy pages, or the whole budget up front (a server's),
// the byte budget and its message, reuse of released pages, rollback, and
// what the attention kernel gets to see.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <thread>
#include <span>
#include <vector>

#include "model/kv_cache.hpp"

using namespace corolla;

namespace {

/// [n, width] rows whose values encode (position, column, salt).
Tensor rows_for(std::int64_t start, std::int64_t n, std::int64_t width, float salt) {
  std::vector<float> v(static_cast<std::size_t>(n * width));
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t c = 0; c < width; ++c)
      v[static_cast<std::size_t>(r * width + c)] =
          static_cast<float>((start + r) * 1000 + c) + salt;
  return Tensor::from_f32(v, {n, width});
}

/// The value view() exposes for token `pos`, column `c`.
float cached(const kv_pages_view& view, bool keys, std::int64_t pos, std::int64_t width,
             std::int64_t c) {
  const auto page = static_cast<std::size_t>(pos / view.page_tokens);
  const auto* base = static_cast<const float*>(keys ? view.k_pages[page] : view.v_pages[page]);
  return base[(pos % view.page_tokens) * width + c];
}

}  // namespace

TEST_CASE("kv pool allocates pages lazily, not the whole budget") {
  // 2 layers, 2 kv heads of 4: a page is one layer's K and V for 16 tokens.
  auto pool = std::make_shared<kv_pool>(1 << 20, 2, 2, 4, 16);
  CHECK(pool->page_bytes() == 2u * 16 * 8 * 4);
  CHECK(pool->bytes_per_token() == 2u * 2 * 8 * 4);
  CHECK(pool->pages_allocated() == 0);
  kv_sequence seq(pool);
  CHECK(seq.capacity() == 0);
  REQUIRE(seq.reserve(1));
  CHECK(pool->pages_allocated() == 2);  // one per layer
  CHECK(seq.capacity() == 16);
  REQUIRE(seq.reserve(16));
  CHECK(pool->pages_allocated() == 2);
  REQUIRE(seq.reserve(17));
  CHECK(pool->pages_allocated() == 4);
  CHECK(pool->pages_in_use() == 4);
}

TEST_CASE("kv pool allocated up front holds every page from the start and never allocates more") {
  auto pool = std::make_shared<kv_pool>(8 * 2 * 16 * 8 * 4, 2, 2, 4, 16, nullptr, dtype::f32, kv_allocation::up_front);
  CHECK(pool->allocation() == kv_allocation::up_front);
  CHECK(pool->max_pages() == 8);
  CHECK(pool->pages_allocated() == 8);
  CHECK(pool->pages_in_use() == 0);
  std::vector<std::byte*> pages;
  REQUIRE(pool->acquire(8, pages));
  CHECK_FALSE(pool->acquire(1, pages));  // the budget, not the memory, is the limit
  // The pages are distinct, page_bytes apart in one block, first page first.
  for (std::size_t i = 1; i < pages.size(); ++i) CHECK(pages[i] == pages[0] + i * pool->page_bytes());
  pool->release(pages, 4);
  CHECK(pool->pages_in_use() == 4);
  std::vector<std::byte*> again;
  REQUIRE(pool->acquire(4, again));
  CHECK(pool->pages_allocated() == 8);
  // A sequence writes and reads its rows through them as through lazy pages.
  pages.resize(4);  // the other four went back above
  pool->release(pages);
  pool->release(again);
  CHECK(pool->pages_in_use() == 0);
  kv_sequence seq(pool);
  REQUIRE(seq.reserve(20));
  const Tensor k = rows_for(0, 20, 8, 0.5f), v = rows_for(0, 20, 8, 0.25f);
  for (int layer = 0; layer < 2; ++layer) seq.append(layer, 0, k, v);
  const kv_pages_view view = seq.view(1);
  CHECK(cached(view, true, 19, 8, 7) == 19 * 1000 + 7 + 0.5f);
  CHECK(cached(view, false, 3, 8, 2) == 3 * 1000 + 2 + 0.25f);
}

TEST_CASE("kv pool up front: a budget the memory cannot hold fails at once, naming pages, bytes and device") {
  // 2^50 bytes (a PiB): no host gives that to one allocation.
  const std::size_t budget = std::size_t{1} << 50;
  try {
    kv_pool pool(budget, 2, 2, 4, 16, nullptr, dtype::f32, kv_allocation::up_front);
    FAIL("a PiB of KV cache was allocated");
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    CHECK(m.find("cannot allocate the KV cache up front") != std::string::npos);
    CHECK(m.find(std::to_string(budget / (2 * 16 * 8 * 4)) + " pages") != std::string::npos);
    CHECK(m.find("MiB of f32 on cpu") != std::string::npos);
  }
  // Lazily, the same budget allocates nothing and works until memory runs out.
  kv_pool lazy(budget, 2, 2, 4, 16);
  CHECK(lazy.pages_allocated() == 0);
  std::vector<std::byte*> pages;
  REQUIRE(lazy.acquire(2, pages));
  CHECK(lazy.pages_allocated() == 2);
}

TEST_CASE("kv cache full gives a clear message and acquires nothing") {
  // Room for exactly 3 pages of 4 tokens over both layers.
  const int layers = 2, heads = 1, dim = 2, page = 4;
  const std::size_t page_bytes = 2u * layers * page * heads * dim * sizeof(float);  // both layers' pages
  auto pool = std::make_shared<kv_pool>(3 * page_bytes, layers, heads, dim, page);
  kv_sequence a(pool);
  REQUIRE(a.reserve(8));  // 2 pages
  kv_sequence b(pool);
  kv_reservation r = b.reserve(9);  // needs 3 pages, 1 free
  CHECK_FALSE(r);
  CHECK(r.error == "KV cache full: need 9 more tokens (" + std::to_string(3 * page_bytes) +
                       " bytes), " + std::to_string(page_bytes) + " bytes free of " +
                       std::to_string(3 * page_bytes));
  CHECK(b.capacity() == 0);
  CHECK(pool->pages_in_use() == 4);
  CHECK(b.reserve(4));  // the last page still fits
  CHECK_FALSE(a.reserve(9));
}

TEST_CASE("kv pages are reused after a sequence is released") {
  const std::size_t page_bytes = 2u * 1 * 4 * 1 * 2 * sizeof(float);
  auto pool = std::make_shared<kv_pool>(4 * page_bytes, 1, 1, 2, 4);
  {
    kv_sequence a(pool);
    REQUIRE(a.reserve(16));
    CHECK(pool->free_bytes() == 0);
    kv_sequence b(pool);
    CHECK_FALSE(b.reserve(1));
  }
  CHECK(pool->pages_in_use() == 0);
  CHECK(pool->free_bytes() == 4 * page_bytes);
  kv_sequence c(pool);
  REQUIRE(c.reserve(16));
  CHECK(pool->pages_allocated() == 4);  // the same four pages, nothing new
  // Moving a sequence moves its pages (no double release).
  kv_sequence d(std::move(c));
  CHECK(d.capacity() == 16);
  CHECK(pool->pages_in_use() == 4);
}

TEST_CASE("kv append across pages is what view shows, per layer") {
  const int layers = 3, heads = 2, dim = 3, page = 4;
  const std::int64_t width = heads * dim;
  auto pool = std::make_shared<kv_pool>(1 << 20, layers, heads, dim, page);
  kv_sequence seq(pool);
  REQUIRE(seq.reserve(11));
  // Chunks 0..5, 6..6, 7..10: crossing page boundaries inside a chunk.
  const std::int64_t chunks[][2] = {{0, 6}, {6, 1}, {7, 4}};
  for (auto [start, n] : chunks)
    for (int l = 0; l < layers; ++l)
      seq.append(l, start, rows_for(start, n, width, 0.1f * l), rows_for(start, n, width, 0.5f + 0.1f * l));
  CHECK(seq.length() == 11);
  for (int l = 0; l < layers; ++l) {
    kv_pages_view v = seq.view(l);
    CHECK(v.length == 11);
    CHECK(v.page_tokens == page);
    CHECK(v.k_pages.size() == 3);
    for (std::int64_t pos = 0; pos < 11; ++pos)
      for (std::int64_t c = 0; c < width; ++c) {
        CHECK(cached(v, true, pos, width, c) == doctest::Approx(pos * 1000 + c + 0.1f * l));
        CHECK(cached(v, false, pos, width, c) == doctest::Approx(pos * 1000 + c + 0.5f + 0.1f * l));
      }
  }
  // A gap or writing past the reserved capacity is a programming error.
  CHECK_THROWS_AS(seq.append(0, 12, rows_for(12, 1, width, 0), rows_for(12, 1, width, 0)),
                  tensor_error);
  CHECK_THROWS_AS(seq.append(0, 11, rows_for(11, 2, width, 0), rows_for(11, 2, width, 0)),
                  tensor_error);

  // claim_row names the row append would write, and the same mistakes fail.
  kv_sequence one(pool);
  REQUIRE(one.reserve(6));
  for (std::int64_t pos = 0; pos < 6; ++pos) {
    auto [k, v] = one.claim_row(1, pos);
    const kv_pages_view view = one.view(1);
    CHECK(view.length == pos + 1);
    const auto page_of = [&](std::span<const void* const> pages) {
      return static_cast<const float*>(pages[static_cast<std::size_t>(pos / page)]);
    };
    CHECK(k == page_of(view.k_pages) + (pos % page) * width);
    CHECK(v == page_of(view.v_pages) + (pos % page) * width);
  }
  REQUIRE(one.capacity() == 8);  // two pages
  one.claim_row(1, 6);
  one.claim_row(1, 7);
  CHECK_THROWS_WITH_AS(one.claim_row(1, 8), doctest::Contains("exceed the reserved capacity of 8"), tensor_error);
  CHECK_THROWS_WITH_AS(one.claim_row(2, 1), doctest::Contains("cannot write at position 1"), tensor_error);
  CHECK_THROWS_WITH_AS(one.claim_row(3, 0), doctest::Contains("outside the sequence's layers"), tensor_error);
  CHECK(one.view(1).length == 8);  // the refused claims changed nothing
}

TEST_CASE("kv truncate rolls back and returns pages") {
  const std::int64_t width = 2;
  auto pool = std::make_shared<kv_pool>(1 << 20, 2, 1, 2, 4);
  kv_sequence seq(pool);
  REQUIRE(seq.reserve(10));
  for (int l = 0; l < 2; ++l) seq.append(l, 0, rows_for(0, 10, width, 0), rows_for(0, 10, width, 1));
  CHECK(pool->pages_in_use() == 6);
  seq.truncate(5);
  CHECK(seq.length() == 5);
  CHECK(seq.capacity() == 8);
  CHECK(pool->pages_in_use() == 4);
  CHECK(seq.view(1).length == 5);
  // Rewrite from position 5 with different values: the old tail is gone.
  REQUIRE(seq.reserve(7));
  for (int l = 0; l < 2; ++l) seq.append(l, 5, rows_for(5, 2, width, 0.25f), rows_for(5, 2, width, 0.75f));
  CHECK(seq.length() == 7);
  kv_pages_view v = seq.view(0);
  CHECK(cached(v, true, 4, width, 1) == doctest::Approx(4001.0f));
  CHECK(cached(v, true, 6, width, 1) == doctest::Approx(6001.25f));
  CHECK(cached(v, false, 5, width, 0) == doctest::Approx(5000.75f));
  seq.truncate(0);
  CHECK(pool->pages_in_use() == 0);
  CHECK(seq.length() == 0);
}

TEST_CASE("kv pool hands out pages safely from many threads") {
  const std::size_t page_bytes = 2u * 1 * 1 * 1 * 4 * sizeof(float);
  auto pool = std::make_shared<kv_pool>(64 * page_bytes, 1, 1, 4, 1);
  std::vector<std::thread> threads;
  std::vector<int> granted(8, 0);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        kv_sequence s(pool);
        if (s.reserve(8)) ++granted[static_cast<std::size_t>(t)];
      }
    });
  for (auto& t : threads) t.join();
  CHECK(pool->pages_in_use() == 0);
  CHECK(pool->pages_allocated() <= 64);
  for (int g : granted) CHECK(g > 0);
}

TEST_CASE("a sequence over part of the pool's layers takes pages for those layers only") {
  const std::int64_t width = 2;
  const int layers = 4, page = 4;
  const std::size_t layer_page = 2u * page * width * sizeof(float);
  auto pool = std::make_shared<kv_pool>(4 * layer_page, layers, 1, 2, page);
  kv_sequence part(pool, 1, 3);
  CHECK(part.first_layer() == 1);
  CHECK(part.last_layer() == 3);
  REQUIRE(part.reserve(8));  // 2 token pages x 2 layers: the whole budget
  CHECK(pool->pages_in_use() == 4);
  CHECK(part.capacity() == 8);
  kv_sequence whole(pool);
  CHECK_FALSE(whole.reserve(1));  // would need 4 more pages
  for (int l = 1; l < 3; ++l) part.append(l, 0, rows_for(0, 6, width, 0), rows_for(0, 6, width, 1));
  CHECK(part.length() == 6);
  CHECK(cached(part.view(2), true, 5, width, 1) == doctest::Approx(5001.0f));
  CHECK(part.view(0).length == 0);
  CHECK(part.view(0).k_pages.empty());
  CHECK_THROWS_AS(part.append(0, 0, rows_for(0, 1, width, 0), rows_for(0, 1, width, 0)), tensor_error);
  CHECK_THROWS_AS(part.append(3, 0, rows_for(0, 1, width, 0), rows_for(0, 1, width, 0)), tensor_error);
  part.truncate(3);
  CHECK(pool->pages_in_use() == 2);
  CHECK(part.length() == 3);
  CHECK_THROWS_AS(kv_sequence(pool, 2, 2), std::invalid_argument);
  CHECK_THROWS_AS(kv_sequence(pool, 0, 5), std::invalid_argument);
}

TEST_CASE("a bf16 or f16 pool holds twice the tokens per budget and stores each value rounded once") {
  const std::int64_t width = 6;
  const int page = 4;
  for (dtype type : {dtype::bf16, dtype::f16}) {
    const std::string name = dtype_name(type);
    CAPTURE(name);
    const std::size_t budget = 4u * 2 * page * width * sizeof(float);  // 4 f32 pages of one layer
    auto f32_pool = std::make_shared<kv_pool>(budget, 1, 2, 3, page);
    auto pool = std::make_shared<kv_pool>(budget, 1, 2, 3, page, nullptr, type);
    CHECK(pool->type() == type);
    CHECK(pool->page_bytes() * 2 == f32_pool->page_bytes());
    CHECK(pool->bytes_per_token() * 2 == f32_pool->bytes_per_token());
    CHECK(pool->max_pages() == 2 * f32_pool->max_pages());

    kv_sequence seq(pool);
    REQUIRE(seq.reserve(10));
    // Values a 16-bit type cannot hold exactly: 1/3 and friends.
    std::vector<float> third(static_cast<std::size_t>(10 * width));
    for (std::size_t i = 0; i < third.size(); ++i) third[i] = static_cast<float>(i + 1) / 3.0f;
    const Tensor k = Tensor::from_f32(third, {10, width});
    const Tensor v = Tensor::from_f32(third, {10, width}).clone();
    seq.append(0, 0, k.slice(0, 9), v.slice(0, 9));
    auto [k_row, v_row] = seq.claim_row(0, 9);  // a decode step writes its row itself
    Tensor q_row = Tensor::zeros({1, 3}), k_last = k.slice(9, 10).clone();
    cpu_backend().rope_store_kv(q_row, k_last, v.slice(9, 10), Tensor::from_i32(std::vector<std::int32_t>{9}, {1}), 1,
                                2, 3, 10000.0f, false, k_row, v_row, type);
    const kv_pages_view view = seq.view(0);
    CHECK(view.type == type);
    const std::vector<float> want = k.to(type).to_vector();  // each value rounded once
    for (std::int64_t pos = 0; pos < 10; ++pos) {
      const std::size_t bytes = static_cast<std::size_t>(width) * dtype_size(type);
      const auto page_row = [&](std::span<const void* const> pages) {
        const auto* base = static_cast<const std::byte*>(pages[static_cast<std::size_t>(pos / page)]);
        Tensor row = Tensor::wrap(storage::borrow(const_cast<std::byte*>(base) + (pos % page) * bytes, bytes, nullptr),
                                  0, {width}, type);
        return row.to_vector();
      };
      const std::vector<float> kr = page_row(view.k_pages), vr = page_row(view.v_pages);
      for (std::int64_t c = 0; c < width; ++c) {
        CAPTURE(pos);
        CAPTURE(c);
        CHECK(kr[static_cast<std::size_t>(c)] == want[static_cast<std::size_t>(pos * width + c)]);
        CHECK(vr[static_cast<std::size_t>(c)] == want[static_cast<std::size_t>(pos * width + c)]);
      }
    }
  }
  CHECK_THROWS_WITH_AS(kv_pool(1024, 1, 1, 2, 4, nullptr, dtype::i8), "kv_pool: pages are f32, bf16 or f16, not i8",
                       std::invalid_argument);
}

namespace {

/// Writes tokens [start, start + n) of every layer of `seq` (keys salted by
/// the layer, values by 0.5 more).
void fill(kv_sequence& seq, std::int64_t start, std::int64_t n, float salt = 0.0f) {
  REQUIRE(seq.reserve(start + n, start));
  const std::int64_t width = seq.pool().row_width();
  for (int l = seq.first_layer(); l < seq.last_layer(); ++l)
    seq.append(l, start, rows_for(start, n, width, salt + 0.1f * l), rows_for(start, n, width, salt + 0.5f + 0.1f * l));
}

/// True when every layer of `seq` holds what fill(start, n, salt) wrote.
bool holds(const kv_sequence& seq, std::int64_t start, std::int64_t n, float salt = 0.0f) {
  const std::int64_t width = seq.pool().row_width();
  for (int l = seq.first_layer(); l < seq.last_layer(); ++l) {
    const kv_pages_view v = seq.view(l);
    for (std::int64_t pos = start; pos < start + n; ++pos)
      for (std::int64_t c = 0; c < width; ++c)
        if (cached(v, true, pos, width, c) != static_cast<float>(pos * 1000 + c) + salt + 0.1f * l ||
            cached(v, false, pos, width, c) != static_cast<float>(pos * 1000 + c) + salt + 0.5f + 0.1f * l)
          return false;
  }
  return true;
}

}  // namespace

TEST_CASE("sequences that share a prefix hold its whole pages once, until the last of them lets go") {
  const int layers = 3, page = 4;
  auto pool = std::make_shared<kv_pool>(1 << 20, layers, 2, 3, page);
  kv_sequence a(pool);
  fill(a, 0, 10);  // pages 0, 1 full, page 2 half
  CHECK(pool->pages_in_use() == 3 * layers);

  kv_sequence b(pool);
  CHECK(b.share_prefix(a, 10) == 10);
  CHECK(b.length() == 10);
  CHECK(b.capacity() == 12);
  CHECK(pool->pages_in_use() == 4 * layers);  // the whole pages shared, the half one copied
  CHECK(pool->shared_pages() == 2 * layers);
  for (int l = 0; l < layers; ++l) {
    for (std::size_t p = 0; p < 2; ++p) {
      CHECK(b.view(l).k_pages[p] == a.view(l).k_pages[p]);
      CHECK(b.view(l).v_pages[p] == a.view(l).v_pages[p]);
    }
    CHECK(b.view(l).k_pages[2] != a.view(l).k_pages[2]);
  }
  CHECK(holds(b, 0, 10));
  // Each goes on with pages of its own; the shared ones stay as they were.
  fill(b, 10, 3, 0.25f);
  fill(a, 10, 1, 0.5f);
  CHECK(pool->pages_in_use() == 5 * layers);
  CHECK(holds(a, 0, 10));
  CHECK(holds(a, 10, 1, 0.5f));
  CHECK(holds(b, 0, 10));
  CHECK(holds(b, 10, 3, 0.25f));
  // Asking for more than `from` holds shares what it holds; nothing, nothing.
  kv_sequence c(pool);
  CHECK(c.share_prefix(a, 100) == 11);
  CHECK(holds(c, 0, 10));
  CHECK(holds(c, 10, 1, 0.5f));
  CHECK(pool->pages_in_use() == 6 * layers);
  kv_sequence none(pool);
  CHECK(none.share_prefix(a, 0) == 0);
  CHECK(none.pages() == 0);
  // Less than a page: a copy alone.
  kv_sequence little(pool);
  CHECK(little.share_prefix(a, 3) == 3);
  CHECK(holds(little, 0, 3));
  CHECK(little.view(0).k_pages[0] != a.view(0).k_pages[0]);
  little.release();
  CHECK(pool->shared_pages() == 2 * layers);

  // The first holder leaving frees its own pages only.
  a.release();
  CHECK(pool->pages_in_use() == 5 * layers);
  CHECK(pool->shared_pages() == 2 * layers);  // b and c still share them
  CHECK(pool->holders(b.held_pages()[0]) == 2);
  CHECK(pool->holders(b.held_pages().back()) == 1);  // b's own last page
  CHECK(b.held_pages().size() == static_cast<std::size_t>(b.pages()));
  CHECK(holds(b, 0, 10));
  c.release();
  CHECK(pool->shared_pages() == 0);
  CHECK(pool->pages_in_use() == 4 * layers);
  b.release();
  CHECK(pool->pages_in_use() == 0);
  CHECK(pool->free_bytes() == pool->budget_bytes());
}

TEST_CASE("a prefix ending inside a page is shared up to its whole pages when the pool has no page for the copy") {
  const int layers = 2, page = 4;
  const auto page_bytes = static_cast<std::size_t>(2 * page * 2 * 3 * 4);
  auto pool = std::make_shared<kv_pool>(3 * layers * page_bytes, layers, 2, 3, page);
  kv_sequence a(pool);
  fill(a, 0, 10);
  kv_sequence b(pool);
  CHECK(b.share_prefix(a, 10) == 8);
  CHECK(b.length() == 8);
  CHECK(holds(b, 0, 8));
  CHECK(pool->pages_in_use() == 3 * layers);
}

TEST_CASE("writing over a shared page writes to a copy of its own, taken before any write") {
  const int layers = 2, page = 4;
  const auto page_bytes = static_cast<std::size_t>(2 * page * 2 * 3 * 4);
  SUBCASE("room for the copy") {
    auto pool = std::make_shared<kv_pool>(1 << 20, layers, 2, 3, page);
    kv_sequence a(pool);
    fill(a, 0, 12);
    kv_sequence b(pool);
    REQUIRE(b.share_prefix(a, 12) == 12);
    CHECK(pool->shared_pages() == 3 * layers);
    b.truncate(6);  // page 2 is a's alone again; pages 0 and 1 stay shared
    CHECK(b.length() == 6);
    CHECK(pool->shared_pages() == 2 * layers);
    CHECK(pool->pages_in_use() == 3 * layers);
    // Writing there without saying so first is refused.
    const std::int64_t width = pool->row_width();
    CHECK_THROWS_WITH_AS(b.append(0, 6, rows_for(6, 1, width, 0), rows_for(6, 1, width, 0)),
                         doctest::Contains("in a page other sequences hold too"), tensor_error);
    CHECK_THROWS_WITH_AS(b.claim_row(1, 6), doctest::Contains("in a page other sequences hold too"), tensor_error);
    // Reserving from position 6 copies page 1 and takes a new page 2.
    REQUIRE(b.reserve(10, 6));
    CHECK(pool->shared_pages() == layers);  // page 0 only
    CHECK(pool->pages_in_use() == 5 * layers);
    for (int l = 0; l < layers; ++l) {
      CHECK(b.view(l).k_pages[0] == a.view(l).k_pages[0]);
      CHECK(b.view(l).k_pages[1] != a.view(l).k_pages[1]);
      CHECK(b.view(l).v_pages[1] != a.view(l).v_pages[1]);
    }
    CHECK(holds(b, 0, 6));  // the copy holds what was there
    fill(b, 6, 4, 0.25f);
    CHECK(holds(b, 6, 4, 0.25f));
    CHECK(holds(a, 0, 12));  // a's keys and values are untouched
    // A holder cut on a page boundary keeps its pages as they are.
    kv_sequence c(pool);
    REQUIRE(c.share_prefix(a, 12) == 12);
    const auto in_use = pool->pages_in_use();
    c.truncate(8);
    CHECK(c.length() == 8);
    CHECK(pool->pages_in_use() == in_use);
    for (int l = 0; l < layers; ++l) CHECK(c.view(l).k_pages[1] == a.view(l).k_pages[1]);
    // The first holder rewriting its own tokens copies what c still holds.
    fill(a, 5, 2, 0.5f);
    CHECK(a.length() == 7);
    for (int l = 0; l < layers; ++l) CHECK(c.view(l).k_pages[1] != a.view(l).k_pages[1]);
    CHECK(holds(a, 0, 5));
    CHECK(holds(a, 5, 2, 0.5f));
    CHECK(holds(c, 0, 8));
  }
  SUBCASE("a full pool: nothing changes") {
    auto pool = std::make_shared<kv_pool>(3 * layers * page_bytes, layers, 2, 3, page);
    REQUIRE(pool->max_pages() == 3 * layers);
    kv_sequence a(pool);
    fill(a, 0, 12);
    kv_sequence b(pool);
    REQUIRE(b.share_prefix(a, 12) == 12);
    b.truncate(6);
    const kv_reservation r = b.reserve(8, 6);
    CHECK_FALSE(r.ok);
    CHECK(r.error.rfind("KV cache full: need 4 more tokens (" + std::to_string(layers * page_bytes) + " bytes)", 0) == 0);
    CHECK(b.length() == 6);
    for (int l = 0; l < layers; ++l) CHECK(b.view(l).k_pages[1] == a.view(l).k_pages[1]);
    CHECK(holds(b, 0, 6));
    CHECK(holds(a, 0, 12));
    CHECK(pool->pages_in_use() == 3 * layers);
  }
}

TEST_CASE("share_prefix needs an empty sequence over the same pool and layers") {
  auto pool = std::make_shared<kv_pool>(1 << 20, 3, 1, 2, 4);
  auto other_pool = std::make_shared<kv_pool>(1 << 20, 3, 1, 2, 4);
  kv_sequence a(pool);
  fill(a, 0, 9);
  kv_sequence holding(pool);
  fill(holding, 0, 3);
  CHECK_THROWS_WITH_AS(holding.share_prefix(a, 8), doctest::Contains("already holds"), std::invalid_argument);
  kv_sequence elsewhere(other_pool);
  CHECK_THROWS_WITH_AS(elsewhere.share_prefix(a, 8), doctest::Contains("another pool"), std::invalid_argument);
  kv_sequence part(pool, 1, 3);
  CHECK_THROWS_WITH_AS(part.share_prefix(a, 8), doctest::Contains("other layers"), std::invalid_argument);
  CHECK(pool->shared_pages() == 0);
  CHECK(holding.length() == 3);
}
