// `llmesh model random`: writes a deterministic random model in the HF layout;
// `llmesh model random-lora`: a deterministic random LoRA adapter for one (PEFT's layout).
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "llmesh/model/random_model.hpp"
#include "llmesh/model/lora.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::cli {
namespace {

struct model_flags {
  model::random_model_spec spec;
  std::string out, dtype = "f32", rope_scaling;
};

status run_random(model_flags& f) {
  if (f.dtype == "f32") {
    f.spec.dtype = kernels::dtype::f32;
  } else if (f.dtype == "f16") {
    f.spec.dtype = kernels::dtype::f16;
  } else if (f.dtype == "bf16") {
    f.spec.dtype = kernels::dtype::bf16;
  } else {
    return make_error(errc::invalid_request, "--dtype must be f32, f16 or bf16, not '" + f.dtype + "'");
  }
  if (!f.rope_scaling.empty() && f.rope_scaling != "llama3" && f.rope_scaling != "linear" && f.rope_scaling != "yarn" &&
      f.rope_scaling != "longrope" && f.rope_scaling != "dynamic") {
    return make_error(errc::invalid_request, "--rope-scaling must be llama3, linear, yarn, longrope or dynamic");
  }
  f.spec.llama3_scaling = f.rope_scaling == "llama3";
  f.spec.linear_scaling = f.rope_scaling == "linear";
  f.spec.yarn_scaling = f.rope_scaling == "yarn";
  f.spec.longrope_scaling = f.rope_scaling == "longrope";
  f.spec.dynamic_scaling = f.rope_scaling == "dynamic";
  LLMESH_TRY(model::write_random_model(f.spec, f.out));
  auto check = model::model::load(f.out);  // what we write must load
  if (!check) return check.take_error();
  std::fprintf(stderr, "wrote %s: %zu layers, hidden %zu, vocab %zu, %s, %.1f MB of weights\n", f.out.c_str(),
               f.spec.n_layers, f.spec.hidden, f.spec.vocab, f.dtype.c_str(),
               static_cast<double>((*check)->weight_bytes()) / 1e6);
  return ok_status();
}

struct lora_flags {
  model::random_lora_spec spec;
  std::string model_dir, out, dtype = "f32";
};

status run_random_lora(lora_flags& f) {
  if (f.dtype == "f32" || f.dtype == "f16" || f.dtype == "bf16") {
    f.spec.dtype = f.dtype == "f32" ? kernels::dtype::f32 : f.dtype == "f16" ? kernels::dtype::f16 : kernels::dtype::bf16;
  } else {
    return make_error(errc::invalid_request, "--dtype must be f32, f16 or bf16, not '" + f.dtype + "'");
  }
  LLMESH_TRY(model::write_random_lora(f.spec, f.model_dir, f.out));
  auto cfg = model::load_config(f.model_dir);
  if (!cfg) return cfg.take_error();
  auto check = model::load_lora({"check", f.out}, *cfg);  // what we write must load
  if (!check) return check.take_error();
  std::fprintf(stderr, "wrote %s: rank %zu, %zu target(s), %.2f MB as held in memory\n", f.out.c_str(), f.spec.rank,
               f.spec.targets.size(), static_cast<double>(check->bytes()) / 1e6);
  return ok_status();
}

}  // namespace

void add_model(CLI::App& app, command_set& commands) {
  auto* model_cmd = app.add_subcommand("model", "Model utilities");
  model_cmd->require_subcommand(1);
  auto f = std::make_shared<model_flags>();
  auto& s = f->spec;
  auto* sub = model_cmd->add_subcommand("random", "Write a deterministic random model (HF directory)");
  sub->add_option("--out", f->out, "Output directory")->required();
  sub->add_option("--arch", s.arch, "llama | mistral | qwen2 | qwen3 | phi3 | qwen3_moe | mixtral | qwen2_moe | gemma | gemma2 | gemma3 | granite | gpt_oss | smollm3 | ministral3")
      ->capture_default_str();
  sub->add_option("--hidden", s.hidden, "hidden_size")->capture_default_str();
  sub->add_option("--intermediate", s.intermediate, "intermediate_size")->capture_default_str();
  sub->add_option("--layers", s.n_layers, "num_hidden_layers")->capture_default_str();
  sub->add_option("--heads", s.n_heads, "num_attention_heads")->capture_default_str();
  sub->add_option("--kv-heads", s.n_kv_heads, "num_key_value_heads")->capture_default_str();
  sub->add_option("--head-dim", s.head_dim, "head_dim; 0 = hidden / heads")->capture_default_str();
  sub->add_option("--vocab", s.vocab, "vocab_size (>= 258)")->capture_default_str();
  sub->add_option("--max-positions", s.max_positions, "max_position_embeddings")->capture_default_str();
  sub->add_option("--dtype", f->dtype, "f32 | f16 | bf16")->capture_default_str();
  sub->add_flag("--tie", s.tie_embeddings, "tie_word_embeddings");
  sub->add_flag("--attention-bias", s.attention_bias, "Llama attention_bias (q/k/v/o biases)");
  sub->add_option("--rope-theta", s.rope_theta, "rope_theta")->capture_default_str();
  sub->add_option("--rope-scaling", f->rope_scaling,
                  "llama3 or linear (factor 8), yarn (factor 4, original context 256), longrope (Phi-3.5's layout, "
                  "original context 64) or dynamic (NTK, factor 4) to write that rope_scaling block");
  sub->add_option("--partial-rotary", s.partial_rotary, "partial_rotary_factor: the part of each head that rotates (0, 1]")
      ->capture_default_str();
  sub->add_option("--sliding-window", s.sliding_window, "Mistral, Phi-3, Mixtral, Gemma 2/3, GPT-OSS (its even layers) or SmolLM3 (its NoPE layers) sliding_window; 0 = none");
  sub->add_option("--attn-softcap", s.attn_softcap, "gemma2/gemma3 attn_logit_softcapping (0 = none; default 50 / none)");
  sub->add_option("--final-softcap", s.final_softcap, "gemma2/gemma3 final_logit_softcapping (0 = none; default 30 / none)");
  sub->add_option("--query-pre-attn-scalar", s.query_pre_attn_scalar, "gemma2/gemma3 query_pre_attn_scalar (0: head dim)");
  sub->add_option("--sliding-pattern", s.sliding_pattern, "gemma3 sliding_window_pattern (0: 6)");
  sub->add_option("--experts", s.n_experts, "qwen3_moe, mixtral, qwen2_moe, gpt_oss: experts per layer (0: 8)");
  sub->add_option("--experts-per-token", s.experts_per_token, "qwen3_moe, mixtral, qwen2_moe, gpt_oss: experts each token runs (0: 2)");
  sub->add_option("--shared-intermediate", s.shared_intermediate, "qwen2_moe: the shared expert's size (0: 2 x intermediate)");
  sub->add_option("--rms-norm-eps", s.rms_norm_eps, "rms_norm_eps")->capture_default_str();
  sub->add_option("--seed", s.seed, "Seed of the weights")->capture_default_str();
  sub->add_option("--shards", s.shards, "Number of safetensors files")->capture_default_str();
  sub->add_flag("--base", s.base_model,
                "A bare transformer as embedding models ship (<Arch>Model, no model. prefix, no lm_head)");
  sub->add_option("--packed", s.packed,
                  "The layers' projections as an AWQ, GPTQ or compressed-tensors checkpoint stores them: awq, gptq, "
                  "gptq-act-order, gptq8, ct-w4a16, ct-w4a16-asym, ct-w8a16; or as an FP8 checkpoint: fp8, fp8-block, ct-fp8, "
                  "ct-fp8-block, ct-fp8-group; with --arch gpt_oss: mxfp4 (the experts as OpenAI's release holds them)");
  sub->add_flag("--kv-scales", s.kv_scales,
                "With an FP8 or compressed-tensors --packed: each layer's FP8 KV-cache scales (self_attn.k_scale, v_scale; "
                "compressed-tensors' kv_cache_scheme), as a checkpoint calibrated for --kv-cache-dtype fp8 holds them");
  sub->add_option("--group-size", s.group_size, "--packed: inputs per scale and zero (FP8 blocks: rows and columns per scale)")->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1} << 20));
  sub->add_option("--classifier", s.classifier_labels,
                  "A sequence classifier of N labels (<Arch>ForSequenceClassification, score.weight in place of lm_head)");
  sub->add_flag("--reward", s.reward,
                "With --arch qwen2 --classifier 1 or 2: a reward model, Qwen2ForRewardModel or Qwen2ForProcessRewardModel "
                "(score.0 and score.2 with biases in place of lm_head)");
  commands.emplace_back(sub, [f] { return run_random(*f); });

  auto l = std::make_shared<lora_flags>();
  auto* lsub = model_cmd->add_subcommand("random-lora", "Write a deterministic random LoRA adapter (PEFT directory) for a model");
  lsub->add_option("--model", l->model_dir, "The base model's directory (its config.json gives the shapes)")->required();
  lsub->add_option("--out", l->out, "Output directory")->required();
  lsub->add_option("--rank", l->spec.rank, "r")->capture_default_str();
  lsub->add_option("--alpha", l->spec.alpha, "lora_alpha")->capture_default_str();
  lsub->add_flag("--rslora", l->spec.rslora, "use_rslora (scale alpha / sqrt(r))");
  lsub->add_option("--targets", l->spec.targets, "Comma-separated projections")->delimiter(',')->capture_default_str();
  lsub->add_option("--dtype", l->dtype, "f32 | f16 | bf16")->capture_default_str();
  lsub->add_option("--seed", l->spec.seed, "Seed of the weights")->capture_default_str();
  lsub->add_option("--strength", l->spec.strength, "Size of the change relative to the base projections (1: large)")
      ->capture_default_str();
  commands.emplace_back(lsub, [l] { return run_random_lora(*l); });
}

}  // namespace llmesh::cli
