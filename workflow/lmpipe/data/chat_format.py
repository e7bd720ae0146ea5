"""The Vicuna v1.1 conversation template's definition, read by both sides: lmpipe.chat.template
renders training rows and prompts from it, and every export of a chat run (a fine-tuning run,
meta.json's `init`) carries it as its tokenizer's Jinja `chat_template`, so that
`tokenizer.apply_chat_template(messages, add_generation_prompt=True)` gives the ids
lmpipe.chat.template.prompt_ids gives (tests/test_hf_export.py holds them equal). Here, in
data/, because models/ (the exports) may not import chat/; a definition module (it imports no
lmpipe module), so the config check reads it too (`split_problem`)."""

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


# A training row's pieces are encoded one by one (lmpipe.chat.template.encode_exchange), and
# `apply_chat_template` encodes the rendered text whole: the two agree where the pre-tokenizer
# cuts the text where the pieces meet. The end of text is a special token, cut around by any
# tokenizer; the one cut inside plain text is a prompt's end, " ASSISTANT:", before its reply's
# space. Replies opening with a letter, a digit, punctuation, a quote and a line break.
PROMPT_END = SYSTEM + " USER: Hi ASSISTANT:"
REPLY_STARTS = (" Hello", " 42", " (yes)", " 'quoted'", " \n- a list")


def split_problem(pattern: str) -> str | None:
    """Why a byte-level BPE splitting text by `pattern` (lmpipe.data.train_tokenizer's
    `pre_tokenizers.Split`, isolated) would tokenize a chat prompt whole otherwise than the
    training rows were, or None: a piece that runs across a prompt's end into its reply."""
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    cut = len(PROMPT_END)
    for reply in REPLY_STARTS:
        text = PROMPT_END + reply
        for _, (start, end) in split.pre_tokenize_str(text):
            if start < cut < end:  # the piece's text near the cut: "...ASSISTANT: Hello"
                near = text[max(start, cut - 10) : min(end, cut + 10)]
                return f"its split reads {near!r} as one piece, a prompt's end with its reply"
    return None
