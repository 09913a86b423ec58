// tests/cuda_emulated/attention_paged.cpp — attention against the paged KV
// cache (kernels/cuda/attention_paged_kernels.cuh: the split-key kernel and
// the combine kernel of flash-decoding), compiled as host C++ against
// cuda_emulation.hpp and launched as attention.cu launches them, against the
// CPU backend's attention_cached on the same pages. Covers one chunk of keys
// (the split kernel writes the output itself) and several (partial states,
// then the combine kernel), chunks past a row's last key, grouped-query
// heads, and every register width (head sizes 32, 80, 64 and 256: one, four
// with idle lanes, two and eight floats per lane), and bf16 and f16 caches
// (the cpu and the kernels reading half-size pages as the f32 pages of
// their values). tests/kernels/ checks the same on a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernels.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/attention_paged_kernels.cuh"

using namespace corolla;

namespace {

/// Runs attention.cu's launch sequence for `p` under the emulation.
template <int C, class KT>
void launch_paged(cuda::paged_params<KT> p) {
  const std::int64_t heads = p.rows * p.g.hq;
  emulated::launch(&cuda::attention_paged_split_kernel<C, KT>,
                   {static_cast<unsigned>(heads), static_cast<unsigned>(p.splits), cuda::split_warps * 32, 0}, p);
  if (p.splits > 1) {
    constexpr unsigned warps_per_block = 4;  // attention.cu's attn_threads / 32
    emulated::launch(&cuda::attention_paged_combine_kernel<C>,
                     {static_cast<unsigned>((heads + warps_per_block - 1) / warps_per_block), 1, warps_per_block * 32, 0},
                     static_cast<const cuda::paged_common&>(p));
  }
}

/// attention.cu's choice of register width for head size dh.
template <class KT>
void launch_for(int dh, const cuda::paged_params<KT>& p) {
  if (dh <= 32)
    launch_paged<1>(p);
  else if (dh <= 64)
    launch_paged<2>(p);
  else if (dh <= 128)
    launch_paged<4>(p);
  else
    launch_paged<8>(p);
}

/// The pages `k_store`, `v_store` as a 16-bit cache of `type` (KT its
/// device type; half the memory): the cpu widens its pages, the kernels read
/// them into f32, and both must give an f32 cache's results on the rounded
/// values. `p` is the f32 call (q, geometry, splits; `scratch` behind its
/// partial states).
template <class KT>
void check_16bit_cache(dtype type, const std::vector<Tensor>& k_store, const std::vector<Tensor>& v_store,
                       const Tensor& q, const attention_shape& s, const cuda::paged_params<float>& p, int dh,
                       std::int64_t keys, std::vector<float>& scratch) {
  const std::string name = dtype_name(type);
  CAPTURE(name);
  std::vector<Tensor> k16, v16, k_rounded, v_rounded;
  std::vector<const KT*> k16_pages, v16_pages;
  std::vector<const void*> k16_view, v16_view, kr_view, vr_view;
  for (std::size_t pg = 0; pg < k_store.size(); ++pg) {
    k16.push_back(k_store[pg].to(type));
    v16.push_back(v_store[pg].to(type));
    k16_pages.push_back(static_cast<const KT*>(k16.back().raw()));
    v16_pages.push_back(static_cast<const KT*>(v16.back().raw()));
    k16_view.push_back(k16_pages.back());
    v16_view.push_back(v16_pages.back());
    k_rounded.push_back(k16.back().to(dtype::f32));
    v_rounded.push_back(v16.back().to(dtype::f32));
    kr_view.push_back(k_rounded.back().raw());
    vr_view.push_back(v_rounded.back().raw());
  }
  const std::int64_t tq = p.rows, qw = p.g.q_width;
  Tensor want16 = Tensor::empty({tq, qw}), want_rounded = Tensor::empty({tq, qw});
  cpu_backend().attention_cached(q, kv_pages_view{k16_view, v16_view, p.page_tokens, keys, type}, p.start_pos, s,
                                 want16);
  cpu_backend().attention_cached(q, kv_pages_view{kr_view, vr_view, p.page_tokens, keys}, p.start_pos, s, want_rounded);
  // Not bit for bit: the vectorised dot products may split their sums by
  // the rows' alignment, which differs between pages and widened scratch.
  kernel_test::check_close(want16, kernel_test::to_double(want_rounded), 1e-6, 1e-6, "cpu, 16-bit cache");
  cuda::paged_params<KT> h;
  h.q = p.q;
  std::vector<float> got(static_cast<std::size_t>(tq * qw), NAN);
  h.out = got.data();
  h.k_pages = k16_pages.data();
  h.v_pages = v16_pages.data();
  h.page_tokens = p.page_tokens;
  h.start_pos = p.start_pos;
  h.rows = p.rows;
  h.splits = p.splits;
  h.g = p.g;
  std::fill(scratch.begin(), scratch.end(), NAN);
  h.part_acc = p.part_acc;
  h.part_ml = p.part_ml;
  launch_for(dh, h);
  kernel_test::check_close(std::vector<double>(got.begin(), got.end()), kernel_test::to_double(want_rounded), 1e-5,
                           1e-5, "paged attention on a 16-bit cache");
}

}  // namespace

TEST_CASE("emulated paged-cache attention (split keys, combine) matches the cpu's attention_cached") {
  kernel_test::rng r(733);
  struct shape {
    int hq, hkv, dh;
    std::int64_t tq, start_pos, page_tokens;
  };
  for (const shape& c : {shape{4, 2, 64, 1, 150, 16}, shape{2, 2, 80, 3, 40, 8}, shape{8, 1, 32, 2, 200, 32},
                         shape{2, 1, 256, 1, 70, 16}, shape{4, 4, 64, 5, 60, 16}}) {
    CAPTURE(c.hq);
    CAPTURE(c.hkv);
    CAPTURE(c.dh);
    CAPTURE(c.tq);
    CAPTURE(c.start_pos);
    const std::int64_t keys = c.start_pos + c.tq, kw = std::int64_t{c.hkv} * c.dh, qw = std::int64_t{c.hq} * c.dh;
    const std::int64_t pages = (keys + c.page_tokens - 1) / c.page_tokens;
    std::vector<Tensor> k_store, v_store;
    std::vector<const float*> k_pages, v_pages;
    std::vector<const void*> k_view, v_view;
    for (std::int64_t pg = 0; pg < pages; ++pg) {
      k_store.push_back(kernel_test::random_tensor({c.page_tokens, kw}, r));
      v_store.push_back(kernel_test::random_tensor({c.page_tokens, kw}, r));
      k_pages.push_back(k_store.back().data<float>());
      v_pages.push_back(v_store.back().data<float>());
      k_view.push_back(k_pages.back());
      v_view.push_back(v_pages.back());
    }
    const Tensor q = kernel_test::random_tensor({c.tq, qw}, r);
    attention_shape s;
    s.n_heads = c.hq;
    s.n_kv_heads = c.hkv;
    s.head_dim = c.dh;
    Tensor want = Tensor::empty({c.tq, qw});
    const kv_pages_view view{k_view, v_view, c.page_tokens, keys};
    cpu_backend().attention_cached(q, view, c.start_pos, s, want);

    cuda::paged_params<float> p;
    p.q = q.data<float>();
    std::vector<float> got(static_cast<std::size_t>(c.tq * qw), NAN);
    p.out = got.data();
    p.k_pages = k_pages.data();
    p.v_pages = v_pages.data();
    p.page_tokens = c.page_tokens;
    p.start_pos = c.start_pos;
    p.rows = c.tq;
    p.splits = cuda::attention_cached_splits(c.tq, c.start_pos);
    p.g = {c.hq, c.hkv, c.dh, c.hq / c.hkv, qw, kw, 1.0f / std::sqrt(static_cast<float>(c.dh))};
    const std::int64_t heads = c.tq * c.hq;
    std::vector<float> scratch(static_cast<std::size_t>(heads * p.splits * (c.dh + 2)), NAN);
    p.part_acc = scratch.data();
    p.part_ml = scratch.data() + heads * p.splits * c.dh;
    launch_for(c.dh, p);
    std::vector<double> g(got.begin(), got.end());
    kernel_test::check_close(g, kernel_test::to_double(want), 1e-5, 1e-5,
                             "paged attention, " + std::to_string(p.splits) + " key chunk(s)");
    {
      // The same pages from a kv_sequence's device table (three layers'
      // keys and values interleaved a page; this is its second layer): the
      // same floats. The other layers' entries are null: never read.
      const std::int64_t stride = 6, key_entry = 2;
      std::vector<const float*> table(static_cast<std::size_t>(pages * stride), nullptr);
      for (std::int64_t pg = 0; pg < pages; ++pg) {
        table[static_cast<std::size_t>(key_entry + pg * stride)] = k_pages[static_cast<std::size_t>(pg)];
        table[static_cast<std::size_t>(key_entry + 1 + pg * stride)] = v_pages[static_cast<std::size_t>(pg)];
      }
      cuda::paged_params<float> t = p;
      std::vector<float> from_table(got.size(), NAN);
      t.out = from_table.data();
      t.k_pages = table.data() + key_entry;
      t.v_pages = table.data() + key_entry + 1;
      t.page_stride = stride;
      launch_for(c.dh, t);
      CHECK(std::memcmp(from_table.data(), got.data(), got.size() * sizeof(float)) == 0);
    }

    check_16bit_cache<__nv_bfloat16>(dtype::bf16, k_store, v_store, q, s, p, c.dh, keys, scratch);
    check_16bit_cache<__half>(dtype::f16, k_store, v_store, q, s, p, c.dh, keys, scratch);
  }
}

TEST_CASE("emulated paged attention of a batch of sequences, one row each, matches the cpu per sequence") {
  kernel_test::rng r(911);
  const int hq = 4, hkv = 2, dh = 64;
  const std::int64_t page_tokens = 16, kw = std::int64_t{hkv} * dh, qw = std::int64_t{hq} * dh;
  // Several key chunks (the longest sets the grid; shorter rows leave the
  // chunks past their keys empty), and all within one chunk (each block
  // writes its row's output itself).
  for (const std::vector<std::int64_t>& positions :
       {std::vector<std::int64_t>{5, 150, 70, 0}, std::vector<std::int64_t>{3, 40, 63}}) {
    CAPTURE(positions.size());
    const auto n = static_cast<std::int64_t>(positions.size());
    std::vector<std::vector<Tensor>> stores(positions.size());
    std::vector<std::vector<const void*>> k_views(positions.size()), v_views(positions.size());
    std::vector<const float*> k_table, v_table;  // every sequence's pages, in row order
    std::vector<std::int64_t> row_pages, row_keys;
    // Each sequence's pages as a kv_sequence's device table holds them: two
    // layers' keys and values interleaved a page, this the first layer.
    std::vector<std::vector<const float*>> own_tables(positions.size());
    std::int64_t splits = 1;
    for (std::size_t i = 0; i < positions.size(); ++i) {
      const std::int64_t keys = positions[i] + 1;
      const std::int64_t pages = (keys + page_tokens - 1) / page_tokens;
      row_pages.push_back(static_cast<std::int64_t>(k_table.size()));
      row_keys.push_back(keys);
      splits = std::max(splits, cuda::attention_cached_splits(1, positions[i]));
      for (std::int64_t pg = 0; pg < pages; ++pg) {
        stores[i].push_back(kernel_test::random_tensor({page_tokens, kw}, r));
        k_views[i].push_back(stores[i].back().raw());
        k_table.push_back(stores[i].back().data<float>());
      }
      for (std::int64_t pg = 0; pg < pages; ++pg) {
        stores[i].push_back(kernel_test::random_tensor({page_tokens, kw}, r));
        v_views[i].push_back(stores[i].back().raw());
      }
      own_tables[i].assign(static_cast<std::size_t>(4 * pages), nullptr);
      for (std::int64_t pg = 0; pg < pages; ++pg) {
        own_tables[i][static_cast<std::size_t>(4 * pg)] = static_cast<const float*>(k_views[i][static_cast<std::size_t>(pg)]);
        own_tables[i][static_cast<std::size_t>(4 * pg + 1)] =
            static_cast<const float*>(v_views[i][static_cast<std::size_t>(pg)]);
      }
    }
    for (std::size_t i = 0; i < positions.size(); ++i)
      for (const void* v : v_views[i]) v_table.push_back(static_cast<const float*>(v));
    const Tensor q = kernel_test::random_tensor({n, qw}, r);
    attention_shape s;
    s.n_heads = hq;
    s.n_kv_heads = hkv;
    s.head_dim = dh;
    // The cpu, sequence by sequence, and its attention_cached_batch (the
    // Backend default: the same calls).
    Tensor want = Tensor::empty({n, qw}), want_batch = Tensor::empty({n, qw});
    std::vector<kv_pages_view> views;
    for (std::size_t i = 0; i < positions.size(); ++i) {
      views.push_back(kv_pages_view{k_views[i], v_views[i], page_tokens, positions[i] + 1});
      Tensor row = want.slice(static_cast<std::int64_t>(i), static_cast<std::int64_t>(i) + 1);
      cpu_backend().attention_cached(q.slice(static_cast<std::int64_t>(i), static_cast<std::int64_t>(i) + 1),
                                     views.back(), positions[i], s, row);
    }
    cpu_backend().attention_cached_batch(q, views, positions, s, want_batch);
    CHECK(std::memcmp(want.raw(), want_batch.raw(), want.nbytes()) == 0);

    cuda::paged_params<float> p;
    p.q = q.data<float>();
    std::vector<float> got(static_cast<std::size_t>(n * qw), NAN);
    p.out = got.data();
    // As the backend uploads them without device tables: every key page
    // pointer, then every value page pointer; row r's from its first.
    std::vector<const float*> flat = k_table;
    flat.insert(flat.end(), v_table.begin(), v_table.end());
    std::vector<const float* const*> row_tables;
    for (const std::int64_t at : row_pages) row_tables.push_back(flat.data() + at);
    p.row_tables = row_tables.data();
    p.k_offset = 0;
    p.v_offset = static_cast<std::int64_t>(k_table.size());
    p.row_keys = row_keys.data();
    p.page_tokens = page_tokens;
    p.rows = n;
    p.splits = splits;
    p.g = {hq, hkv, dh, hq / hkv, qw, kw, 1.0f / std::sqrt(static_cast<float>(dh))};
    const std::int64_t heads = n * hq;
    std::vector<float> scratch(static_cast<std::size_t>(heads * splits * (dh + 2)), NAN);
    p.part_acc = scratch.data();
    p.part_ml = scratch.data() + heads * splits * dh;
    launch_for(dh, p);
    kernel_test::check_close(std::vector<double>(got.begin(), got.end()), kernel_test::to_double(want), 1e-5, 1e-5,
                             "batched paged attention, " + std::to_string(splits) + " key chunk(s)");

    // From each sequence's own device table: the same floats.
    std::vector<const float* const*> own_rows;
    for (const auto& t : own_tables) own_rows.push_back(t.data());
    cuda::paged_params<float> t = p;
    std::vector<float> from_tables(got.size(), NAN);
    t.out = from_tables.data();
    t.row_tables = own_rows.data();
    t.k_offset = 0;
    t.v_offset = 1;
    t.page_stride = 4;
    launch_for(dh, t);
    CHECK(std::memcmp(from_tables.data(), got.data(), got.size() * sizeof(float)) == 0);
  }
}
