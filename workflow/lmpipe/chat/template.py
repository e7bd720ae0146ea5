"""FastChat's Vicuna v1.1 conversation template, on the tokenizer's own special tokens.

    <s>{system} USER: {human} ASSISTANT: {gpt}</s>USER: {human} ASSISTANT: {gpt}</s>

(lm-sys/FastChat fastchat/conversation.py, `SeparatorStyle.ADD_COLON_TWO`, sep=" ", sep2="</s>").
`</s>` is the tokenizer's end of text (GPT-2's `<|endoftext|>`, a Llama's `</s>`), `<s>` its
beginning of sequence where it has one of its own (lmpipe.data.tokenizer.bos_id: GPT-2 has
none). The loss mask is FastChat's (lm-sys/FastChat fastchat/train/train.py, `preprocess`): the
leading <s>, the system line, each "USER: ... ASSISTANT:" never count; each reply and the </s>
closing it do. FastChat tokenizes the whole text and finds the instruction lengths by
re-tokenizing each part (with a hard-coded offset for LLaMA's tokenizer); the pieces here are
tokenized one by one instead, so the mask is exact by construction. Training rows
(lmpipe.chat.data) and the prompts a chat sends (lmpipe.chat.cli, lmpipe.chat.evals) are both
rendered here, so a model is asked in exactly the form it was taught; every chat run's export
carries the same template as its tokenizer's `chat_template`
(lmpipe.data.chat_format.CHAT_TEMPLATE), so transformers' `apply_chat_template` asks it in that
form too. With GPT-2's BPE the space
after "ASSISTANT:" belongs to the reply's first token (" I"), so a prompt ends with "ASSISTANT:"
exactly as FastChat's does.
"""

from __future__ import annotations

from typing import Any

from lmpipe.data.chat_format import SYSTEM
from lmpipe.data.tokenizer import EOT, Tokenizer, bos_id

# FastChat's vicuna_v1.1 template; its system line and its Jinja form (the exports' tokenizers'
# chat_template) are defined in lmpipe.data.chat_format
ROLES = {"human": "USER", "gpt": "ASSISTANT"}
TEMPLATES = ("vicuna_v1.1",)


class MalformedConversation(ValueError):
    """A conversation that is not human/gpt turns in order; the message names its id."""


# ----------------------------------------------------------------------------------------------
# the template


def check_conversation(record: Any, index: int) -> tuple[str, list[tuple[str, str]]]:
    """(id, [(role, text), ...]) of one ShareGPT record, or MalformedConversation naming it."""
    if not isinstance(record, dict):
        raise MalformedConversation(f"conversation #{index}: not an object")
    cid = str(record.get("id", f"#{index}"))
    turns = record.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise MalformedConversation(f"conversation {cid!r}: no turns")
    out = []
    for i, turn in enumerate(turns):
        role = turn.get("from") if isinstance(turn, dict) else None
        text = turn.get("value") if isinstance(turn, dict) else None
        if role not in ROLES:
            raise MalformedConversation(f"conversation {cid!r}, turn {i}: unknown role {role!r}")
        expected = "human" if i % 2 == 0 else "gpt"
        if role != expected:
            raise MalformedConversation(
                f"conversation {cid!r}, turn {i}: {role!r} where {expected!r} was expected"
                " (turns must alternate human, gpt, starting with human)"
            )
        if not isinstance(text, str) or not text.strip():
            raise MalformedConversation(f"conversation {cid!r}, turn {i}: empty message")
        out.append((role, text))
    if out[-1][0] != "gpt":
        raise MalformedConversation(f"conversation {cid!r}: ends with a human turn, no reply")
    return cid, out


def segments(turns: list[tuple[str, str]], system: str = SYSTEM) -> list[list[tuple[str, bool]]]:
    """The rendered text, one list a human/gpt exchange, as (text, counts in the loss) pieces.

    The first exchange starts with the system line; EOT pieces stand for the end-of-text token.
    """
    exchanges = []
    for i in range(0, len(turns), 2):
        prompt = (system + " " if i == 0 else "") + f"USER: {turns[i][1]} ASSISTANT:"
        exchanges.append([(prompt, False), (" " + turns[i + 1][1], True), (EOT, True)])
    return exchanges


def render(turns: list[tuple[str, str]]) -> str:
    """The whole conversation as text (end-of-text written as `<|endoftext|>`)."""
    return "".join(text for ex in segments(turns) for text, _ in ex)


def prompt_ids(
    tok: Tokenizer, history: list[tuple[str, str]], message: str, system: str = SYSTEM
) -> list[int]:
    """Token ids of the prompt a model continues to answer `message` after `history` (human,
    gpt pairs): <s> where the tokenizer has one, the rendered conversation so far, then
    "USER: {message} ASSISTANT:" (the system line first when there is no history: the template's
    own unless a client sends another). End-of-text is its token, never its text."""
    turns = [t for pair in history for t in (("human", pair[0]), ("gpt", pair[1]))]
    exchanges = segments(turns, system)
    ids = start_ids(tok) + [i for ex in exchanges for i in encode_exchange(tok, ex)[0]]
    prompt = (system + " " if not history else "") + f"USER: {message} ASSISTANT:"
    return ids + tok.encode_ordinary(prompt)


def start_ids(tok: Tokenizer) -> list[int]:
    """What a conversation starts with: [<s>] where the tokenizer has its own, else nothing."""
    bos = bos_id(tok)
    return [] if bos is None else [bos]


def check_template(tok: Tokenizer, where: str) -> None:
    """The template's fixed text must come back from the tokenizer as it went in (no unknown
    pieces, no normalisation): else the tokenizer cannot express it; `where` names it."""
    text = SYSTEM + " USER: Hi ASSISTANT: Hello"
    back = tok.decode(tok.encode_ordinary(text))
    if back != text:
        raise ValueError(
            f"{where}: the tokenizer cannot express the Vicuna template: {text!r} decodes back as"
            f" {back!r}"
        )


def encode_exchange(
    tok: Tokenizer, exchange: list[tuple[str, bool]]
) -> tuple[list[int], list[bool]]:
    """Tokens of one exchange and whether each counts in the loss.

    Pieces are encoded one by one: each boundary (before " reply", around end-of-text) is also a
    boundary of GPT-2's pre-tokenizer, so this equals encoding the rendered text whole.
    """
    ids: list[int] = []
    counts: list[bool] = []
    for text, counted in exchange:
        piece = [tok.eot_token] if text == EOT else tok.encode_ordinary(text)
        ids += piece
        counts += [counted] * len(piece)
    return ids, counts
