"""The chat side of the Vicuna template (lmpipe.chat.cli, what `lmpipe-chat` and the chat_samples
evaluation run): a prompt token for token the training row's (lmpipe.chat.data), the oldest
exchanges dropped when the conversation outgrows the window, a clear error when the message
alone does not fit, and a reply that ends at end-of-text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TOKENIZER_DIR
from lmpipe.chat import cli
from lmpipe.chat.data import IGNORE, to_row
from lmpipe.data.tokenizer import EOT, EOT_ID, gpt2_encoding

ENC = gpt2_encoding(str(TOKENIZER_DIR))  # tiktoken: not the tokenizer the chat uses
SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant"
    " gives helpful, detailed, and polite answers to the user's questions."
)
HISTORY = [("Who are you?", "I am Vicuna."), ("Where from?", "LMSYS."), ("Why?", "To chat.")]
MESSAGE = "Thanks!"


def by_hand(history: list[tuple[str, str]], message: str) -> list[int]:
    """The prompt written out by hand (FastChat's vicuna_v1.1), tokenized by tiktoken."""
    text = SYSTEM + " " + "".join(f"USER: {h} ASSISTANT: {g}{EOT}" for h, g in history)
    return ENC.encode(text + f"USER: {message} ASSISTANT:", allowed_special={EOT})


@pytest.fixture(scope="module")
def steered(tmp_path_factory):
    """A converted folder (GPT2LMHeadModel + the tokenizer convert writes) whose greedy output
    after a prompt of `n` tokens is " Hello there", end-of-text, " again": blocks that add nothing,
    no token embedding, position embeddings that pick one head row each. Its config names no
    end-of-sequence token: stopping at end-of-text is the chat's own doing."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from lmpipe.models.gpt2.hf import gpt2_tokenizer

    tokenizer = gpt2_tokenizer(TOKENIZER_DIR)
    n = len(by_hand([], "Hi"))
    config = GPT2Config(n_positions=n + 8, n_embd=8, n_layer=1, n_head=1, tie_word_embeddings=False)
    config.bos_token_id = config.eos_token_id = None  # the chat itself must stop at end-of-text
    model = GPT2LMHeadModel(config)
    sequence = [ENC.encode_ordinary(w)[0] for w in (" Hello", " there")] + [EOT_ID]
    sequence += ENC.encode_ordinary(" again")
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if "ln_" in name and name.endswith("weight"):
                p.fill_(1.0)
        for k, token in enumerate(sequence):  # position n - 1 + k predicts sequence[k]
            model.transformer.wpe.weight[n - 1 + k, k] = 10.0
            model.lm_head.weight[token, k] = 1.0
    folder = tmp_path_factory.mktemp("steered") / "hf"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def chat(steered):
    """(model, tokenizer) as lmpipe-chat loads them."""
    return cli.load(steered)


# ---- the same template as training -------------------------------------------------------------


def test_chat_prompt_is_the_training_row_token_for_token(chat):
    """Chat's prompt for turn k is the training row up to that turn's "ASSISTANT:"."""
    _, tokenizer = chat
    turns = [(role, text) for h, g in HISTORY for role, text in (("human", h), ("gpt", g))]
    row = to_row(ENC, turns, seq_len=256)
    last = int(np.flatnonzero(row.targets != IGNORE)[-1])  # its final end-of-text
    tokens = row.inputs[: last + 1].tolist() + [int(row.targets[last])]  # the row's tokens
    for k in range(len(HISTORY)):
        prompt = cli.fit_prompt(tokenizer, HISTORY[:k], HISTORY[k][0], 1024, 0)
        assert prompt == tokens[: len(prompt)], f"turn {k}"
        # what follows in training is the reply the chat is asked for, and the loss counts it
        reply = ENC.encode_ordinary(" " + HISTORY[k][1]) + [EOT_ID]
        assert tokens[len(prompt) : len(prompt) + len(reply)] == reply
        assert (row.targets[len(prompt) - 1 : len(prompt) - 1 + len(reply)] != IGNORE).all()
        assert row.targets[len(prompt) - 2] == IGNORE  # the prompt's last token is not counted
    assert prompt == by_hand(HISTORY[:2], HISTORY[2][0])


# ---- fitting the window ----------------------------------------------------------------------


def test_a_conversation_that_fits_is_sent_whole(chat):
    """With room for the prompt and the reply, every exchange is kept."""
    _, tokenizer = chat
    whole = by_hand(HISTORY, MESSAGE)
    assert cli.fit_prompt(tokenizer, HISTORY, MESSAGE, len(whole) + 10, 10) == whole


@pytest.mark.parametrize("kept", [2, 1, 0])
def test_the_oldest_exchanges_are_dropped_first(chat, kept):
    """A window one token short of the next exchange keeps the newest `kept` exchanges only."""
    _, tokenizer = chat
    reply_tokens = 16
    expected = by_hand(HISTORY[len(HISTORY) - kept :], MESSAGE)  # the system line stays first
    one_more = by_hand(HISTORY[len(HISTORY) - kept - 1 :], MESSAGE)
    for window in (len(expected) + reply_tokens, len(one_more) + reply_tokens - 1):
        assert cli.fit_prompt(tokenizer, HISTORY, MESSAGE, window, reply_tokens) == expected


def test_a_message_longer_than_the_window_is_a_clear_error(chat):
    """The message alone does not fit: its token count and the window are named."""
    _, tokenizer = chat
    message = "Tell me everything. " * 40
    n = len(by_hand([], message))
    with pytest.raises(ValueError) as e:
        cli.fit_prompt(tokenizer, HISTORY, message, 128, 16)
    assert str(e.value) == (
        f"the message takes {n} tokens with the template; the model's window is 128"
    )
    # a message that fits but leaves less than the reply's room is sent (the reply is shorter)
    assert cli.fit_prompt(tokenizer, HISTORY, MESSAGE, len(by_hand([], MESSAGE)) + 1, 16) == (
        by_hand([], MESSAGE)
    )


# ---- the reply ---------------------------------------------------------------------------------


def test_a_reply_ends_at_end_of_text(chat, steered, capsys):
    """Generation stops at end-of-text; neither it nor what would follow is in the reply."""
    model, tokenizer = chat
    assert cli.reply(model, tokenizer, [], "Hi", max_new_tokens=6) == "Hello there"
    # lmpipe-chat streams the reply: nothing after end-of-text is printed either
    assert cli.main([str(steered), "--prompt", "Hi", "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out == "ASSISTANT: Hello there\n"


def test_lmpipe_chat_starts_with_no_warning_and_prints_the_conversation_only(steered):
    """The installed `lmpipe-chat` in a fresh process (transformers imported anew, and through
    it torchao, whose CUDA kernels cannot load on this CPU build of torch): stdout is the reply,
    stderr empty (no library's load warning, no progress bar)."""
    script = Path(sys.executable).parent / "lmpipe-chat"
    proc = subprocess.run(
        [str(script), str(steered), "--prompt", "Hi", "--max-new-tokens", "6"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ASSISTANT: Hello there\n"
    assert proc.stderr == ""
