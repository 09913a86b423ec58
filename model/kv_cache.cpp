#include "model/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace corolla {

// ---- kv_pool ----------------------------------------------------------------------

kv_pool::kv_pool(std::size_t budget_bytes, int n_layers, int n_kv_heads, int head_dim,
                 int page_tokens, Backend* be, dtype type, kv_allocation allocation)
    : be_(be ? be : &cpu_backend()),
      n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      page_tokens_(page_tokens),
      type_(type),
      budget_bytes_(budget_bytes),
      allocation_(allocation) {
  if (!is_float_dtype(type))
    throw std::invalid_argument(std::string("kv_pool: pages are f32, bf16 or f16, not ") + dtype_name(type));
  if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || page_tokens <= 0)
    throw std::invalid_argument("kv_pool: layers, kv heads, head_dim and page_tokens must be "
                                "positive (got " + std::to_string(n_layers) + ", " +
                                std::to_string(n_kv_heads) + ", " + std::to_string(head_dim) +
                                ", " + std::to_string(page_tokens) + ")");
  row_width_ = static_cast<std::int64_t>(n_kv_heads) * head_dim;
  page_bytes_ = static_cast<std::size_t>(2) * static_cast<std::size_t>(page_tokens) *
                static_cast<std::size_t>(row_width_) * dtype_size(type);
  max_pages_ = static_cast<std::int64_t>(budget_bytes_ / page_bytes_);
  if (allocation != kv_allocation::up_front || max_pages_ == 0) return;
  const std::size_t bytes = static_cast<std::size_t>(max_pages_) * page_bytes_;
  try {
    owned_.push_back(be_->empty({static_cast<std::int64_t>(bytes / dtype_size(type_))}, type_));
  } catch (const std::exception& e) {
    throw std::runtime_error("kv_pool: cannot allocate the KV cache up front: " + std::to_string(max_pages_) +
                             " pages, " + std::to_string(bytes >> 20) + " MiB of " + dtype_name(type_) + " on " +
                             be_->dev().str() + ": " + e.what());
  }
  // Handed out from the back: the first pages first.
  auto* base = static_cast<std::byte*>(owned_.back().raw());
  free_.reserve(static_cast<std::size_t>(max_pages_));
  for (std::int64_t p = max_pages_; p-- > 0;) free_.push_back(base + static_cast<std::size_t>(p) * page_bytes_);
  allocated_ = max_pages_;
}

std::int64_t kv_pool::pages_in_use() const {
  std::lock_guard lock(mutex_);
  return in_use_;
}

std::int64_t kv_pool::pages_allocated() const {
  std::lock_guard lock(mutex_);
  return allocated_;
}

std::size_t kv_pool::free_bytes() const {
  std::lock_guard lock(mutex_);
  return budget_bytes_ - static_cast<std::size_t>(in_use_) * page_bytes_;
}

bool kv_pool::acquire(std::int64_t n, std::vector<std::byte*>& out) {
  if (n <= 0) return true;
  std::lock_guard lock(mutex_);
  if (in_use_ + n > max_pages_) return false;
  // Lazily: memory is touched only when a sequence grows into it. What the
  // free list lacks is allocated first, so a failing allocation throws with
  // nothing handed out and nothing lost.
  const auto reused = std::min<std::int64_t>(n, static_cast<std::int64_t>(free_.size()));
  std::vector<Tensor> fresh;
  for (std::int64_t i = reused; i < n; ++i)
    fresh.push_back(be_->empty({static_cast<std::int64_t>(page_bytes_ / dtype_size(type_))}, type_));
  for (std::int64_t i = 0; i < reused; ++i) {
    out.push_back(free_.back());
    free_.pop_back();
  }
  for (Tensor& t : fresh) {
    out.push_back(static_cast<std::byte*>(t.raw()));
    owned_.push_back(std::move(t));
  }
  allocated_ += static_cast<std::int64_t>(fresh.size());
  in_use_ += n;
  return true;
}

void kv_pool::release(const std::vector<std::byte*>& pages, std::size_t first) {
  if (first >= pages.size()) return;
  std::lock_guard lock(mutex_);
  for (std::size_t i = first; i < pages.size(); ++i) {
    if (auto it = extra_holders_.find(pages[i]); it != extra_holders_.end()) {
      if (--it->second == 0) extra_holders_.erase(it);
      continue;  // another sequence still holds it
    }
    free_.push_back(pages[i]);
    --in_use_;
  }
  shared_count_.store(static_cast<std::int64_t>(extra_holders_.size()), std::memory_order_release);
}

void kv_pool::share(std::span<std::byte* const> pages) {
  std::lock_guard lock(mutex_);
  for (std::byte* p : pages) ++extra_holders_[p];
  shared_count_.store(static_cast<std::int64_t>(extra_holders_.size()), std::memory_order_release);
}

bool kv_pool::shared(const std::byte* page) const {
  if (shared_count_.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(mutex_);
  return extra_holders_.count(page) != 0;
}

std::int64_t kv_pool::shared_pages() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::int64_t>(extra_holders_.size());
}

std::int64_t kv_pool::holders(const std::byte* page) const {
  std::lock_guard lock(mutex_);
  const auto it = extra_holders_.find(page);
  return 1 + (it == extra_holders_.end() ? 0 : it->second);
}

// ---- kv_sequence -------------------------------------------------------------------

kv_sequence::kv_sequence(std::shared_ptr<kv_pool> pool, int first_layer, int last_layer) : pool_(std::move(pool)) {
  if (!pool_) throw std::invalid_argument("kv_sequence: null pool");
  const int layers = pool_->n_layers();
  if (last_layer < 0) last_layer = layers;
  if (first_layer < 0 || last_layer > layers || first_layer >= last_layer)
    throw std::invalid_argument("kv_sequence: layers [" + std::to_string(first_layer) + ", " +
                                std::to_string(last_layer) + ") are not a non-empty part of the pool's " +
                                std::to_string(layers));
  first_layer_ = first_layer;
  last_layer_ = last_layer;
  k_ptrs_.resize(static_cast<std::size_t>(layers));
  v_ptrs_.resize(static_cast<std::size_t>(layers));
  layer_length_.assign(static_cast<std::size_t>(layers), 0);
}

kv_sequence::~kv_sequence() { release(); }

kv_sequence::kv_sequence(kv_sequence&& o) noexcept
    : pool_(std::move(o.pool_)),
      first_layer_(o.first_layer_),
      last_layer_(o.last_layer_),
      pages_(std::move(o.pages_)),
      k_ptrs_(std::move(o.k_ptrs_)),
      v_ptrs_(std::move(o.v_ptrs_)),
      layer_length_(std::move(o.layer_length_)),
      device_table_(std::move(o.device_table_)),
      table_entries_(std::move(o.table_entries_)),
      table_synced_(std::exchange(o.table_synced_, 0)) {
  o.pages_.clear();
}

kv_sequence& kv_sequence::operator=(kv_sequence&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::move(o.pool_);
    first_layer_ = o.first_layer_;
    last_layer_ = o.last_layer_;
    pages_ = std::move(o.pages_);
    k_ptrs_ = std::move(o.k_ptrs_);
    v_ptrs_ = std::move(o.v_ptrs_);
    layer_length_ = std::move(o.layer_length_);
    device_table_ = std::move(o.device_table_);
    table_entries_ = std::move(o.table_entries_);
    table_synced_ = std::exchange(o.table_synced_, 0);
    o.pages_.clear();
  }
  return *this;
}

std::int64_t kv_sequence::capacity() const {
  if (!pool_) return 0;
  return static_cast<std::int64_t>(pages_.size()) / used_layers() * pool_->page_tokens();
}

std::int64_t kv_sequence::length() const {
  if (layer_length_.empty()) return 0;
  return *std::min_element(layer_length_.begin() + first_layer_, layer_length_.begin() + last_layer_);
}

kv_reservation kv_sequence::reserve(std::int64_t n_tokens) { return reserve(n_tokens, n_tokens); }

kv_reservation kv_sequence::reserve(std::int64_t n_tokens, std::int64_t write_from) {
  const std::int64_t pt = pool_->page_tokens();
  const auto L = static_cast<std::size_t>(used_layers());
  const auto held = pages_.size() / L;
  const auto want = static_cast<std::size_t>(std::max<std::int64_t>(n_tokens + pt - 1, 0) / pt);
  const std::size_t grow = want > held ? want - held : 0;
  // Token pages held now that the tokens from write_from on will be written
  // into while other sequences hold them too.
  std::vector<std::size_t> copies;
  for (auto p = static_cast<std::size_t>(std::max<std::int64_t>(write_from, 0) / pt); p < std::min(held, want); ++p)
    if (pool_->shared(pages_[p * L])) copies.push_back(p);
  if (grow == 0 && copies.empty()) {
    try {  // a page copied since the last write leaves the table behind
      sync_device_table();
    } catch (const std::exception& e) {
      return {false, std::string("KV cache: no device memory for the page tables: ") + e.what()};
    }
    return {};
  }
  const std::size_t need = (grow + copies.size()) * L;
  std::vector<std::byte*> fresh;
  if (!pool_->acquire(static_cast<std::int64_t>(need), fresh)) {
    const std::size_t need_bytes = need * pool_->page_bytes();
    // Tokens past the capacity, and a page's for each page to copy.
    const std::int64_t tokens =
        std::max<std::int64_t>(n_tokens - capacity(), 0) + static_cast<std::int64_t>(copies.size()) * pt;
    return {false, "KV cache full: need " + std::to_string(tokens) + " more tokens (" + std::to_string(need_bytes) + " bytes), " +
                       std::to_string(pool_->free_bytes()) + " bytes free of " +
                       std::to_string(pool_->budget_bytes())};
  }
  if (!copies.empty()) {
    try {
      adopt_copies(copies, fresh);
    } catch (const std::exception& e) {
      pool_->release(fresh);
      return {false, std::string("KV cache: copying pages shared with another sequence failed: ") + e.what()};
    }
  }
  take_pages(fresh.begin() + static_cast<std::ptrdiff_t>(copies.size() * L), fresh.end());
  try {
    sync_device_table();
  } catch (const std::exception& e) {  // no device memory for the tables: the new pages go back
    truncate(static_cast<std::int64_t>(held) * pt);
    return {false, std::string("KV cache: no device memory for the page tables of ") + std::to_string(n_tokens) +
                       " tokens: " + e.what()};
  }
  return {};
}

void kv_sequence::take_pages(std::vector<std::byte*>::const_iterator first,
                             std::vector<std::byte*>::const_iterator last) {
  const auto L = static_cast<std::size_t>(used_layers());
  const std::size_t block = pool_->page_bytes() / 2;  // a layer's keys, then its values
  for (std::size_t p = pages_.size(); first != last; ++first, ++p) {
    pages_.push_back(*first);
    const auto l = static_cast<std::size_t>(first_layer_) + p % L;
    k_ptrs_[l].push_back(*first);
    v_ptrs_[l].push_back(*first + block);
  }
}

void kv_sequence::copy_page(const std::byte* from, std::byte* to) {
  Backend& be = pool_->backend();
  const dtype type = pool_->type();
  const auto elements = static_cast<std::int64_t>(pool_->page_bytes() / dtype_size(type));
  const auto page = [&](const std::byte* p) {
    return Tensor::wrap(storage::borrow(const_cast<std::byte*>(p), pool_->page_bytes(), nullptr, be.dev()), 0,
                        {elements}, type);
  };
  Tensor dst = page(to);
  be.copy(page(from), dst);
}

void kv_sequence::adopt_copies(const std::vector<std::size_t>& token_pages, const std::vector<std::byte*>& fresh) {
  const auto L = static_cast<std::size_t>(used_layers());
  for (std::size_t i = 0; i < token_pages.size(); ++i)
    for (std::size_t l = 0; l < L; ++l) copy_page(pages_[token_pages[i] * L + l], fresh[i * L + l]);
  std::vector<std::byte*> old;
  const std::size_t block = pool_->page_bytes() / 2;  // a layer's keys, then its values
  for (std::size_t i = 0; i < token_pages.size(); ++i)
    for (std::size_t l = 0; l < L; ++l) {
      const std::size_t at = token_pages[i] * L + l;
      old.push_back(pages_[at]);
      pages_[at] = fresh[i * L + l];
      const std::size_t layer = static_cast<std::size_t>(first_layer_) + l;
      k_ptrs_[layer][token_pages[i]] = pages_[at];
      v_ptrs_[layer][token_pages[i]] = pages_[at] + block;
    }
  pool_->release(old);  // this sequence's hold on the shared ones
  // The tables from the first copied page on are written again.
  table_entries_.resize(std::min(table_entries_.size(), 2 * token_pages.front() * L));
  table_synced_ = std::min(table_synced_, table_entries_.size());
}

void kv_sequence::sync_device_table() {
  Backend& be = pool_->backend();
  if (be.dev().kind == device_kind::cpu) return;
  const auto L = static_cast<std::size_t>(used_layers());
  const std::size_t pages = k_ptrs_[static_cast<std::size_t>(first_layer_)].size();
  const std::size_t entries = 2 * L * pages;
  if (entries <= table_synced_) return;
  table_entries_.resize(entries);
  for (std::size_t p = table_synced_ / (2 * L); p < pages; ++p)
    for (std::size_t i = 0; i < L; ++i) {
      const std::size_t l = static_cast<std::size_t>(first_layer_) + i;
      table_entries_[2 * (p * L + i)] = k_ptrs_[l][p];
      table_entries_[2 * (p * L + i) + 1] = v_ptrs_[l][p];
    }
  constexpr std::int64_t per_entry = sizeof(const void*) / sizeof(std::int32_t);
  const std::size_t held = device_table_.defined() ? static_cast<std::size_t>(device_table_.numel() / per_entry) : 0;
  // Grow by doubling (from 16 pages' worth): a new table is written whole,
  // and replaces the old one only once written (a failed copy leaves the
  // old table, which still holds what table_synced_ says).
  Tensor table = device_table_;
  std::size_t synced = table_synced_;
  if (held < entries) {
    const std::size_t room = std::max({entries, 2 * held, 2 * L * 16});
    table = be.empty({static_cast<std::int64_t>(room) * per_entry}, dtype::i32);
    synced = 0;
  }
  const auto from = static_cast<std::int64_t>(synced) * per_entry;
  const auto to = static_cast<std::int64_t>(entries) * per_entry;
  const std::size_t bytes = (entries - synced) * sizeof(const void*);
  Tensor host =
      Tensor::wrap(storage::borrow(table_entries_.data() + synced, bytes, nullptr, device{}), 0, {to - from}, dtype::i32);
  Tensor dst = table.slice(from, to);
  be.copy(host, dst);
  device_table_ = std::move(table);
  table_synced_ = entries;
}

void kv_sequence::copy_rows(const void* dst, const Tensor& src, std::int64_t src_row,
                            std::int64_t rows) {
  const std::int64_t width = pool_->row_width();
  const dtype type = pool_->type();
  const std::size_t bytes = static_cast<std::size_t>(rows * width) * dtype_size(type);
  if (type == dtype::f32 && src.dev().kind == device_kind::cpu && pool_->backend().dev().kind == device_kind::cpu) {
    std::memcpy(const_cast<void*>(dst), src.data<float>() + src_row * width, bytes);
    return;
  }
  // Device memory or a 16-bit pool: describe both sides as tensors and let
  // the backend copy (converting to the pool's type).
  Backend& be = pool_->backend();
  Tensor from = src.slice(src_row, src_row + rows);
  Tensor to = Tensor::wrap(storage::borrow(const_cast<void*>(dst), bytes, nullptr, be.dev()), 0, {rows, width}, type);
  be.copy(from, to);
}

namespace {
/// `base` advanced by `elements` elements of `type`.
void* advanced(const void* base, std::int64_t elements, dtype type) {
  return const_cast<std::byte*>(static_cast<const std::byte*>(base)) +
         static_cast<std::size_t>(elements) * dtype_size(type);
}
}  // namespace

std::size_t kv_sequence::check_write(const char* what, int layer, std::int64_t start_pos, std::int64_t n) const {
  // Strings are built only to throw: claim_row runs on every decode step.
  auto op = [what] { return std::string("kv_sequence::") + what; };
  if (layer < first_layer_ || layer >= last_layer_)
    throw tensor_error(op() + ": layer " + std::to_string(layer) + " is outside the sequence's layers [" +
                       std::to_string(first_layer_) + ", " + std::to_string(last_layer_) + ")");
  const auto l = static_cast<std::size_t>(layer);
  if (start_pos < 0 || start_pos > layer_length_[l])
    throw tensor_error(op() + ": layer " + std::to_string(layer) + " holds " + std::to_string(layer_length_[l]) +
                       " tokens, cannot write at position " + std::to_string(start_pos));
  if (start_pos + n > capacity())
    throw tensor_error(op() + ": tokens up to " + std::to_string(start_pos + n) + " exceed the reserved capacity of " +
                       std::to_string(capacity()));
  // Pages are shared below a point and the rows go up from start_pos: the
  // last page written tells (reserve(n, start_pos) copies them first).
  const std::int64_t pt = pool_->page_tokens();
  const auto last_page = static_cast<std::size_t>((start_pos + n - 1) / pt);
  if (n > 0 && pool_->shared(pages_[last_page * static_cast<std::size_t>(used_layers()) +
                                    static_cast<std::size_t>(layer - first_layer_)]))
    throw tensor_error(op() + ": position " + std::to_string(start_pos + n - 1) + " of layer " +
                       std::to_string(layer) + " is in a page other sequences hold too: reserve(n, " +
                       std::to_string(start_pos) + ") first");
  return l;
}

void kv_sequence::append(int layer, std::int64_t start_pos, const Tensor& k, const Tensor& v) {
  const std::int64_t width = pool_->row_width();
  if (k.rank() != 2 || k.dim(1) != width || k.shape() != v.shape() || k.type() != dtype::f32 ||
      v.type() != dtype::f32)
    throw tensor_error("kv_sequence::append: k and v must be f32 [n, " + std::to_string(width) +
                       "], got " + shape_str(k.shape()) + " and " + shape_str(v.shape()));
  const std::int64_t n = k.dim(0);
  const std::size_t l = check_write("append", layer, start_pos, n);
  const std::int64_t pt = pool_->page_tokens();
  std::int64_t row = 0;
  while (row < n) {
    const std::int64_t pos = start_pos + row;
    const auto page = static_cast<std::size_t>(pos / pt);
    const std::int64_t in_page = pos % pt;
    const std::int64_t rows = std::min(n - row, pt - in_page);
    copy_rows(advanced(k_ptrs_[l][page], in_page * width, pool_->type()), k, row, rows);
    copy_rows(advanced(v_ptrs_[l][page], in_page * width, pool_->type()), v, row, rows);
    row += rows;
  }
  layer_length_[l] = start_pos + n;
}

std::pair<void*, void*> kv_sequence::claim_row(int layer, std::int64_t pos) {
  const std::size_t l = check_write("claim_row", layer, pos, 1);
  const std::int64_t pt = pool_->page_tokens();
  const auto page = static_cast<std::size_t>(pos / pt);
  const std::int64_t offset = (pos % pt) * pool_->row_width();
  layer_length_[l] = pos + 1;
  return {advanced(k_ptrs_[l][page], offset, pool_->type()), advanced(v_ptrs_[l][page], offset, pool_->type())};
}

kv_pages_view kv_sequence::view(int layer) const {
  const auto l = static_cast<std::size_t>(layer);
  kv_pages_view view;
  view.k_pages = std::span<const void* const>(k_ptrs_.at(l));
  view.v_pages = std::span<const void* const>(v_ptrs_.at(l));
  view.type = pool_->type();
  view.page_tokens = pool_->page_tokens();
  view.length = layer_length_[l];
  const std::size_t entries = 2 * static_cast<std::size_t>(used_layers()) * (k_ptrs_.at(l).size());
  if (device_table_.defined() && layer >= first_layer_ && layer < last_layer_ && table_synced_ >= entries) {
    view.device_pages = static_cast<const void* const*>(device_table_.raw());
    view.page_stride = 2 * used_layers();
    view.key_entry = 2 * (layer - first_layer_);
    view.pages_device = device_table_.dev();
  }
  return view;
}

void kv_sequence::truncate(std::int64_t n_tokens) {
  if (!pool_) return;
  if (n_tokens < 0) n_tokens = 0;
  for (auto& len : layer_length_) len = std::min(len, n_tokens);
  const std::int64_t pt = pool_->page_tokens();
  const auto keep = static_cast<std::size_t>((n_tokens + pt - 1) / pt);
  const std::size_t keep_pages = keep * static_cast<std::size_t>(used_layers());
  if (keep_pages >= pages_.size()) return;
  pool_->release(pages_, keep_pages);
  pages_.resize(keep_pages);
  // The device table's entries past the kept pages are rewritten when pages come again.
  table_entries_.resize(std::min(table_entries_.size(), 2 * keep_pages));
  table_synced_ = std::min(table_synced_, table_entries_.size());
  for (auto& p : k_ptrs_) p.resize(std::min(p.size(), keep));
  for (auto& p : v_ptrs_) p.resize(std::min(p.size(), keep));
}

std::int64_t kv_sequence::share_prefix(const kv_sequence& from, std::int64_t n_tokens) {
  if (!pages_.empty() || length() != 0)
    throw std::invalid_argument("kv_sequence::share_prefix: the sequence already holds " +
                                std::to_string(capacity()) + " tokens of pages");
  if (from.pool_ != pool_)
    throw std::invalid_argument("kv_sequence::share_prefix: the sequence to share draws from another pool");
  if (from.first_layer_ != first_layer_ || from.last_layer_ != last_layer_)
    throw std::invalid_argument("kv_sequence::share_prefix: the sequences hold other layers ([" +
                                std::to_string(from.first_layer_) + ", " + std::to_string(from.last_layer_) +
                                ") and [" + std::to_string(first_layer_) + ", " + std::to_string(last_layer_) + ")");
  const std::int64_t pt = pool_->page_tokens();
  std::int64_t tokens = std::max<std::int64_t>(std::min(n_tokens, from.length()), 0);
  const auto whole = static_cast<std::size_t>(tokens / pt);
  const auto L = static_cast<std::size_t>(used_layers());
  pages_.assign(from.pages_.begin(), from.pages_.begin() + static_cast<std::ptrdiff_t>(whole * L));
  pool_->share(pages_);
  if (tokens % pt != 0) {
    // The last page, partly shared, is copied: this sequence writes into it.
    std::vector<std::byte*> fresh;
    bool copied = pool_->acquire(static_cast<std::int64_t>(L), fresh);
    if (copied) {
      try {
        for (std::size_t l = 0; l < L; ++l) copy_page(from.pages_[whole * L + l], fresh[l]);
      } catch (const std::exception&) {
        pool_->release(fresh);
        copied = false;
      }
    }
    if (copied)
      pages_.insert(pages_.end(), fresh.begin(), fresh.end());
    else
      tokens = static_cast<std::int64_t>(whole) * pt;  // no room for the copy: the whole pages only
  }
  const std::vector<std::byte*> held = std::move(pages_);
  pages_.clear();
  take_pages(held.begin(), held.end());
  try {
    sync_device_table();
  } catch (const std::exception&) {  // no device memory for the tables: nothing shared
    release();
    return 0;
  }
  for (int l = first_layer_; l < last_layer_; ++l) layer_length_[static_cast<std::size_t>(l)] = tokens;
  return tokens;
}

void kv_sequence::release() { truncate(0); }

}  // namespace corolla
