// Envelopes to Cap'n Proto frames and back. Decoding trusts nothing: the frame's size and
// alignment, its segment table (count and sizes, checked before Cap'n Proto sees it), the
// reader's traversal and nesting limits, every list's and text's length, and the message kind
// are checked; a bad frame is an error value naming the problem (protocol_violation), never a
// crash or an exception.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "llmesh/transport/wire.hpp"

namespace llmesh::transport {

struct frame_limits {
  size_t max_frame_bytes = size_t{64} << 20;  ///< a 64 MiB frame at most
  uint32_t max_segments = 64;
  uint64_t traversal_words = (size_t{64} << 20) / 8;  ///< read at most the frame's size once
  int nesting = 16;
  size_t max_list = size_t{1} << 22;  ///< elements in any list (prompts, token ids)
  size_t max_text = size_t{1} << 16;  ///< bytes in any text or data field
};

/// One frame (a flat Cap'n Proto message, 8-byte words).
[[nodiscard]] std::vector<uint8_t> encode(const envelope& e);

/// The envelope in a frame; `frame` need not be aligned.
[[nodiscard]] result<envelope> decode(std::span<const uint8_t> frame, const frame_limits& limits = {});

}  // namespace llmesh::transport
