// kernels/cuda/step_graph.cpp — cuda_backend::run_step: a step's launches
// captured into a CUDA graph and submitted as one (the step graphs of
// device.hpp), and the capture arena its uploads are staged in.
//
// Why: a decode step of a thin model (GPT-2-1.5B: 48 layers, about 12
// launches each) is bound by launching, not by its weights; even 7B
// Llama's GPU idles about 6 % of a step between launches (docs/cuda.md).
// A graph's kernels follow each other on the GPU without a launch each.
//
// How: every step is captured again (the host work of a capture is about
// that of launching, and the step's arguments change every step: its
// position, the cache rows it writes, the page tables, the attention's
// grid), then cudaGraphExecUpdate writes the new arguments into the
// recording's executable of the same node count in place, which costs far
// less than making one; only a topology not seen lately (the paged
// attention's combine kernel comes with a second split) is instantiated.
// This is what llama.cpp's CUDA backend does per token. The capture runs on
// a non-blocking stream of the backend's own, the graph is launched on the
// backend's stream: while a blocking stream is captured, the legacy default
// stream (the tensor layer's memory hooks, any thread's) may not be used.
//
// What a capture must not meet: a host synchronisation, a copy from
// pageable memory, work on the legacy default stream. The decode step has
// none once warm: its index vectors and page tables are uploaded through
// upload(), which during a capture stages them in the capture arena
// (pinned, rewritten only after the last graph that reads it has run); the
// GEMV tuner times nothing while the stream is captured (linear_bf16.cu),
// and a recording's first step runs as it comes so that the tuner, the
// cuBLASLt heuristics and scratch growth happen there; an allocation that
// runs out of memory during a capture fails it at once (the allocator's
// release and retry would free blocks the capture refers to). Should a
// capture fail anyway, the step runs again without one (its ops are
// repeatable, as Backend::run_step requires), and the failure is counted
// with its reason (step_graph_totals().last_failure); an error that the
// step without a graph throws too is the step's, not the capture's.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/allocator.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device.hpp"

namespace corolla::cuda {
namespace {

std::atomic<bool>& step_graphs_flag() {
  static std::atomic<bool> on{env_switch("COROLLA_CUDA_GRAPHS", false)};
  return on;
}

struct graph_totals {
  std::atomic<std::uint64_t> launched{0}, updated{0}, instantiated{0}, failed{0}, eager{0};
  std::mutex mu;
  std::string last_failure;  ///< under mu
};
graph_totals& totals() {
  static graph_totals t;
  return t;
}

/// Counts a failed capture and keeps its reason.
void count_failure(const std::string& why) {
  graph_totals& t = totals();
  ++t.failed;
  std::lock_guard lock(t.mu);
  t.last_failure = why;
}

/// Failed captures in a row after which a recording runs without a graph.
constexpr int give_up_after = 3;
/// Executables a recording keeps, by node count: a step's topology changes
/// now and then (the paged attention's combine kernel comes with a second
/// split; a batch's sessions cross that line at different times), and an
/// executable of each shape seen recently updates in place instead of
/// being instantiated again.
constexpr std::size_t kept_executables = 4;

/// A recording's executables, kept between steps, the most recently used
/// first.
struct cuda_step_recording final : step_recording {
  struct kept {
    std::size_t nodes = 0;
    cudaGraphExec_t exec = nullptr;
  };
  const cuda_backend* owner = nullptr;  ///< the backend whose steps it recorded
  std::vector<kept> execs;
  long long steps = 0;  ///< steps run through this recording
  int failures_in_row = 0;
  bool off = false;  ///< gave up after give_up_after failures
  ~cuda_step_recording() override { reset(); }
  void reset() {
    // An executable still running is freed when it completes (CUDA's rule).
    for (kept& k : execs) cudaGraphExecDestroy(k.exec);
    execs.clear();
  }
};

/// An executable of `r` brought up to `graph`: the one of the same node
/// count updated in place, or a new one where there is none or the update
/// is refused (another topology). Null when neither works, with the reason
/// in `why`.
cudaGraphExec_t executable_for(cuda_step_recording& r, cudaGraph_t graph, std::string& why) {
  std::size_t nodes = 0;
  if (cudaGraphGetNodes(graph, nullptr, &nodes) != cudaSuccess) {
    why = std::string("cudaGraphGetNodes: ") + cudaGetErrorName(cudaGetLastError());
    return nullptr;
  }
  auto same = std::find_if(r.execs.begin(), r.execs.end(), [&](const auto& k) { return k.nodes == nodes; });
  if (same != r.execs.end()) {
    cuda_step_recording::kept k = *same;
    r.execs.erase(same);
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(k.exec, graph, &info) == cudaSuccess) {
      r.execs.insert(r.execs.begin(), k);
      ++totals().updated;
      return k.exec;
    }
    (void)cudaGetLastError();
    cudaGraphExecDestroy(k.exec);
  }
  cudaGraphExec_t exec = nullptr;
  if (const cudaError_t st = cudaGraphInstantiate(&exec, graph, 0); st != cudaSuccess) {
    (void)cudaGetLastError();
    why = std::string("cudaGraphInstantiate: ") + cudaGetErrorName(st);
    return nullptr;
  }
  if (r.execs.size() == kept_executables) {
    cudaGraphExecDestroy(r.execs.back().exec);
    r.execs.pop_back();
  }
  r.execs.insert(r.execs.begin(), {nodes, exec});
  ++totals().instantiated;
  return exec;
}

/// Marks a capture underway on a device for the allocator
/// (set_capture_underway) for as long as it lives.
struct capture_mark {
  int index;
  explicit capture_mark(int i) : index(i) { set_capture_underway(index, true); }
  ~capture_mark() { set_capture_underway(index, false); }
  capture_mark(const capture_mark&) = delete;
  capture_mark& operator=(const capture_mark&) = delete;
};

}  // namespace

void set_step_graphs(bool on) { step_graphs_flag().store(on); }

bool step_graphs_requested() { return step_graphs_flag().load(); }

step_graph_counts step_graph_totals() {
  graph_totals& t = totals();
  step_graph_counts c{t.launched.load(), t.updated.load(), t.instantiated.load(), t.failed.load(), t.eager.load(), {}};
  std::lock_guard lock(t.mu);
  c.last_failure = t.last_failure;
  return c;
}

/// Chunks of pinned host memory that a capture's uploads are copied into,
/// in order; the graph's copy nodes read them when it runs. Rewound at the
/// start of every capture, once the last graph launched from it has run
/// (`in_use`, recorded on the stream after that launch).
struct cuda_backend::capture_arena {
  /// 4 MiB: a 7B step's page tables at a 32k-token context take about 1 MiB.
  static constexpr std::size_t chunk_bytes = std::size_t{4} << 20;
  struct chunk {
    unsigned char* base = nullptr;
    std::size_t bytes = 0;
  };
  std::vector<chunk> chunks;
  std::size_t current = 0, offset = 0;
  cudaEvent_t in_use = nullptr;
  bool pending = false;  ///< in_use was recorded and may not have completed

  /// Room for `bytes`, in the current chunk or a later one (made here).
  unsigned char* take(std::size_t bytes) {
    const std::size_t room = (bytes + 63) & ~std::size_t{63};
    while (current < chunks.size() && offset + room > chunks[current].bytes) {
      ++current;
      offset = 0;
    }
    if (current == chunks.size()) add_chunk(std::max(chunk_bytes, room));
    unsigned char* at = chunks[current].base + offset;
    offset += room;
    return at;
  }
  /// One more chunk of `bytes`. Throws when no pinned memory can be had: a
  /// capture then fails and the step runs without a graph (a copy from
  /// pageable memory could not be captured).
  void add_chunk(std::size_t bytes) {
    void* p = nullptr;
    COROLLA_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    chunks.push_back({static_cast<unsigned char*>(p), bytes});
  }
};

const void* cuda_backend::stage_for_capture(const void* src, std::size_t bytes) {
  unsigned char* at = arena_->take(bytes);
  std::memcpy(at, src, bytes);
  return at;
}

void cuda_backend::free_capture_arena() {
  if (arena_ == nullptr) return;
  if (arena_->in_use) {
    if (arena_->pending) cudaEventSynchronize(arena_->in_use);
    cudaEventDestroy(arena_->in_use);
  }
  for (const capture_arena::chunk& c : arena_->chunks) cudaFreeHost(c.base);
  delete arena_;
  arena_ = nullptr;
  if (capture_stream_) cudaStreamDestroy(capture_stream_);
  capture_stream_ = nullptr;
}

void cuda_backend::run_step(std::unique_ptr<step_recording>& rec, const std::function<void()>& ops) {
  // Inside another step's capture the ops simply join it.
  if (capturing_ || companion_ || !step_graphs_requested() || sync_after_launch()) {
    ops();
    return;
  }
  if (!rec) rec = std::make_unique<cuda_step_recording>();
  auto* r = dynamic_cast<cuda_step_recording*>(rec.get());
  if (r == nullptr) {  // another backend's recording: nothing to replay here
    ops();
    return;
  }
  if (r->owner != this) {
    r->reset();
    r->owner = this;
    r->steps = 0;
  }
  if (r->off || r->steps++ == 0) {
    ++totals().eager;
    ops();
    return;
  }
  device_guard guard(index_);
  std::string why;
  try {
    prepare_capture();
  } catch (const std::exception& e) {  // no capture stream or arena: this step without a graph
    why = e.what();
  }
  cudaGraph_t graph = nullptr;
  if (why.empty()) {
    // Captured on a stream of its own, non-blocking: while a blocking
    // stream is captured the legacy default stream (the memory hooks',
    // other threads' copies) may not be used at all. The graph is launched
    // on the backend's stream, in order with its other work.
    capture_mark mark(index_);
    if (const cudaError_t st = cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeRelaxed);
        st != cudaSuccess) {
      why = std::string("cudaStreamBeginCapture: ") + cudaGetErrorName(st);
    } else {
      stream_t own = stream_;
      stream_ = capture_stream_;
      capturing_ = true;
      forget_uploads();  // what the capture uploads exists only once its graph runs
      try {
        ops();
      } catch (const std::exception& e) {
        why = std::string("an op threw during the capture: ") + e.what();
      } catch (...) {
        why = "an op threw during the capture";
      }
      capturing_ = false;
      stream_ = own;
      forget_uploads();  // nor may the eager rerun of a failed capture rely on it
      const cudaError_t ended = cudaStreamEndCapture(capture_stream_, &graph);
      if (why.empty() && ended != cudaSuccess) why = std::string("cudaStreamEndCapture: ") + cudaGetErrorName(ended);
    }
  }
  cudaGraphExec_t exec = why.empty() ? executable_for(*r, graph, why) : nullptr;
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (exec == nullptr) {
    (void)cudaGetLastError();
    ops();  // as it comes (nothing of the capture ran): a real error throws here, not counted as the capture's
    count_failure(why);
    if (++r->failures_in_row >= give_up_after) r->off = true;
    return;
  }
  r->failures_in_row = 0;
  COROLLA_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  ++totals().launched;
  // The graph reads the arena when it runs: the next capture waits for it.
  if (cudaEventRecord(arena_->in_use, stream_) == cudaSuccess) {
    arena_->pending = true;
  } else {
    (void)cudaGetLastError();
    COROLLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

void cuda_backend::prepare_capture() {
  if (capture_stream_ == nullptr) {
    cudaStream_t s = nullptr;
    COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    capture_stream_ = s;
  }
  if (arena_ == nullptr) {
    cudaEvent_t in_use = nullptr;
    COROLLA_CUDA_CHECK(cudaEventCreateWithFlags(&in_use, cudaEventDisableTiming));
    arena_ = new capture_arena;
    arena_->in_use = in_use;
  }
  // The first chunk before any capture: pinning memory is no stream work,
  // but it need not happen inside one.
  if (arena_->chunks.empty()) arena_->add_chunk(capture_arena::chunk_bytes);
  if (arena_->pending) {  // the last graph may still read the arena
    COROLLA_CUDA_CHECK(cudaEventSynchronize(arena_->in_use));
    arena_->pending = false;
  }
  arena_->current = 0;
  arena_->offset = 0;
}

}  // namespace corolla::cuda
