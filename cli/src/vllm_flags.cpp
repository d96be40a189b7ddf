#include "vllm_flags.hpp"

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "llmesh/gateway/embeddings_api.hpp"
#include "llmesh/model/gguf.hpp"

namespace llmesh::cli {

namespace {

using json = nlohmann::json;

/// A YAML node as JSON (a JSON-valued flag written as a YAML map: --speculative-config).
json to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    json o = json::object();
    for (const auto& kv : n) o[kv.first.as<std::string>()] = to_json(kv.second);
    return o;
  }
  if (n.IsSequence()) {
    json a = json::array();
    for (const auto& e : n) a.push_back(to_json(e));
    return a;
  }
  if (n.IsNull()) return nullptr;
  const std::string v = n.as<std::string>();
  if (n.Tag() != "!") {  // plain scalars: numbers and booleans as such
    json parsed = json::parse(v, nullptr, false);
    if (!parsed.is_discarded() && (parsed.is_number() || parsed.is_boolean())) return parsed;
    if (v == "True" || v == "true") return true;
    if (v == "False" || v == "false") return false;
  }
  return v;
}

bool one_of(const std::string& v, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (v == n) return true;
  }
  return false;
}

result<std::vector<std::string>> expand_yaml(const std::string& file, const YAML::Node& root, std::vector<std::string> rest) {
  if (!root.IsMap() && !root.IsNull()) return make_error(errc::invalid_request, "--config " + file + ": not a map of flag: value");
  // The command line's own flags win: a key it names (exactly) is skipped; under another name of
  // the same flag the command line's value comes later, and the last value wins.
  auto given = [&](const std::string& flag) {
    return std::any_of(rest.begin(), rest.end(), [&](const std::string& a) { return a == flag || a.rfind(flag + "=", 0) == 0; });
  };
  // `serve MODEL --config F`: the command line's model (vLLM's positional) wins over the file's.
  const bool model_given = rest.size() > 1 && !rest[1].empty() && rest[1][0] != '-';
  std::vector<std::string> out;
  if (!rest.empty()) out.push_back(rest.front());  // the command's name
  for (const auto& kv : root) {
    std::string name = kv.first.as<std::string>();
    std::replace(name.begin(), name.end(), '_', '-');
    const std::string flag = "--" + name;
    if (given(flag) || (name == "model" && model_given)) continue;
    const YAML::Node& v = kv.second;
    if (v.IsSequence()) {
      for (const auto& e : v) out.push_back(flag + "=" + (e.IsScalar() ? e.as<std::string>() : to_json(e).dump()));
    } else if (v.IsMap()) {
      out.push_back(flag + "=" + to_json(v).dump());
    } else if (v.IsScalar()) {
      // An empty value is the flag left at its default ("--flag=" would take the next argument).
      if (!v.as<std::string>().empty()) out.push_back(flag + "=" + v.as<std::string>());
    } else {
      return make_error(errc::invalid_request, "--config " + file + ": '" + name + "' has no value");
    }
  }
  out.insert(out.end(), rest.begin() + (rest.empty() ? 0 : 1), rest.end());
  return out;
}

}  // namespace

result<std::vector<std::string>> expand_config_file(std::vector<std::string> args) {
  std::string file;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config" && i + 1 < args.size()) {
      file = args[++i];
    } else if (args[i].rfind("--config=", 0) == 0) {
      file = args[i].substr(9);
    } else {
      rest.push_back(args[i]);
    }
  }
  const bool help = std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "--help" || a == "-h"; });
  if (file.empty() || help) return args;  // --help: the help, whatever the file holds
  try {
    return expand_yaml(file, YAML::LoadFile(file), std::move(rest));
  } catch (const YAML::BadFile&) {
    return make_error(errc::invalid_request, "--config " + file + ": cannot read it");
  } catch (const YAML::Exception& e) {
    return make_error(errc::invalid_request, "--config " + file + ": not YAML of flag: value: " + e.what());
  }
}

void add_vllm_model_flags(CLI::App* sub, vllm_model_flags& f) {
  // Read by expand_config_file before parsing; here for --help.
  sub->add_option_function<std::string>("--config", [](const std::string&) {},
                                        "vLLM's: a YAML file of flags (flag-name: value); the command line wins over it");
  sub->add_option("--tokenizer", f.tokenizer, "vLLM's: the directory the tokenizer and chat template come from (default: the model's)");
  sub->add_option("--tokenizer-mode", f.tokenizer_mode, "vLLM's: auto or slow (one tokenizer, HF's ids either way); mistral is refused")
      ->capture_default_str();
  sub->add_option("--load-format", f.load_format, "vLLM's: auto, safetensors or gguf (as the model path is)")->capture_default_str();
  sub->add_option("--task", f.task,
                  "vLLM's: auto, generate, embed, classify, score or reward (the model's architecture decides: a causal LM "
                  "serves generation and embeddings, a …ForSequenceClassification one classification and scoring, a "
                  "Qwen2ForRewardModel or Qwen2ForProcessRewardModel rewards)")
      ->capture_default_str();
  sub->add_option("--runner", f.runner, "vLLM's: auto, generate or pooling (as --task)")->capture_default_str();
  sub->add_option("--convert", f.convert,
                  "vLLM's: auto, none, embed, classify or reward (a causal LM becomes a classifier through --hf-overrides' "
                  "architectures and classifier_from_token; reward: the model must be a reward model)")
      ->capture_default_str();
  sub->add_option("--pooler-config,--override-pooler-config", f.pooler_config,
                  "vLLM's: a JSON object of pooling_type (LAST, MEAN or CLS, as --pooling), normalize and use_activation: "
                  "what an embedding or classify request that does not say gets");
  sub->add_flag("--calculate-kv-scales", f.calculate_kv_scales,
                "vLLM's; refused: KV-cache scales from a replica's first batch would differ between replicas (a checkpoint's "
                "calibrated k_scale / v_scale are used with --kv-cache-dtype fp8)");
  sub->add_option("--pipeline-parallel-size,--pp", f.pipeline_parallel_size, "vLLM's: 1 (tensor parallelism splits the model here)")
      ->capture_default_str();
  sub->add_option("--distributed-executor-backend", f.distributed_executor_backend,
                  "vLLM's: mp, uni, ray or external_launcher; accepted: shards run as actors of this process (a mesh "
                  "of nodes spans machines: llmesh node)")
      ->check(CLI::IsMember({"mp", "uni", "ray", "external_launcher"}))
      ->capture_default_str();
  sub->add_option("--override-generation-config", f.override_generation_config,
                  "vLLM's: JSON sampling defaults over the generation config's: temperature, top_p, top_k");
  sub->add_option("--hf-overrides", f.hf_overrides,
                  "vLLM's: JSON over the model's config.json, e.g. {\"max_position_embeddings\": 4096} or a "
                  "rope_scaling; null removes a key, an object for a *_config updates it key by key");
  sub->add_option("--rope-scaling", f.rope_scaling,
                  "vLLM's: JSON, the model's rope_scaling replaced, e.g. Qwen's long context: "
                  "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768} "
                  "(linear, llama3, yarn, longrope, dynamic)");
  sub->add_option("--rope-theta", f.rope_theta, "vLLM's: the rotary base, replacing the model's rope_theta");
  sub->add_option("--speculative-config", f.speculative_config,
                  "vLLM's: JSON, prompt-lookup speculation: {\"method\": \"ngram\", \"num_speculative_tokens\": K, "
                  "\"prompt_lookup_max\": N, \"prompt_lookup_min\": M}, or a draft model of the same tokenizer: "
                  "{\"model\": DIR, \"num_speculative_tokens\": K}");
  const std::pair<const char*, const char*> valued[] = {
      {"--download-dir", "vLLM's; accepted: the model is a local path, nothing is downloaded"},
      {"--revision", "vLLM's; accepted: the model is a local path, nothing is downloaded"},
      {"--code-revision", "vLLM's; accepted: the model is a local path, and no code runs from it"},
      {"--tokenizer-revision", "vLLM's; accepted: the tokenizer is a local path, nothing is downloaded"},
      {"--swap-space", "vLLM's; accepted: a preempted sequence is recomputed from its tokens, not swapped"},
      {"--max-seq-len-to-capture", "vLLM's; accepted: CUDA graphs cover decode steps at any context length"},
      {"--guided-decoding-backend", "vLLM's; accepted: structured outputs use this server's own grammar engine"},
      {"--structured-outputs-config", "vLLM's; accepted: structured outputs use this server's own grammar engine"},
      {"--max-parallel-loading-workers", "vLLM's; accepted: weights are memory-mapped, then converted on every core"},
      {"--compilation-config", "vLLM's; accepted: kernels are compiled ahead of time (CUDA graphs: --enforce-eager)"},
      {"--prefix-caching-hash-algo", "vLLM's; accepted: cached prefixes are matched on their tokens"}};
  for (const auto& [flag, text] : valued) sub->add_option_function<std::string>(flag, [](const std::string&) {}, text);
  sub->add_option_function<std::string>("--hf-token", [](const std::string&) {}, "vLLM's; accepted: nothing is downloaded")
      ->expected(0, 1);
  const std::pair<const char*, const char*> flags[] = {
      {"--disable-custom-all-reduce", "vLLM's; accepted: tensor-parallel shards all-reduce with NCCL (CUDA) or shared memory"},
      {"--disable-frontend-multiprocessing", "vLLM's; accepted: the API and the engines share this process"},
      {"--async-scheduling", "vLLM's; accepted: replicas schedule their next step while the gateway streams"}};
  for (const auto& [flag, text] : flags) sub->add_flag_function(flag, [](int64_t) {}, text);
}

status check_vllm_task(const vllm_model_flags& f, const model::model_config& c) {
  const bool reward = f.task == "reward" || f.convert == "reward";
  if (c.classifier.reward) {
    if (one_of(f.task, {"generate", "embed", "embedding", "score"}) || f.runner == "generate" || f.convert == "embed") {
      return make_error(errc::invalid_request, "--task/--runner/--convert: the model is a reward model (" + c.arch_name +
                                                   "): it serves reward (/pooling's token_classify) and classify (/classify)");
    }
    return ok_status();
  }
  if (reward) {
    return make_error(errc::invalid_request, "--task/--convert reward: the model (" + c.arch_name +
                                                 ") is not a reward model (Qwen2ForRewardModel, Qwen2ForProcessRewardModel); a "
                                                 "…ForSequenceClassification one serves /pooling's token_classify too");
  }
  if (c.classifier.labels > 0) {
    if (one_of(f.task, {"generate", "embed", "embedding"}) || f.runner == "generate" || f.convert == "embed") {
      return make_error(errc::invalid_request, "--task/--runner/--convert: the model is a sequence classifier (" + c.arch_name +
                                                   "): it serves classify and score (/classify, /score, /rerank, /pooling)");
    }
    return ok_status();
  }
  if (f.task == "classify" || f.convert == "classify") {
    return make_error(errc::invalid_request,
                      "--task/--convert classify: the model (" + c.arch_name +
                          ") is not a sequence classifier; a …ForSequenceClassification checkpoint is, or a causal LM given "
                          "--hf-overrides '{\"architectures\": [\"<Arch>ForSequenceClassification\"], \"classifier_from_token\": "
                          "[...], \"method\": \"from_2_way_softmax\"}'");
  }
  return ok_status();
}

result<std::string> effective_hf_overrides(const vllm_model_flags& f) {
  if (!f.hf_overrides.empty()) {
    if (auto o = model::apply_hf_overrides("{}", f.hf_overrides); !o) return o.take_error();
  }
  if (f.rope_scaling.empty() && f.rope_theta.empty()) return f.hf_overrides;
  nlohmann::json j = f.hf_overrides.empty() ? nlohmann::json::object() : nlohmann::json::parse(f.hf_overrides);
  if (!f.rope_scaling.empty()) {
    auto r = nlohmann::json::parse(f.rope_scaling, nullptr, false);
    if (r.is_discarded() || !r.is_object()) {
      return make_error(errc::invalid_request, "--rope-scaling must be a JSON object, e.g. '{\"rope_type\": \"yarn\", "
                                               "\"factor\": 4.0, \"original_max_position_embeddings\": 32768}'");
    }
    j["rope_scaling"] = std::move(r);
  }
  if (!f.rope_theta.empty()) {
    char* end = nullptr;
    const double theta = std::strtod(f.rope_theta.c_str(), &end);
    if (end == f.rope_theta.c_str() || *end != '\0' || !(theta > 0.0) || !std::isfinite(theta)) {
      return make_error(errc::invalid_request, "--rope-theta must be a positive number, not '" + f.rope_theta + "'");
    }
    j["rope_theta"] = theta;
  }
  std::string merged = j.dump();
  if (auto o = model::apply_hf_overrides("{}", merged); !o) {  // e.g. nested too deep: name the flag given
    std::string m = o.err().message;
    if (m.rfind("--hf-overrides", 0) == 0) m.replace(0, 14, "--rope-scaling");
    return make_error(o.err().code, m);
  }
  return merged;
}

status check_vllm_model_flags(const vllm_model_flags& f, const std::string& model_path) {
  if (!one_of(f.tokenizer_mode, {"auto", "slow", "hf"})) {
    return make_error(errc::unsupported, "--tokenizer-mode " + f.tokenizer_mode +
                                             ": this server reads Hugging Face tokenizers (auto); mistral and custom are not taken");
  }
  if (auto o = effective_hf_overrides(f); !o) return o.take_error();
  LLMESH_TRY(gateway::parse_pooler_config(f.pooler_config));
  const bool gguf = model::is_gguf_file(model_path);
  if (!one_of(f.load_format, {"auto", "safetensors", "gguf"})) {
    return make_error(errc::unsupported, "--load-format " + f.load_format + ": this server loads safetensors and GGUF (auto)");
  }
  if ((f.load_format == "gguf" && !gguf) || (f.load_format == "safetensors" && gguf)) {
    return make_error(errc::invalid_request, "--load-format " + f.load_format + ": " + model_path + " is " +
                                                 (gguf ? "a GGUF file" : "not a GGUF file"));
  }
  if (!one_of(f.task, {"auto", "generate", "embed", "embedding", "classify", "score", "reward"}) ||
      !one_of(f.runner, {"auto", "generate", "pooling"}) || !one_of(f.convert, {"auto", "none", "embed", "classify", "reward"})) {
    return make_error(errc::unsupported, "--task/--runner/--convert: a causal LM serves generation and embeddings "
                                         "(/v1/embeddings, /score, /rerank over them), a sequence classifier /classify, "
                                         "/score and /rerank, a Qwen2 reward model reward (/pooling)");
  }
  if (f.pipeline_parallel_size != 1) {
    return make_error(errc::unsupported, "--pipeline-parallel-size " + std::to_string(f.pipeline_parallel_size) +
                                             ": no pipeline parallelism here; split the model with --tensor-parallel-size");
  }
  if (f.calculate_kv_scales) {
    return make_error(errc::unsupported,
                      "--calculate-kv-scales: not supported: scales computed from each replica's first batch would differ "
                      "between replicas, and a request moved to another one would not continue with the same numbers; "
                      "--kv-cache-dtype fp8 uses an FP8 checkpoint's calibrated k_scale / v_scale, else 1");
  }
  return ok_status();
}

}  // namespace llmesh::cli
