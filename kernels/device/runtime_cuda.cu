// CUDA runtime wrappers (cuda_runtime.hpp): every call's return code becomes a status that
// names the call; nothing here throws or aborts.
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "llmesh/kernels/cuda_runtime.hpp"

namespace llmesh::kernels::cuda {
namespace {

status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return make_error(errc::internal, std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

status use_device(int device) { return check(cudaSetDevice(device), "cudaSetDevice"); }

status synchronize_device() { return check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

status device_info(int& multiprocessors, std::string& name) {
  int dev = 0;
  LLMESH_TRY(check(cudaGetDevice(&dev), "cudaGetDevice"));
  cudaDeviceProp prop{};
  LLMESH_TRY(check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties"));
  multiprocessors = prop.multiProcessorCount;
  name = prop.name;
  return ok_status();
}

result<stream> stream::create() {
  stream s;
  if (auto st = check(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking), "cudaStreamCreate"); !st) return st.err();
  return std::move(s);
}

stream& stream::operator=(stream&& o) noexcept {
  if (this != &o) {
    if (s_) cudaStreamDestroy(s_);
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

stream::~stream() {
  if (s_) cudaStreamDestroy(s_);
}

status stream::synchronize() const { return check(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

result<buffer> buffer::device(size_t bytes) {
  buffer b;
  if (bytes == 0) return std::move(b);
  if (auto st = check(cudaMalloc(&b.p_, bytes), "cudaMalloc"); !st) {
    cudaGetLastError();
    return make_error(errc::overloaded, st.err().message + " (" + std::to_string(bytes >> 20) + " MiB)");
  }
  b.bytes_ = bytes;
  return std::move(b);
}

result<buffer> buffer::pinned(size_t bytes) {
  buffer b;
  if (bytes == 0) return std::move(b);
  if (auto st = check(cudaMallocHost(&b.p_, bytes), "cudaMallocHost"); !st) return st.err();
  b.bytes_ = bytes;
  b.pinned_ = true;
  return std::move(b);
}

buffer& buffer::operator=(buffer&& o) noexcept {
  if (this != &o) {
    release();
    p_ = o.p_;
    bytes_ = o.bytes_;
    pinned_ = o.pinned_;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

buffer::~buffer() { release(); }

void buffer::release() {
  if (!p_) return;
  if (pinned_) cudaFreeHost(p_); else cudaFree(p_);
  p_ = nullptr;
  bytes_ = 0;
}

status copy_to_device(void* dst, const void* src, size_t bytes, stream_t s) {
  if (bytes == 0) return ok_status();
  return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync(H2D)");
}

status copy_to_host(void* dst, const void* src, size_t bytes, stream_t s) {
  if (bytes == 0) return ok_status();
  return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync(D2H)");
}

status copy_on_device(void* dst, const void* src, size_t bytes, stream_t s) {
  if (bytes == 0) return ok_status();
  return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync(D2D)");
}

status copy_to_device_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height) {
  if (width == 0 || height == 0) return ok_status();
  return check(cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyHostToDevice), "cudaMemcpy2D");
}

status copy_to_device_2d_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height,
                               stream_t s) {
  if (width == 0 || height == 0) return ok_status();
  return check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyHostToDevice, s),
               "cudaMemcpy2DAsync(H2D)");
}

status copy_to_host_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height) {
  if (width == 0 || height == 0) return ok_status();
  return check(cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToHost), "cudaMemcpy2D(D2H)");
}

status fill_bytes(void* dst, int value, size_t bytes, stream_t s) {
  if (bytes == 0) return ok_status();
  return check(cudaMemsetAsync(dst, value, bytes, s), "cudaMemsetAsync");
}

status launch_status(const char* what) { return check(cudaGetLastError(), what); }

status graph::begin_capture(stream_t s) {
  return check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}

result<graph> graph::end_capture(stream_t s) {
  cudaGraph_t g = nullptr;
  if (auto st = check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture"); !st) return st.err();
  graph out;
  cudaGraphExec_t exec = nullptr;
  auto st = check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(g);
  if (!st) return st.err();
  out.g_ = exec;
  return std::move(out);
}

graph& graph::operator=(graph&& o) noexcept {
  if (this != &o) {
    if (g_) cudaGraphExecDestroy(g_);
    g_ = o.g_;
    o.g_ = nullptr;
  }
  return *this;
}

graph::~graph() {
  if (g_) cudaGraphExecDestroy(g_);
}

status graph::launch(stream_t s) const { return check(cudaGraphLaunch(g_, s), "cudaGraphLaunch"); }

result<event_timer> event_timer::create() {
  event_timer t;
  if (auto st = check(cudaEventCreate(&t.a_), "cudaEventCreate"); !st) return st.err();
  if (auto st = check(cudaEventCreate(&t.b_), "cudaEventCreate"); !st) return st.err();
  return std::move(t);
}

event_timer::~event_timer() {
  if (a_) cudaEventDestroy(a_);
  if (b_) cudaEventDestroy(b_);
}

status event_timer::start(stream_t s) { return check(cudaEventRecord(a_, s), "cudaEventRecord"); }
status event_timer::stop(stream_t s) { return check(cudaEventRecord(b_, s), "cudaEventRecord"); }

result<double> event_timer::elapsed_ms() {
  if (auto st = check(cudaEventSynchronize(b_), "cudaEventSynchronize"); !st) return st.err();
  float ms = 0;
  if (auto st = check(cudaEventElapsedTime(&ms, a_, b_), "cudaEventElapsedTime"); !st) return st.err();
  return static_cast<double>(ms);
}

}  // namespace llmesh::kernels::cuda
