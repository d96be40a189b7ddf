// CUDA runtime pieces the model layer needs, without CUDA headers: device selection, streams,
// device and pinned memory, copies, events and graphs. Defined only in CUDA builds
// (device/runtime_cuda.cu); callers check cuda_device_count() > 0 first.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "llmesh/common/error.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*
struct CUgraphExec_st;
struct CUevent_st;

namespace llmesh::kernels::cuda {

using stream_t = CUstream_st*;

/// Makes `device` current for the calling thread.
[[nodiscard]] status use_device(int device);

/// Waits for all work on the current device (tests and benchmarks).
[[nodiscard]] status synchronize_device();

/// Multiprocessor count and name of the current device.
[[nodiscard]] status device_info(int& multiprocessors, std::string& name);

/// A non-blocking stream, destroyed with the object.
class stream {
 public:
  [[nodiscard]] static result<stream> create();
  stream() = default;
  stream(stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  stream& operator=(stream&& o) noexcept;
  ~stream();
  stream_t get() const { return s_; }
  [[nodiscard]] status synchronize() const;

 private:
  stream_t s_ = nullptr;
};

/// Device memory (cudaMalloc), or pinned host memory (cudaMallocHost) when `pinned`.
/// Move-only; freed with the object.
class buffer {
 public:
  [[nodiscard]] static result<buffer> device(size_t bytes);
  [[nodiscard]] static result<buffer> pinned(size_t bytes);
  buffer() = default;
  buffer(buffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_), pinned_(o.pinned_) { o.p_ = nullptr; o.bytes_ = 0; }
  buffer& operator=(buffer&& o) noexcept;
  ~buffer();
  void* get() const { return p_; }
  template <class T> T* as() const { return static_cast<T*>(p_); }
  size_t size() const { return bytes_; }

 private:
  void release();
  void* p_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
};

/// Asynchronous copies on a stream (pageable host memory makes them synchronous).
[[nodiscard]] status copy_to_device(void* dst, const void* src, size_t bytes, stream_t s);
[[nodiscard]] status copy_to_host(void* dst, const void* src, size_t bytes, stream_t s);
[[nodiscard]] status copy_on_device(void* dst, const void* src, size_t bytes, stream_t s);
/// Synchronous strided host → device copy of `height` rows of `width` bytes.
[[nodiscard]] status copy_to_device_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                       size_t width, size_t height);
/// The same on a stream (a copy from pageable host memory may return before its data reaches
/// the device: synchronize `s` before the source changes or other streams read `dst`).
[[nodiscard]] status copy_to_device_2d_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                             size_t width, size_t height, stream_t s);
/// Synchronous strided device → host copy of `height` rows of `width` bytes.
[[nodiscard]] status copy_to_host_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                                     size_t height);
/// Sets `bytes` bytes to `value` (asynchronous).
[[nodiscard]] status fill_bytes(void* dst, int value, size_t bytes, stream_t s);

/// The error left by the last launch on this thread, named after `what` (clears it).
[[nodiscard]] status launch_status(const char* what);

/// A captured stream graph, replayed with one launch (removes per-kernel launch gaps).
class graph {
 public:
  /// Starts capturing the work enqueued on `s` (thread-local capture mode).
  [[nodiscard]] static status begin_capture(stream_t s);
  /// Ends the capture started on `s` and instantiates it.
  [[nodiscard]] static result<graph> end_capture(stream_t s);
  graph() = default;
  graph(graph&& o) noexcept : g_(o.g_) { o.g_ = nullptr; }
  graph& operator=(graph&& o) noexcept;
  ~graph();
  [[nodiscard]] status launch(stream_t s) const;

 private:
  CUgraphExec_st* g_ = nullptr;
};

/// Elapsed device time between two points on a stream.
class event_timer {
 public:
  [[nodiscard]] static result<event_timer> create();
  event_timer() = default;
  event_timer(event_timer&& o) noexcept : a_(o.a_), b_(o.b_) { o.a_ = o.b_ = nullptr; }
  event_timer& operator=(event_timer&&) = delete;
  ~event_timer();
  [[nodiscard]] status start(stream_t s);
  [[nodiscard]] status stop(stream_t s);
  /// Waits for the stop event; milliseconds between start and stop.
  [[nodiscard]] result<double> elapsed_ms();

 private:
  CUevent_st* a_ = nullptr;
  CUevent_st* b_ = nullptr;
};

}  // namespace llmesh::kernels::cuda
