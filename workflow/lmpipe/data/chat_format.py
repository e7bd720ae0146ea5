"""The Vicuna v1.1 conversation template's definition, read by both sides: lmpipe.chat.template
renders training rows and prompts from it, and every export of a chat run (a fine-tuning run,
meta.json's `init`) carries it as its tokenizer's Jinja `chat_template`, so that
`tokenizer.apply_chat_template(messages, add_generation_prompt=True)` gives the ids
lmpipe.chat.template.prompt_ids gives (tests/test_hf_export.py holds them equal). Here, in
data/, because models/ (the exports) may not import chat/."""

from __future__ import annotations

import json
from typing import Any

# FastChat's vicuna_v1.1 system line
SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)

# <s> where the tokenizer's own bos is not its eos (lmpipe.data.tokenizer.bos_id), the system
# line (a leading system message's, else SYSTEM) and a space, then "USER: {m}" and, for each
# reply, " ASSISTANT: {reply}</s>"; a prompt ends with " ASSISTANT:" (add_generation_prompt)
CHAT_TEMPLATE = (
    "{%- if bos_token and bos_token != eos_token %}{{ bos_token }}{% endif %}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}{%- set turns = messages[1:] %}"
    "{%- else %}"
    "{%- set system = " + json.dumps(SYSTEM) + " %}{%- set turns = messages %}"
    "{%- endif %}"
    "{{- system + ' ' }}"
    "{%- for m in turns %}"
    "{%- if m['role'] == 'user' %}{{- 'USER: ' + m['content'] }}"
    "{%- elif m['role'] == 'assistant' %}{{- ' ASSISTANT: ' + m['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('Vicuna v1.1: roles are system (first), user, assistant') }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- ' ASSISTANT:' }}{% endif %}"
)


def add_chat_template(tokenizer: Any, meta: dict) -> None:
    """Set the template on an export's tokenizer where the run is a chat run (a fine-tuning
    run: its meta.json names the base it started from, `init`); a base's tokenizer is left as
    it is."""
    if meta.get("init"):
        tokenizer.chat_template = CHAT_TEMPLATE
