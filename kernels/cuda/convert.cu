// kernels/cuda/convert.cu — f32 <-> bf16/f16 conversions for Backend::copy.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/convert_kernels.cuh"
#include "kernels/cuda/dispatch.cuh"

namespace corolla::cuda {

void convert(stream_t s, const void* src, elem from, void* dst, elem to, std::int64_t n) {
  if (n <= 0) return;
  dispatch_elem(from, [&](auto src_tag) {
    using Src = decltype(src_tag);
    dispatch_elem(to, [&](auto dst_tag) {
      using Dst = decltype(dst_tag);
      convert_kernel<Src, Dst><<<grid_for(n), elementwise_threads, 0, s>>>(
          static_cast<const Src*>(src), static_cast<Dst*>(dst), n);
      COROLLA_CUDA_LAUNCH_CHECK("convert_kernel");
    });
  });
}

}  // namespace corolla::cuda
