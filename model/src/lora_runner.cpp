#include "lora_runner.hpp"

#include <algorithm>
#include <cstdint>
#include <map>

#include "llmesh/kernels/matmul.hpp"
#include "matmul_jobs.hpp"

namespace llmesh::model::detail {
namespace {

/// y [m][n] = x [m][k] (rows ldx apart) · w[:, 0..k)ᵀ, w float32 rows of ldw, y packed.
kernels::matmul_args f32_job(const float* x, size_t ldx, const float* w, size_t ldw, float* y, size_t m, size_t n, size_t k) {
  return job(x, ldx, weight_matrix{w, kernels::dtype::f32, n, ldw}, w, y, n, m, n, k, nullptr);
}

}  // namespace

void lora_runner::plan(std::span<const step_sequence> batch) {
  groups_.clear();
  std::map<int32_t, size_t> at;
  size_t row = 0;
  for (const auto& s : batch) {
    if (s.lora >= 0) {
      auto [it, fresh] = at.try_emplace(s.lora, groups_.size());
      if (fresh) groups_.push_back({s.lora, {}});
      auto& rows = groups_[it->second].rows;
      for (size_t i = 0; i < s.tokens.size(); ++i) rows.push_back(row + i);
    }
    row += s.tokens.size();
  }
}

status lora_runner::add(const model& m, size_t layer, std::span<const lora_job> jobs, kernels::thread_pool& pool) {
  struct part {
    const lora_pair* p;
    const lora_job* j;
    const group* g;
    size_t t0, u0;
    const float* x = nullptr;  ///< the group's input rows, ldx apart
    size_t ldx = 0;
  };
  /// A group's input rows, once per (group, input): in place when they are consecutive (a
  /// sequence's prefill chunk, or a batch of one adapter), else gathered into x_.
  struct input {
    const group* g;
    const float* src;
    size_t x0;  ///< in x_; SIZE_MAX: in place
  };
  std::vector<part> parts;
  std::vector<input> inputs;
  size_t nx = 0, nt = 0, nu = 0;
  for (const auto& g : groups_) {
    const lora_adapter& a = m.loras()[static_cast<size_t>(g.adapter)];
    const bool consecutive = g.rows.back() - g.rows.front() + 1 == g.rows.size();
    for (const auto& j : jobs) {
      const lora_pair& p = a.layers[layer][j.target];
      if (p.r == 0) continue;
      const size_t n = g.rows.size();
      parts.push_back({&p, &j, &g, nt, nu});
      nt += n * p.r;
      nu += n * j.n_out;
      const bool seen = std::any_of(inputs.begin(), inputs.end(), [&](const input& in) { return in.g == &g && in.src == j.x; });
      if (seen) continue;
      inputs.push_back({&g, j.x, consecutive ? SIZE_MAX : nx});
      if (!consecutive) nx += n * j.n_in;
    }
  }
  if (parts.empty()) return ok_status();
  x_.resize(nx);
  t_.resize(nt);
  u_.resize(nu);
  std::vector<kernels::matmul_args> down, up;
  for (auto& pt : parts) {
    const size_t n = pt.g->rows.size(), n_in = pt.j->n_in;
    auto in = std::find_if(inputs.begin(), inputs.end(), [&](const input& i) { return i.g == pt.g && i.src == pt.j->x; });
    if (in->x0 == SIZE_MAX) {
      pt.x = pt.j->x + pt.g->rows.front() * pt.j->ldx;
      pt.ldx = pt.j->ldx;
    } else {
      pt.x = &x_[in->x0];
      pt.ldx = n_in;
    }
    // t = x · A[:, in0..]ᵀ  [n][r], then u = t · B[out0..]ᵀ  [n][n_out]
    down.push_back(f32_job(pt.x, pt.ldx, pt.p->a.data() + pt.j->in0, pt.p->in, &t_[pt.t0], n, pt.p->r, n_in));
    up.push_back(f32_job(&t_[pt.t0], pt.p->r, pt.p->b.data() + pt.j->out0 * pt.p->r, pt.p->r, &u_[pt.u0], n, pt.j->n_out, pt.p->r));
  }
  for (const auto& in : inputs) {  // the jobs that read one input read the same columns of it
    if (in.x0 == SIZE_MAX) continue;
    size_t width = 0, ld = 0;
    for (const auto& pt : parts) {
      if (pt.g == in.g && pt.j->x == in.src) width = pt.j->n_in, ld = pt.j->ldx;
    }
    for (size_t i = 0; i < in.g->rows.size(); ++i) std::copy_n(in.src + in.g->rows[i] * ld, width, &x_[in.x0 + i * width]);
  }
  LLMESH_TRY(kernels::matmul(down, pool));
  LLMESH_TRY(kernels::matmul(up, pool));
  for (const auto& pt : parts) {  // y += scale · u, row by row (PEFT: result + lora_B(lora_A(x)) * scaling)
    const size_t n = pt.g->rows.size(), no = pt.j->n_out;
    const float s = pt.p->scale;
    for (size_t i = 0; i < n; ++i) {
      float* y = pt.j->y + pt.g->rows[i] * pt.j->ldy;
      const float* u = &u_[pt.u0 + i * no];
      for (size_t c = 0; c < no; ++c) y[c] += u[c] * s;
    }
  }
  return ok_status();
}

}  // namespace llmesh::model::detail
