// Which vector instruction set the CPU kernels use, chosen once at run time.
#pragma once

#include <string_view>

namespace llmesh::kernels {

/// Instruction-set level of the CPU kernels. All levels compute bit-identical results: the
/// reduction order is fixed (see matmul.hpp), only the speed differs.
enum class isa { portable, avx2, avx512 };

/// The best level this CPU supports, unless the environment variable LLMESH_ISA
/// (portable|avx2|avx512) asks for a lower one. Computed once, thread-safe.
isa active_isa();

/// The best level this CPU supports, ignoring LLMESH_ISA.
isa best_supported_isa();

/// Lower-case name: "portable", "avx2", "avx512".
std::string_view isa_name(isa level);

}  // namespace llmesh::kernels
