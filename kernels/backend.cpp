#include "kernels/backend.hpp"

#include <atomic>
#include <stdexcept>

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device.hpp"
#endif

namespace corolla {

std::vector<std::string> compiled_backends() {
#ifdef COROLLA_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

int cuda_device_count() {
#ifdef COROLLA_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

namespace {
std::atomic<int> g_matmul_precision{static_cast<int>(matmul_precision::f32)};
}  // namespace

void set_matmul_precision(matmul_precision p) { g_matmul_precision.store(static_cast<int>(p)); }
matmul_precision get_matmul_precision() { return static_cast<matmul_precision>(g_matmul_precision.load()); }

matmul_precision parse_matmul_precision(const std::string& text) {
  if (text == "f32") return matmul_precision::f32;
  if (text == "tf32") return matmul_precision::tf32;
  if (text == "bf16") return matmul_precision::bf16;
  throw std::invalid_argument("unknown matmul precision '" + text + "' (expected f32, tf32 or bf16)");
}

const char* matmul_precision_name(matmul_precision p) {
  switch (p) {
    case matmul_precision::tf32: return "tf32";
    case matmul_precision::bf16: return "bf16";
    default: return "f32";
  }
}

device parse_device(const std::string& text) {
  if (text == "auto") return cuda_device_count() > 0 ? device{device_kind::cuda, 0} : device{};
  if (text == "cpu") return {device_kind::cpu, 0};
  if (text == "cuda") return {device_kind::cuda, 0};
  if (text.rfind("cuda:", 0) == 0) {
    std::size_t used = 0;
    int index = -1;
    try {
      index = std::stoi(text.substr(5), &used);
    } catch (const std::exception&) {
    }
    if (index >= 0 && used == text.size() - 5) return {device_kind::cuda, index};
  }
  throw std::invalid_argument("unknown device '" + text + "' (expected auto, cpu, cuda or cuda:N)");
}

Backend& backend_for(device dev) {
  if (dev.kind == device_kind::cpu) return cpu_backend();
#ifdef COROLLA_HAVE_CUDA
  int n = cuda::device_count();
  if (n == 0)
    throw std::runtime_error("device " + dev.str() +
                             " requested but no CUDA device is visible (" +
                             cuda::device_count_error() + ")");
  if (dev.index >= n)
    throw std::runtime_error("device " + dev.str() + " requested but only " + std::to_string(n) +
                             " CUDA device(s) are visible");
  return cuda::backend_for_device(dev.index);
#else
  throw cuda_not_built(dev);
#endif
}

std::runtime_error cuda_not_built(device dev) {
  return std::runtime_error("device " + dev.str() +
                            " requested but this binary was built without CUDA "
                            "(configure with -DCOROLLA_CUDA=ON where nvcc is installed)");
}

}  // namespace corolla
