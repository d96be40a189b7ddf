#include "lora_runner.hpp"

#include <algorithm>
#include <map>

#include "llmesh/kernels/matmul.hpp"
#include "matmul_jobs.hpp"

namespace llmesh::model::detail {
namespace {

/// y [m][n] = x [m][k] · w[:, 0..k)ᵀ, w float32 rows of ldw, x and y packed.
kernels::matmul_args f32_job(const float* x, const float* w, size_t ldw, float* y, size_t m, size_t n, size_t k) {
  return job(x, k, weight_matrix{w, kernels::dtype::f32, n, ldw}, w, y, n, m, n, k, nullptr);
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
    size_t x0, t0, u0;
  };
  std::vector<part> parts;
  size_t nx = 0, nt = 0, nu = 0;
  for (const auto& g : groups_) {
    const lora_adapter& a = m.loras()[static_cast<size_t>(g.adapter)];
    for (const auto& j : jobs) {
      const lora_pair& p = a.layers[layer][j.target];
      if (p.r == 0) continue;
      const size_t n = g.rows.size();
      parts.push_back({&p, &j, &g, nx, nt, nu});
      nx += n * j.n_in;
      nt += n * p.r;
      nu += n * j.n_out;
    }
  }
  if (parts.empty()) return ok_status();
  x_.resize(nx);
  t_.resize(nt);
  u_.resize(nu);
  std::vector<kernels::matmul_args> down, up;
  for (const auto& pt : parts) {
    const size_t n = pt.g->rows.size();
    for (size_t i = 0; i < n; ++i) {
      std::copy_n(pt.j->x + pt.g->rows[i] * pt.j->ldx, pt.j->n_in, &x_[pt.x0 + i * pt.j->n_in]);
    }
    // t = x · A[:, in0..]ᵀ  [n][r], then u = t · B[out0..]ᵀ  [n][n_out]
    down.push_back(f32_job(&x_[pt.x0], pt.p->a.data() + pt.j->in0, pt.p->in, &t_[pt.t0], n, pt.p->r, pt.j->n_in));
    up.push_back(f32_job(&t_[pt.t0], pt.p->b.data() + pt.j->out0 * pt.p->r, pt.p->r, &u_[pt.u0], n, pt.j->n_out, pt.p->r));
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
