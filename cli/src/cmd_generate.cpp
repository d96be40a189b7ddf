// `llmesh generate`: the engine directly, no mesh — the reference path for correctness and speed.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>

#include "commands.hpp"
#include "replica_flags.hpp"
#include "llmesh/model/detokenizer.hpp"
#include "llmesh/model/generate.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::cli {
namespace {

struct generate_flags {
  std::string model_dir, prompt, prompt_ids, dump_logits;
  size_t max_tokens = 16, prefill_chunk = 0;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f, repetition_penalty = 1.0f;
  int top_k = 0, tp = 1, threads = 0, min_tokens = 0;
  uint64_t seed = 0;
  bool print_ids = false, deterministic = false, expert_parallel = false;
  std::string quantization = "none", kv_cache_dtype = "auto", dtype = "auto";
  std::string device = "auto";
  std::string lora;  ///< a LoRA adapter's directory: generate with it
  std::string lora_dtype = "auto";
};

/// The prompt's ids: --prompt-ids as given, or --prompt through the model's tokenizer (with
/// its special tokens, e.g. BOS, as HF's encode adds them by default; the tokenizer is kept
/// in `tok` for decoding).
result<std::vector<int32_t>> prompt_ids(const generate_flags& f, bool has_prompt,
                                        std::shared_ptr<const model::tokenizer>& tok) {
  if (has_prompt == !f.prompt_ids.empty()) return make_error(errc::invalid_request, "give exactly one of --prompt, --prompt-ids");
  if (!has_prompt) return parse_id_list(f.prompt_ids);
  auto loaded = model::tokenizer::load(f.model_dir);
  if (!loaded) return loaded.take_error();
  tok = loaded.value();
  auto ids = tok->encode(f.prompt, true);
  if (ids.empty()) return make_error(errc::invalid_request, "the prompt is empty");
  return ids;
}

status run_generate(const generate_flags& f, bool seed_given, bool has_prompt) {
  std::shared_ptr<const model::tokenizer> tok;
  auto ids = prompt_ids(f, has_prompt, tok);
  if (!ids) return ids.take_error();
  auto device = model::parse_backend(f.device);
  if (!device) return device.take_error();
  auto quant = quantization_for(f.quantization, *device);
  if (!quant) return quant.take_error();
  auto kv_type = kv_cache_dtype_for(f.kv_cache_dtype, *device);
  if (!kv_type) return kv_type.take_error();
  auto dtype = model::parse_weight_dtype(f.dtype);
  if (!dtype) return dtype.take_error();
  auto lora_dtype = parse_lora_dtype(f.lora_dtype);
  if (!lora_dtype) return lora_dtype.take_error();
  model::load_options lo;
  lo.dtype = *dtype;
  lo.quant = *quant;
  if (!f.lora.empty()) lo.loras = {{"lora", f.lora}};
  lo.lora_dtype = *lora_dtype;
  auto m = model::model::load(f.model_dir, lo);
  if (!m) return m.take_error();
  model::engine_options opt;
  opt.tp = f.tp;
  opt.expert_parallel = f.expert_parallel;
  opt.threads = f.threads;
  opt.device = *device;
  opt.kv_type = *kv_type;
  opt.deterministic = f.deterministic;
  auto eng = model::engine::create(m.value(), opt);
  if (!eng) return eng.take_error();

  model::generate_request req;
  req.prompt = std::move(ids.value());
  req.max_tokens = f.max_tokens;
  req.prefill_chunk = f.prefill_chunk;
  req.lora = f.lora.empty() ? -1 : 0;
  req.sampling.temperature = f.temperature;
  req.sampling.top_k = f.top_k;
  req.sampling.top_p = f.top_p;
  req.sampling.min_p = f.min_p;
  req.sampling.presence_penalty = f.presence_penalty;
  req.sampling.frequency_penalty = f.frequency_penalty;
  req.sampling.repetition_penalty = f.repetition_penalty;
  req.sampling.min_tokens = f.min_tokens;
  // A request without a seed gets a random one here, where it enters the system.
  req.sampling.seed = seed_given ? f.seed : std::random_device{}();
  // Text output streams token by token (complete UTF-8 characters only); models whose
  // tokenizer cannot be decoded yet print their ids instead, with a note on stderr.
  std::optional<model::detokenizer> detok;
  if (!f.print_ids && !tok) {
    auto d = model::detokenizer::load(f.model_dir);
    if (d) {
      detok = std::move(d.value());
    } else {
      std::fprintf(stderr, "llmesh: printing ids: %s\n", d.err().message.c_str());
    }
  }
  std::optional<model::stream_decoder> stream;
  if (!f.print_ids && tok) stream.emplace(tok->decoder());
  if (detok) stream.emplace(*detok);
  auto on_token = [&](int32_t id) {
    if (!stream) return;
    std::string text = stream->push(id);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  auto out = model::generate(**eng, req, on_token);
  if (!out) return out.take_error();

  if (!f.dump_logits.empty()) {
    std::ofstream dump(f.dump_logits, std::ios::binary | std::ios::trunc);
    dump.write(reinterpret_cast<const char*>(out->first_logits.data()),
               static_cast<std::streamsize>(out->first_logits.size() * sizeof(float)));
    dump.close();
    if (!dump) return make_error(errc::io_error, "cannot write " + f.dump_logits);
  }
  if (stream) {
    std::string rest = stream->flush();
    std::printf("%s\n", rest.c_str());
  } else {
    std::ostringstream line;
    for (size_t i = 0; i < out->tokens.size(); ++i) line << (i ? " " : "") << out->tokens[i];
    std::printf("%s\n", line.str().c_str());
  }
  std::fflush(stdout);  // the text, then the timing line
  std::fprintf(stderr, "prompt %zu tokens in %.3f s (%.1f tok/s), generated %zu in %.3f s (%.1f tok/s), finish=%s, seed=%llu, device=%s%s%s\n",
               req.prompt.size(), out->prefill_seconds, req.prompt.size() / std::max(out->prefill_seconds, 1e-9),
               out->tokens.size(), out->decode_seconds,
               out->tokens.size() > 1 ? (out->tokens.size() - 1) / std::max(out->decode_seconds, 1e-9) : 0.0,
               out->finish_reason.c_str(), static_cast<unsigned long long>(req.sampling.seed), (**eng).backend_name(),
               (**eng).device_note().empty() ? "" : " (",
               (**eng).device_note().empty() ? "" : ((**eng).device_note() + ")").c_str());
  return ok_status();
}

}  // namespace

result<std::vector<int32_t>> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) return make_error(errc::invalid_request, "empty element in id list '" + text + "'");
    item = item.substr(b, e - b + 1);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < 0 || v > INT32_MAX) {
      return make_error(errc::invalid_request, "bad token id '" + item + "'");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return make_error(errc::invalid_request, "empty id list");
  return ids;
}

void add_generate(CLI::App& app, command_set& commands) {
  auto f = std::make_shared<generate_flags>();
  auto* sub = app.add_subcommand("generate", "Generate tokens with the engine directly (no mesh)");
  sub->add_option("--model", f->model_dir, "HF model directory")->required();
  auto* prompt = sub->add_option("--prompt", f->prompt, "Prompt text (tokenized with the model's tokenizer.json)");
  sub->add_option("--prompt-ids", f->prompt_ids, "Prompt token ids, comma separated");
  sub->add_option("--max-tokens", f->max_tokens, "Tokens to generate")->capture_default_str();
  sub->add_option("--temperature", f->temperature, "Sampling temperature; 0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--top-p", f->top_p, "Nucleus sampling mass")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--top-k", f->top_k, "Keep the k most likely tokens; 0 = off")->check(CLI::Range(0, 1 << 30));
  sub->add_option("--min-p", f->min_p, "Keep tokens at least this fraction as likely as the most likely; 0 = off")
      ->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--presence-penalty", f->presence_penalty, "Subtracted once from a token already in the output")
      ->check(CLI::Range(-2.0f, 2.0f));
  sub->add_option("--frequency-penalty", f->frequency_penalty, "Subtracted per occurrence of a token in the output")
      ->check(CLI::Range(-2.0f, 2.0f));
  sub->add_option("--repetition-penalty", f->repetition_penalty,
                  "Divides positive (multiplies negative) logits of tokens in the prompt or output; 1 = off")
      ->check(CLI::Range(0.01f, 10.0f));
  sub->add_option("--min-tokens", f->min_tokens, "No end-of-sequence token before this many tokens")
      ->check(CLI::Range(0, 1 << 30));
  auto* seed = sub->add_option("--seed", f->seed, "Sampling seed (random when absent)");
  sub->add_option("--tp", f->tp, "Tensor-parallel ranks")->check(CLI::Range(1, 64))->capture_default_str();
  sub->add_flag("--enable-expert-parallel", f->expert_parallel, "A mixture of experts' ranks run whole experts (vLLM's flag)");
  sub->add_option("--threads", f->threads, "Kernel threads in all; 0 = one per core")->check(CLI::Range(0, 1024));
  sub->add_option("--device", f->device, "cpu, cuda, or auto (CUDA when a GPU is present)")->capture_default_str();
  sub->add_flag("--deterministic", f->deterministic, "CUDA: batch-invariant kernels at every batch size");
  add_quantization_flag(sub, f->quantization);
  add_kv_cache_dtype_flag(sub, f->kv_cache_dtype);
  add_dtype_flag(sub, f->dtype);
  sub->add_option("--lora", f->lora, "A LoRA adapter's directory (PEFT): generate with it (CPU backend)");
  add_lora_dtype_flag(sub, f->lora_dtype);
  sub->add_option("--prefill-chunk", f->prefill_chunk, "Prefill the prompt in chunks of N tokens; 0 = whole");
  sub->add_flag("--print-ids", f->print_ids, "Print the generated token ids on one line");
  sub->add_option("--dump-logits", f->dump_logits, "Write the first generated position's logits (raw float32 LE)");
  commands.emplace_back(sub, [f, seed, prompt] { return run_generate(*f, seed->count() > 0, prompt->count() > 0); });
}

}  // namespace llmesh::cli
