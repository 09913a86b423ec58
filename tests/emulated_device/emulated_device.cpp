// tests/emulated_device/emulated_device.cpp — the emulated device backend's
// memory, its operands' placement, markers, companions and recorded steps
// (emulated_device.hpp says what it checks); its ops are
// emulated_products.cpp and emulated_ops.cpp, their common first steps
// emulated_op.hpp.
#include "emulated_device.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

#include "emulated_op.hpp"

namespace corolla::testing {
namespace {

void* emulated_allocate(std::size_t bytes, int) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void emulated_release(void* p, int) noexcept { std::free(p); }
/// Whether this thread runs a recorded step's ops (run_step; ops run on
/// their caller's thread). The memory hooks below are the tensor layer's
/// (Tensor::zero, copy_from, clone), which on CUDA run on the legacy
/// default stream, outside any capture.
thread_local bool in_recorded_step = false;

void no_hook_in_step(const char* what) {
  if (in_recorded_step)
    throw tensor_error(std::string(what) + " of device memory inside a recorded step: on CUDA it runs on the legacy "
                                           "default stream, not in the captured graph");
}

void emulated_fill_zero(void* p, std::size_t bytes, int) {
  no_hook_in_step("Tensor::zero");
  std::memset(p, 0, bytes);
}
void emulated_copy(void* dst, device, const void* src, device, std::size_t bytes) {
  no_hook_in_step("a tensor copy (copy_from, clone)");
  if (bytes > 0) std::memmove(dst, src, bytes);
}

struct emulated_marker final : queue_marker {
  int device = -1;
};

}  // namespace

void install_emulated_device_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    device_memory_ops ops;
    ops.allocate = emulated_allocate;
    ops.release = emulated_release;
    ops.fill_zero = emulated_fill_zero;
    ops.copy = emulated_copy;
    register_device_memory(device_kind::cuda, ops);
  });
}

emulated_device_backend::emulated_device_backend(int index) : index_(index) { install_emulated_device_memory(); }

Tensor emulated_device_backend::empty(shape_t shape, dtype t) { return Tensor::empty(std::move(shape), t, dev()); }

Tensor emulated_device_backend::host_empty(shape_t shape, dtype t) {
  ++stats_.host_empties;
  return Tensor::empty(std::move(shape), t);
}

Tensor emulated_device_backend::on_device(const Tensor& t, const char* what) const {
  if (!t.defined()) return t;
  if (t.dev() != dev())
    throw tensor_error(std::string(what) + ": tensor is on " + t.dev().str() + ", expected " + dev().str());
  const std::shared_ptr<storage>& s = t.storage_ptr();
  return Tensor::wrap(storage::borrow(s->data(), s->bytes(), s), t.offset(), t.shape(), t.type());
}

Tensor emulated_device_backend::index_tensor(const Tensor& t, const char* what) const {
  if (t.dev().kind == device_kind::cpu) return t;
  no_host_read(what);  // CUDA reads a device-resident index tensor back to check it
  return on_device(t, what);
}

void emulated_device_backend::no_host_read(const char* what) const {
  if (in_recorded_step)
    throw tensor_error(std::string(what) + ": a host read inside a recorded step (a captured CUDA graph cannot make it)");
}

void emulated_device_backend::check_marker(const queue_marker* m, const char* op) const {
  const auto* e = dynamic_cast<const emulated_marker*>(m);
  if (m != nullptr && (e == nullptr || e->device != index_))
    throw tensor_error(std::string(op) + ": the marker is not one of " + name() + "'s");
}

void emulated_device_backend::synchronize() { no_host_read("synchronize"); }

namespace {
struct emulated_recording final : step_recording {};
}  // namespace

void emulated_device_backend::run_step(std::unique_ptr<step_recording>& rec, const std::function<void()>& ops) {
  if (in_recorded_step) {  // a step inside a step joins it, as in a capture
    ops();
    return;
  }
  if (!rec) {  // a recording's first step runs as it comes (CUDA's warm-up)
    rec = std::make_unique<emulated_recording>();
    ops();
    return;
  }
  in_recorded_step = true;
  bool recorded = true;
  try {
    ops();  // the capture
  } catch (...) {
    recorded = false;
  }
  in_recorded_step = false;
  if (!recorded) {
    ops();  // as it comes: a real error throws here, and is the step's, not the recording's
    ++stats_.failed_steps;
    return;
  }
  ops();  // the ops must be repeatable: running them again changes nothing
  ++stats_.recorded_steps;
}

std::shared_ptr<queue_marker> emulated_device_backend::mark() {
  user u(*this);
  auto m = std::make_shared<emulated_marker>();
  m->device = index_;
  return m;
}

void emulated_device_backend::copy_after(const queue_marker* after, const Tensor& src, Tensor& dst) {
  check_marker(after, "copy_after");
  if (src.type() != dst.type())
    throw tensor_error("copy_after: " + std::string(dtype_name(src.type())) + " into " + dtype_name(dst.type()) +
                       " (it copies one dtype; copy() converts)");
  std::lock_guard lock(transfer_mu_);
  ++stats_.copy_afters;
  Tensor dv = dst.dev().kind == device_kind::cpu ? dst : on_device(dst, "copy_after dst");
  cpu_backend().copy(src.dev().kind == device_kind::cpu ? src : on_device(src, "copy_after src"), dv);
}

void emulated_device_backend::wait(const queue_marker* after) {
  check_marker(after, "wait");
  if (after) ++stats_.waits;
}

std::unique_ptr<Backend> emulated_device_backend::companion() {
  ++stats_.companions;
  return std::make_unique<emulated_device_backend>(index_);
}

void emulated_device_backend::run_collective(const std::function<void()>& body) {
  user u(*this);
  ++stats_.collectives;
  body();
}

}  // namespace corolla::testing
