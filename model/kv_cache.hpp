// model/kv_cache.hpp — the paged attention (key/value) cache.
//
// A kv_pool is one memory budget shared by every sequence of a process (a
// swarm server shares one pool across all client sessions). Its elements
// are f32, or bf16/f16 for half the memory per token (keys and values are
// rounded once as they are stored; attention widens them and computes in
// f32). Memory comes in
// pages of `page_tokens` tokens of ONE layer, laid out [K|V][token][Hkv*Dh],
// so a layer's keys for a page are one contiguous block of rows (what
// kv_pages_view in kernels/kv_pages_view.hpp describes). A sequence takes pages
// only for the layers it uses: a swarm session over part of a server's span
// costs that part's memory, not the whole span's.
//
// Pages are allocated lazily, when a sequence grows into them, and never as an
// up-front reservation of a sequence's maximum length. A released page goes
// back to the pool's free list and is reused before new memory is allocated;
// the budget bounds the pages in use, not the pages ever touched. A pool made
// with kv_allocation::up_front (a swarm server's) instead allocates its whole
// budget as one block when it is made, so the tokens it promises are there:
// a budget the device cannot hold fails at once, with a clear error, and no
// step ever fails for memory the budget admitted.
//
// A kv_sequence is one session's cache: it reserves room for its tokens
// (reserve() fails with a clear message, not an exception, when the budget is
// exhausted: a server answers such a request with an error and keeps
// serving), receives each layer's new K/V rows, hands layer views to the
// attention kernel, can be truncated (rollback), and returns its pages on
// destruction. On a device pool it also keeps its page tables in the
// device's memory, written as it takes pages (outside any decode step), so
// a device's attention and KV append find the pages without an upload per
// layer (kv_pages_view::device_pages).
//
// Sequences that begin with the same tokens can hold the same pages
// (kv_sequence::share_prefix): a page is reference-counted by the pool and
// goes back to the free list when its last holder lets it go, so N
// generations after one system prompt hold its pages once. Only whole
// pages are shared (the page a shared prefix ends inside is copied), and a
// shared page is never written: a holder that rewrites positions in one (a
// rollback) gets a copy of its own first (reserve(n, write_from)).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"

namespace corolla {

/// The outcome of kv_sequence::reserve: success, or a complete message
/// saying how much was missing.
struct kv_reservation {
  bool ok = true;
  std::string error;  ///< empty when ok
  /// True when the reservation succeeded.
  explicit operator bool() const { return ok; }
};

/// When a kv_pool's pages are allocated.
enum class kv_allocation {
  lazy,      ///< page by page, as sequences grow into them
  up_front,  ///< the whole budget as one block, when the pool is made
};

/// A byte budget of KV pages shared by many sequences. Thread-safe: pages
/// may be acquired and released concurrently from any thread.
class kv_pool {
 public:
  /// A pool of at most `budget_bytes` of pages for `n_layers` layers of
  /// `n_kv_heads` x `head_dim` keys and values of `type` (f32, bf16 or f16),
  /// `page_tokens` tokens per page, in memory of `be` (the process CPU
  /// backend when null). Lazy: allocates nothing yet; up_front: allocates
  /// every page the budget admits now, and throws std::runtime_error
  /// (naming the pages, bytes, device and cause) when that fails. Throws
  /// std::invalid_argument for non-positive geometry or another type.
  kv_pool(std::size_t budget_bytes, int n_layers, int n_kv_heads, int head_dim,
          int page_tokens = 16, Backend* be = nullptr, dtype type = dtype::f32,
          kv_allocation allocation = kv_allocation::lazy);
  kv_pool(const kv_pool&) = delete;
  kv_pool& operator=(const kv_pool&) = delete;

  /// The geometry given at construction.
  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  int page_tokens() const { return page_tokens_; }
  /// The element type of the pages.
  dtype type() const { return type_; }
  /// Elements in one K (or V) row: Hkv * Dh.
  std::int64_t row_width() const { return row_width_; }
  /// Bytes of one page (one layer's keys and values for page_tokens tokens).
  std::size_t page_bytes() const { return page_bytes_; }
  /// Bytes one token's keys and values take over `n_layers` layers of rows
  /// of `row_width` elements of `type` (what a pool so shaped holds per token).
  static std::size_t token_bytes(int n_layers, std::int64_t row_width, dtype type) {
    return 2 * static_cast<std::size_t>(n_layers) * static_cast<std::size_t>(row_width) * dtype_size(type);
  }
  /// Bytes one token occupies across every layer of the pool (keys and values).
  std::size_t bytes_per_token() const { return token_bytes(n_layers_, row_width_, type_); }
  /// The byte budget given at construction.
  std::size_t budget_bytes() const { return budget_bytes_; }
  /// Most pages the budget admits at once.
  std::int64_t max_pages() const { return max_pages_; }
  /// Pages held by sequences now.
  std::int64_t pages_in_use() const;
  /// Pages ever allocated from the device (in use + on the free list; all
  /// max_pages() from the start when allocated up front).
  std::int64_t pages_allocated() const;
  /// How the pages are allocated.
  kv_allocation allocation() const { return allocation_; }
  /// Bytes of the budget not held by any sequence.
  std::size_t free_bytes() const;
  /// The backend whose device memory holds the pages.
  Backend& backend() const { return *be_; }

  /// Hands out `n` pages (all or none): appends their base pointers to `out`
  /// and returns true, or returns false when the budget cannot cover them.
  /// A lazy pool's allocation failing throws, with nothing handed out.
  bool acquire(std::int64_t n, std::vector<std::byte*>& out);
  /// Lets go of pages[first..]: each goes back to the free list unless
  /// another sequence still holds it (share).
  void release(const std::vector<std::byte*>& pages, std::size_t first = 0);
  /// One more holder for each of `pages` (pages held now): a page returns
  /// to the free list only when its last holder releases it.
  void share(std::span<std::byte* const> pages);
  /// True when more than one sequence holds `page`.
  bool shared(const std::byte* page) const;
  /// Pages held by more than one sequence now.
  std::int64_t shared_pages() const;
  /// Sequences holding `page` (a page held now): 1, or more when shared.
  std::int64_t holders(const std::byte* page) const;

 private:
  Backend* be_;
  int n_layers_, n_kv_heads_, head_dim_, page_tokens_;
  dtype type_;
  std::int64_t row_width_;
  std::size_t page_bytes_;
  std::size_t budget_bytes_;
  std::int64_t max_pages_;
  kv_allocation allocation_;

  mutable std::mutex mutex_;
  std::vector<Tensor> owned_;      ///< every page (or the one block of pages) allocated: keeps memory alive
  std::vector<std::byte*> free_;  ///< pages not held by any sequence
  /// Pages with more than one holder: how many beyond the first.
  std::unordered_map<const std::byte*, std::int64_t> extra_holders_;
  /// extra_holders_.size(), written under the mutex: shared() answers a
  /// pool without shared pages (no prefix sharing) without taking the
  /// mutex, as every decode step's claim_row asks for every layer.
  std::atomic<std::int64_t> shared_count_{0};
  std::int64_t in_use_ = 0;       ///< distinct pages held
  std::int64_t allocated_ = 0;     ///< pages allocated so far
};

/// One sequence's cache: pages from a shared pool for the layers
/// [first_layer, last_layer) it uses, a length per layer.
/// Not thread-safe (one session drives it); the pool it draws from is.
class kv_sequence {
 public:
  /// An empty sequence drawing from `pool` (kept alive by the sequence) for
  /// layers [first_layer, last_layer) of the pool (-1 = its last layer).
  /// Throws std::invalid_argument for a range that is empty or outside the
  /// pool's layers.
  explicit kv_sequence(std::shared_ptr<kv_pool> pool, int first_layer = 0, int last_layer = -1);
  ~kv_sequence();
  kv_sequence(kv_sequence&&) noexcept;
  kv_sequence& operator=(kv_sequence&&) noexcept;
  kv_sequence(const kv_sequence&) = delete;
  kv_sequence& operator=(const kv_sequence&) = delete;

  /// Makes room for `n_tokens` tokens in total, acquiring only the pages
  /// not held yet. On an exhausted budget nothing is acquired and the result
  /// says "KV cache full: need N more tokens (X bytes), Y bytes free of Z".
  /// On a device pool it writes the new pages' tables to the device: never
  /// call it inside Backend::run_step (a step graph cannot capture that
  /// copy); callers reserve before the step.
  kv_reservation reserve(std::int64_t n_tokens);
  /// reserve(n_tokens), and makes positions [write_from, n_tokens)
  /// writable: pages there that other sequences hold too (share_prefix)
  /// are replaced by copies of this sequence's own, all pages taken at once
  /// (on a full pool nothing changes and the result says so). Writing over
  /// positions the sequence holds (a rollback) needs it; append and
  /// claim_row refuse to write into a page other sequences hold.
  kv_reservation reserve(std::int64_t n_tokens, std::int64_t write_from);
  /// Tokens the held pages can store.
  std::int64_t capacity() const;
  /// Tokens whose keys and values every layer of the sequence holds.
  std::int64_t length() const;
  /// Tokens layer `layer` holds (0 outside the sequence's layers).
  std::int64_t length(int layer) const { return layer_length_.at(static_cast<std::size_t>(layer)); }
  /// Layers of the pool (every layer has its own length and views).
  int n_layers() const { return pool_->n_layers(); }
  /// The layers this sequence holds pages for: [first_layer, last_layer).
  int first_layer() const { return first_layer_; }
  int last_layer() const { return last_layer_; }
  /// Pages held (one per used layer per page_tokens tokens).
  std::int64_t pages() const { return static_cast<std::int64_t>(pages_.size()); }
  /// The pages held, every layer's (each one pool page).
  std::span<std::byte* const> held_pages() const { return pages_; }
  /// The pool the pages come from.
  const kv_pool& pool() const { return *pool_; }

  /// Writes the keys and values of tokens start_pos .. start_pos+n-1 of
  /// `layer` (k and v: [n, Hkv*Dh] f32 on the pool's device, converted to
  /// the pool's type); that layer's
  /// length becomes start_pos + n (rewriting from start_pos drops what
  /// followed). Throws tensor_error for a layer outside the sequence's,
  /// when start_pos is beyond the layer's length (a gap) or the tokens
  /// exceed capacity() (reserve first).
  void append(int layer, std::int64_t start_pos, const Tensor& k, const Tensor& v);
  /// Where the key and value rows of position `pos` of `layer` are (width
  /// elements of the pool's type each, in the pool's device memory), for a
  /// caller that writes them itself (Backend::rope_store_kv); the layer then
  /// holds pos + 1 tokens. Throws as append does for one row at `pos`.
  /// Allocates nothing.
  std::pair<void*, void*> claim_row(int layer, std::int64_t pos);
  /// The attention kernel's view of `layer` (empty outside the sequence's
  /// layers; on a device pool with its tables in device memory as well).
  /// Valid until the next reserve, truncate or release.
  kv_pages_view view(int layer) const;
  /// Keeps the first `n_tokens` tokens of every layer (rollback) and returns
  /// the pages no longer needed to the pool (pages other sequences hold
  /// too stay theirs).
  void truncate(std::int64_t n_tokens);
  /// Starts this sequence, which must hold nothing, with the keys and
  /// values of the first min(n_tokens, from.length()) tokens of `from`: it
  /// holds the same pages for the whole pages among them (kv_pool::share)
  /// and a copy of the page they end inside (which it will write into).
  /// Returns the tokens it now holds: fewer (the whole pages) when the
  /// pool has no page for the copy, 0 when a device pool has no memory for
  /// the page tables (nothing is shared then). Throws
  /// std::invalid_argument when this sequence holds pages, or `from` draws
  /// from another pool or over other layers.
  std::int64_t share_prefix(const kv_sequence& from, std::int64_t n_tokens);
  /// Empties the sequence and returns every page.
  void release();

 private:
  void copy_rows(const void* dst, const Tensor& src, std::int64_t src_row, std::int64_t rows);
  /// Throws tensor_error (naming kv_sequence::`what`) unless `n` rows can be
  /// written to `layer` from `start_pos`: a layer of the sequence, no gap,
  /// within the reserved capacity. Returns the layer's index.
  std::size_t check_write(const char* what, int layer, std::int64_t start_pos, std::int64_t n) const;

  int used_layers() const { return last_layer_ - first_layer_; }
  /// Writes the page tables of the pages taken since the last call into
  /// device_table_ (a device pool only), growing it when full. Throws what
  /// the backend throws.
  void sync_device_table();
  /// Copies token pages `token_pages` (ascending; every used layer) into
  /// `fresh` (taken from the pool, L a token page in that order) and holds
  /// the copies in their place. Throws what the backend's copy throws,
  /// with nothing changed.
  void adopt_copies(const std::vector<std::size_t>& token_pages, const std::vector<std::byte*>& fresh);
  /// Appends pages [first, last) (the next token pages, L a token page in
  /// layer order) to pages_ and their key and value bases to k_ptrs_/v_ptrs_.
  void take_pages(std::vector<std::byte*>::const_iterator first, std::vector<std::byte*>::const_iterator last);
  /// Copies page `from` whole into page `to` (both of the pool). Throws
  /// what the backend's copy throws.
  void copy_page(const std::byte* from, std::byte* to);

  std::shared_ptr<kv_pool> pool_;
  int first_layer_ = 0, last_layer_ = 0;
  /// Token page p of used layer i is pages_[p * used_layers() + i].
  std::vector<std::byte*> pages_;
  /// Per layer, the base of its K (and V) block in each page: what view()
  /// hands out without building anything.
  std::vector<std::vector<const void*>> k_ptrs_;
  std::vector<std::vector<const void*>> v_ptrs_;
  std::vector<std::int64_t> layer_length_;
  /// On a device pool, every layer's tables in the pool's memory
  /// (kv_pages_view::device_pages): the pointers of token page p of used
  /// layer i at entries 2 * (p * used_layers() + i) (keys) and the one
  /// after (values); two i32 elements an entry. Undefined on the host.
  Tensor device_table_;
  std::vector<const void*> table_entries_;  ///< the same entries, on the host
  std::size_t table_synced_ = 0;             ///< leading entries device_table_ holds
};

}  // namespace corolla
