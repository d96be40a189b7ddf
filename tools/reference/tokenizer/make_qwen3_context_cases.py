#!/usr/bin/env python3
# Reference renders of the Qwen3 chat template for the paths make_chat_fixtures.mjs does not
# cover (tools, tool calls with string and object arguments, grouped tool results,
# reasoning_content, <think> after the last query, enable_thinking), with Python jinja2 set up
# as transformers' apply_chat_template sets it up. Run by hand (needs python3-jinja2):
#   python3 tools/reference/tokenizer/make_qwen3_context_cases.py
# writes tests/data/chat_templates/qwen3_context_cases.jsonl (tests/model/chat_template_test.cpp).
import json
import os
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
with open(os.path.join(root, "tests/data/tokenizers/qwen3/tokenizer_config.json")) as f:
    src = json.load(f)["chat_template"]
t = env.from_string(src)
weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
cases = {
  "tools_system": dict(messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Weather in Paris?"}], tools=[weather]),
  "tool_round_trip": dict(messages=[
      {"role": "user", "content": "Weather in Paris and Oslo?"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
          {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "content": "18C"}, {"role": "tool", "content": "9C"}], tools=[weather]),
  "reasoning_field_after_last_query": dict(messages=[
      {"role": "user", "content": "Q"},
      {"role": "assistant", "content": "\nA", "reasoning_content": "\nthought\n"}]),
  "think_in_content_last_turn": dict(messages=[
      {"role": "user", "content": "Q"},
      {"role": "assistant", "content": "<think>\nr\n</think>\n\nA"}]),
  "multi_step_tool_response_user": dict(messages=[
      {"role": "user", "content": "Q"},
      {"role": "assistant", "content": "<think>\nr1\n</think>\n\ncalling", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
      {"role": "user", "content": "<tool_response>\nok\n</tool_response>"},
      {"role": "assistant", "content": "<think>\nr2\n</think>\n\ndone"}]),
  "no_think": dict(messages=[{"role": "user", "content": "Hi"}], enable_thinking=False),
  "think_true": dict(messages=[{"role": "user", "content": "Hi"}], enable_thinking=True),
}
with open(os.path.join(root, "tests/data/chat_templates/qwen3_context_cases.jsonl"), "w") as out:
    for name, c in cases.items():
        for agp in (False, True):
            ctx = dict(c, add_generation_prompt=agp, bos_token="<s>", eos_token="</s>")
            out.write(json.dumps({"template": "qwen3_tokenizer_config", "conversation": name, "add_generation_prompt": agp,
                                  "context": ctx, "rendered": t.render(**ctx)}, ensure_ascii=False) + "\n")
print("ok")
