#!/usr/bin/env python3
# Reference renders of the Gemma 2 and Gemma 3 chat templates (as google/gemma-2-2b-it and
# google/gemma-3-1b-it ship them in tokenizer_config.json) with Python jinja2 set up as
# transformers' apply_chat_template sets it up (trim_blocks, lstrip_blocks, raise_exception).
# Run by hand (needs python3-jinja2):
#   python3 tools/reference/tokenizer/make_gemma_cases.py
# writes tests/data/chat_templates/gemma_cases.jsonl, in cases.jsonl's format
# (tests/model/chat_template_test.cpp).
import json
import os
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

GEMMA2 = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
          "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
          "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")

GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""


def raise_exception(message):
    raise TemplateError(message)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.globals["raise_exception"] = raise_exception

conversations = {
    "single": [{"role": "user", "content": "Hello!"}],
    "padded": [{"role": "user", "content": "  \n Hi there \n\n"}],
    "multi_turn": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": " 4. "},
                   {"role": "user", "content": "And 3+3?"}],
    "system": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"}],
    "system_parts": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                     {"role": "user", "content": [{"type": "text", "text": " Hi "}, {"type": "text", "text": "you"}]}],
    "not_alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "assistant_first": [{"role": "assistant", "content": "a"}],
}
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
with open(os.path.join(root, "tests/data/chat_templates/gemma_cases.jsonl"), "w") as out:
    for name, source in (("gemma2", GEMMA2), ("gemma3", GEMMA3)):
        t = env.from_string(source)
        for conv, messages in conversations.items():
            if name == "gemma2" and conv == "system_parts":
                continue  # Gemma 2 takes string contents only
            for agp in (False, True):
                case = {"template": name, "conversation": conv, "add_generation_prompt": agp, "messages": messages,
                        "source": source}
                try:
                    case["rendered"] = t.render(messages=messages, add_generation_prompt=agp, bos_token="<s>",
                                                eos_token="</s>")
                except TemplateError as e:
                    case["error"] = str(e)
                out.write(json.dumps(case, ensure_ascii=False) + "\n")
print("ok")
