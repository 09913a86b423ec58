// tests/emulated_device/emulated_group.cpp — device groups among emulated
// devices of this process: what NCCL groups do for the CUDA backend, with
// the rules NCCL enforces (one member per device, the same collectives in
// the same order) checked and reported instead of hanging.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "emulated_device.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::testing {
namespace {

constexpr auto join_timeout = std::chrono::seconds(60);

/// What one member asked for in a round.
struct call {
  std::string op;
  std::int64_t in = 0, out = 0;
  dtype type = dtype::f32;
  Tensor input;  ///< a host copy of its input
};

/// The members of one group id, and the round in progress.
struct rendezvous {
  std::mutex mu;
  std::condition_variable cv;
  int size = 0;
  std::vector<int> devices;  ///< per rank; -1 until joined
  int joined = 0;
  std::vector<call> calls;  ///< this round's, per rank
  int arrived = 0, finished = 0;
  bool computing = false;  ///< all have arrived; members are reading the inputs
  std::string aborted;     ///< why a member gave up (every later call fails)
};

std::mutex registry_mu;
std::map<device_group_id, std::shared_ptr<rendezvous>> registry;

/// Waits on `r.cv` until `ready`, at most join_timeout, asking `give_up`
/// every 10 ms as the NCCL group polls: a reason aborts the group for every
/// member. A group another member aborted fails the wait too.
template <class Ready>
void await(std::unique_lock<std::mutex>& lock, rendezvous& r, const group_give_up& give_up, Ready ready,
           const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + join_timeout;
  for (;;) {
    if (!r.aborted.empty()) throw std::runtime_error("emulated device group aborted: " + r.aborted);
    if (ready()) return;
    if (give_up)
      if (std::optional<std::string> why = give_up()) {
        r.aborted = what + " gave up: " + *why;
        r.cv.notify_all();
        throw std::runtime_error("emulated device group aborted: " + r.aborted);
      }
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("emulated device group: " + what + " (waited " + std::to_string(join_timeout.count()) +
                               " s)");
    r.cv.wait_for(lock, std::chrono::milliseconds(10));
  }
}

/// A host tensor holding `t`'s values (emulated device memory is host memory).
Tensor host_copy(const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), t.type());
  std::memcpy(h.raw(), t.raw(), t.nbytes());
  return h;
}

}  // namespace

/// One member's handle (emulated_device.hpp declares it a friend).
class emulated_group final : public device_group {
 public:
  emulated_group(std::shared_ptr<rendezvous> r, int rank, int device, group_give_up give_up)
      : r_(std::move(r)), give_up_(std::move(give_up)), rank_(rank), device_(device) {}

  int rank() const override { return rank_; }
  int size() const override { return r_->size; }

  void reduce_scatter(Backend& on, const Tensor& in, Tensor& out) override {
    collective("reduce_scatter", on, in, out, [&](const std::vector<call>& calls, Tensor& host_out) {
      const std::int64_t k = out.numel();
      float* dst = host_out.data<float>();
      for (std::int64_t i = 0; i < k; ++i) dst[i] = 0.0f;
      for (const call& c : calls) {  // summed in rank order
        const float* src = c.input.data<float>() + rank_ * k;
        for (std::int64_t i = 0; i < k; ++i) dst[i] += src[i];
      }
    });
  }

  /// The collectives finished when they returned (emulated devices queue
  /// nothing); an aborted group still fails, as NCCL's does.
  void synchronize(Backend& on) override {
    check_backend("synchronize", on);
    std::lock_guard lock(r_->mu);
    if (!r_->aborted.empty()) throw std::runtime_error("emulated device group aborted: " + r_->aborted);
  }

  void all_gather(Backend& on, const Tensor& in, Tensor& out) override {
    collective("all_gather", on, in, out, [&](const std::vector<call>& calls, Tensor& host_out) {
      const std::int64_t k = in.numel();
      for (std::size_t m = 0; m < calls.size(); ++m)
        std::memcpy(host_out.data<float>() + static_cast<std::int64_t>(m) * k, calls[m].input.data<float>(),
                    static_cast<std::size_t>(k) * sizeof(float));
    });
  }

 private:
  emulated_device_backend& check_backend(const char* op, Backend& on) const {
    auto* dev = dynamic_cast<emulated_device_backend*>(&on);
    if (dev == nullptr || on.dev() != device{device_kind::cuda, device_})
      throw tensor_error(std::string(op) + ": the group's member on cuda:" + std::to_string(device_) +
                         " queues its collectives on a backend of that device, not " + on.name());
    return *dev;
  }

  template <class Compute>
  void collective(const char* op, Backend& on, const Tensor& in, Tensor& out, Compute compute) {
    emulated_device_backend* dev = &check_backend(op, on);
    const device here{device_kind::cuda, device_};
    require_on_device(in, here, op);
    require_on_device(out, here, op);
    require_condition(in.type() == dtype::f32 && out.type() == dtype::f32, op, "the emulation takes f32 tensors");
    const std::int64_t n = size();
    const bool scatter = std::string(op) == "reduce_scatter";
    require_condition(scatter ? in.numel() == out.numel() * n : out.numel() == in.numel() * n, op,
                      scatter ? "in must hold size() times out's elements" : "out must hold size() times in's elements");
    dev->run_collective([&] { run(op, in, out, compute); });
  }

  template <class Compute>
  void run(const char* op, const Tensor& in, Tensor& out, Compute compute) {
    rendezvous& r = *r_;
    std::unique_lock lock(r.mu);
    // A member ahead of the others waits until the last round is read.
    await(lock, r, give_up_, [&] { return !r.computing; }, "the previous collective did not finish on every member");
    r.calls[static_cast<std::size_t>(rank_)] = call{op, in.numel(), out.numel(), in.type(), host_copy(in)};
    if (++r.arrived == r.size) {
      r.computing = true;
      r.cv.notify_all();
    }
    await(lock, r, give_up_, [&] { return r.computing; },
          std::string(op) + " on member " + std::to_string(rank_) + ": " + std::to_string(r.arrived) + " of " +
              std::to_string(r.size) + " members called a collective");
    // NCCL would hang or corrupt; the emulation names the mismatch.
    std::string mismatch;
    for (std::size_t m = 0; m < r.calls.size(); ++m) {
      const call& c = r.calls[m];
      if (c.op != op || c.in != in.numel() || c.out != out.numel())
        mismatch = "member " + std::to_string(m) + " called " + c.op + " of " + std::to_string(c.in) + " -> " +
                   std::to_string(c.out) + " values while member " + std::to_string(rank_) + " called " + op +
                   " of " + std::to_string(in.numel()) + " -> " + std::to_string(out.numel());
    }
    Tensor result = Tensor::empty(out.shape(), out.type());
    if (mismatch.empty()) compute(r.calls, result);
    if (++r.finished == r.size) {
      r.arrived = r.finished = 0;
      r.computing = false;
      for (call& c : r.calls) c = call{};
      r.cv.notify_all();
    }
    lock.unlock();
    if (!mismatch.empty()) throw std::runtime_error("emulated device group: mismatched collectives: " + mismatch);
    std::memcpy(out.raw(), result.raw(), out.nbytes());
  }

  std::shared_ptr<rendezvous> r_;
  group_give_up give_up_;
  int rank_, device_;
};

device_group_id emulated_device_backend::new_group_id() {
  static std::atomic<std::uint64_t> next{1};
  device_group_id id{};
  const std::uint64_t n = next++;
  std::memcpy(id.data(), &n, sizeof n);
  std::memcpy(id.data() + sizeof n, "emulated", 8);
  return id;
}

std::unique_ptr<device_group> emulated_device_backend::join_group(const device_group_id& id, int rank, int size,
                                                                  const group_give_up& give_up) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("join_group: rank " + std::to_string(rank) + " of " + std::to_string(size));
  std::shared_ptr<rendezvous> r;
  {
    std::lock_guard lock(registry_mu);
    std::shared_ptr<rendezvous>& slot = registry[id];
    if (!slot) {
      slot = std::make_shared<rendezvous>();
      slot->size = size;
      slot->devices.assign(static_cast<std::size_t>(size), -1);
      slot->calls.resize(static_cast<std::size_t>(size));
    }
    r = slot;
  }
  std::unique_lock lock(r->mu);
  if (r->size != size)
    throw std::runtime_error("join_group: member " + std::to_string(rank) + " says the group has " +
                             std::to_string(size) + " members, an earlier one said " + std::to_string(r->size));
  if (r->devices[static_cast<std::size_t>(rank)] != -1)
    throw std::runtime_error("join_group: rank " + std::to_string(rank) + " joined twice");
  for (int d : r->devices)
    if (d == index_)  // NCCL's "Duplicate GPU detected"
      throw std::runtime_error("join_group: two members on " + dev().str() + " (one device per member)");
  r->devices[static_cast<std::size_t>(rank)] = index_;
  if (++r->joined == size) {
    r->cv.notify_all();
    std::lock_guard reg(registry_mu);  // everyone has it: the id is spent
    registry.erase(id);
  }
  await(lock, *r, give_up, [&] { return r->joined == r->size; },
        "member " + std::to_string(rank) + " joined, but only " + std::to_string(r->joined) + " of " +
            std::to_string(size) + " did");
  return std::make_unique<emulated_group>(r, rank, index_, give_up);
}

}  // namespace corolla::testing
