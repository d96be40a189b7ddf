#include "lora_runner.hpp"

#include <algorithm>
#include <cstdint>
#include <map>

#include "llmesh/kernels/matmul.hpp"
#include "matmul_jobs.hpp"

namespace llmesh::model::detail {
namespace {

/// y [m][n] = x [m][k] (rows ldx apart) · w[:, 0..k)ᵀ, w of `type` with rows ldw apart, y packed.
kernels::matmul_args lora_matmul(const float* x, size_t ldx, const void* w, kernels::dtype type, size_t ldw, float* y,
                                 size_t m, size_t n, size_t k) {
  return job(x, ldx, weight_matrix{w, type, n, ldw}, w, y, n, m, n, k, nullptr);
}

}  // namespace

status lora_runner::plan(std::span<const step_sequence> batch, const model& m) {
  groups_.clear();
  std::map<int32_t, size_t> at;
  size_t row = 0;
  for (const auto& s : batch) {
    if (s.lora >= 0) {
      auto [it, fresh] = at.try_emplace(s.lora, groups_.size());
      if (fresh) {
        group g{s.lora, s.adapter, nullptr, {}};
        if (!g.a) {  // not pinned by the caller: held for this step
          g.pin = m.loras().get(s.lora);
          g.a = g.pin.get();
          if (!g.a) {
            groups_.clear();
            return make_error(errc::invalid_request, "forward: LoRA adapter " + std::to_string(s.lora) + " is not loaded");
          }
        }
        groups_.push_back(std::move(g));
      }
      auto& rows = groups_[it->second].rows;
      for (size_t i = 0; i < s.tokens.size(); ++i) rows.push_back(row + i);
    }
    row += s.tokens.size();
  }
  return ok_status();
}

void lora_runner::begin(size_t layer, std::span<const lora_job> jobs, std::vector<kernels::matmul_args>& first) {
  parts_.clear();
  jobs_.assign(jobs.begin(), jobs.end());
  second_.clear();
  /// A group's input rows, once per (group, input): in place when they are consecutive (a
  /// sequence's prefill chunk, or a batch of one adapter), else gathered into x_.
  struct input {
    const group* g;
    const float* src;
    size_t width, ld;  ///< the columns its jobs read, and its rows' stride
    size_t x0;         ///< in x_; SIZE_MAX: in place
  };
  std::vector<input> inputs;
  size_t nx = 0, nt = 0, nu = 0;
  for (const auto& g : groups_) {
    const lora_adapter& a = *g.a;
    const bool consecutive = g.rows.back() - g.rows.front() + 1 == g.rows.size();
    for (size_t ji = 0; ji < jobs_.size(); ++ji) {
      const lora_job& j = jobs_[ji];
      const lora_pair& p = a.layers[layer][j.target];
      if (p.r == 0) continue;
      const size_t n = g.rows.size();
      parts_.push_back({&p, ji, &g, nt, nu});
      nt += n * p.r;
      nu += n * j.n_out;
      const bool seen = std::any_of(inputs.begin(), inputs.end(), [&](const input& in) { return in.g == &g && in.src == j.x; });
      if (seen) continue;
      inputs.push_back({&g, j.x, j.n_in, j.ldx, consecutive ? SIZE_MAX : nx});
      if (!consecutive) nx += n * j.n_in;
    }
  }
  if (parts_.empty()) return;
  x_.resize(nx);
  t_.resize(nt);
  u_.resize(nu);
  for (const auto& in : inputs) {  // the jobs that read one input read the same columns of it
    if (in.x0 == SIZE_MAX) continue;
    for (size_t i = 0; i < in.g->rows.size(); ++i) {
      std::copy_n(in.src + in.g->rows[i] * in.ld, in.width, &x_[in.x0 + i * in.width]);
    }
  }
  for (const auto& pt : parts_) {
    const lora_job& j = jobs_[pt.job];
    const size_t n = pt.g->rows.size();
    auto in = std::find_if(inputs.begin(), inputs.end(), [&](const input& i) { return i.g == pt.g && i.src == j.x; });
    const float* x = in->x0 == SIZE_MAX ? j.x + pt.g->rows.front() * j.ldx : &x_[in->x0];
    const size_t ldx = in->x0 == SIZE_MAX ? j.ldx : j.n_in;
    // t = x · A[:, in0..]ᵀ  [n][r] (with the caller's projections), then u = t · B[out0..]ᵀ  [n][n_out]
    first.push_back(lora_matmul(x, ldx, pt.p->a.at(j.in0), pt.p->a.type, pt.p->in, &t_[pt.t0], n, pt.p->r, j.n_in));
    second_.push_back(lora_matmul(&t_[pt.t0], pt.p->r, pt.p->b.at(j.out0 * pt.p->r), pt.p->b.type, pt.p->r, &u_[pt.u0], n,
                                  j.n_out, pt.p->r));
  }
}

status lora_runner::finish(kernels::thread_pool& pool) {
  if (parts_.empty()) return ok_status();
  LLMESH_TRY(kernels::matmul(second_, pool));
  for (const auto& pt : parts_) {  // y += scale · u, row by row (PEFT: result + lora_B(lora_A(x)) * scaling)
    const lora_job& j = jobs_[pt.job];
    const size_t n = pt.g->rows.size(), no = j.n_out;
    const float s = pt.p->scale;
    for (size_t i = 0; i < n; ++i) {
      float* y = j.y + pt.g->rows[i] * j.ldy;
      const float* u = &u_[pt.u0 + i * no];
      for (size_t c = 0; c < no; ++c) y[c] += u[c] * s;
    }
  }
  parts_.clear();
  return ok_status();
}

status lora_runner::project(std::span<const kernels::matmul_args> base, size_t layer,
                            std::span<const lora_job> jobs, kernels::thread_pool& pool) {
  if (!active()) return kernels::matmul(base, pool);
  std::vector<kernels::matmul_args> all(base.begin(), base.end());
  begin(layer, jobs, all);
  LLMESH_TRY(kernels::matmul(all, pool));
  return finish(pool);
}

}  // namespace llmesh::model::detail
