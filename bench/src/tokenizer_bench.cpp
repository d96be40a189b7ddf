// The tokenizer benchmark. The default text repeats a paragraph with a running number so the
// word cache sees realistic reuse (English prose reuses most words) but not one line only.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "llmesh/bench/tokenizer_bench.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::bench {
namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

std::string default_text() {
  const std::string para =
      "The engine reads the weights once per decoded token, so its speed is set by memory bandwidth; "
      "prefill, by contrast, multiplies whole prompts at once and is bound by arithmetic. Sentences "
      "like this one, with numbers such as 3.14159 and 2048, punctuation (commas, colons: semicolons;) "
      "and the occasional rare word - antidisestablishmentarianism - exercise the merges.\n";
  std::string text;
  for (int i = 0; text.size() < (1u << 20); ++i) text += std::to_string(i) + ". " + para;
  return text;
}

}  // namespace

status run_tokenizer_bench(const tokenizer_bench_options& opt) {
  auto t0 = clock_type::now();
  auto tok = model::tokenizer::load(opt.model_dir);
  if (!tok) return tok.take_error();
  const double load_s = since(t0);
  std::string text = default_text();
  if (!opt.file.empty()) {
    std::ifstream in(opt.file, std::ios::binary);
    if (!in) return make_error(errc::not_found, "cannot read " + opt.file);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  double enc = 1e30, dec = 1e30;
  std::vector<int32_t> ids;
  for (int r = 0; r < std::max(1, opt.reps); ++r) {
    t0 = clock_type::now();
    ids = (*tok)->encode(text, false);
    enc = std::min(enc, since(t0));
    t0 = clock_type::now();
    std::string back = (*tok)->decoder().decode(ids, false);
    dec = std::min(dec, since(t0));
    if (back.size() != text.size()) std::fprintf(stderr, "warning: round trip changed the text size\n");
  }
  std::printf("llmesh bench tokenizer: %s\n", opt.model_dir.c_str());
  std::printf("  load     %.3f s\n", load_s);
  std::printf("  encode   %.2f MB in %.3f s: %.1f MB/s, %.0f tokens/s (%zu tokens)\n", text.size() / 1e6, enc,
              text.size() / 1e6 / enc, ids.size() / enc, ids.size());
  std::printf("  decode   %.0f tokens/s\n", ids.size() / dec);
  return ok_status();
}

}  // namespace llmesh::bench
