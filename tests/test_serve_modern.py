"""`lmpipe serve` on a modern export, through the official `openai` client: the folder loads
with its own code (trust_remote_code), and the greedy replies, streamed or not, are the native
model's greedy decoding without a cache, token for token, from a prompt longer than the sliding
window; a folder without its code is refused in one line."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from test_kv_cache import full_forward_last
from test_serve import chat_prompt, client, refused

from conftest import TOKENIZER_DIR
from lmpipe.chat import cli
from lmpipe.chat.serve.cli import bind
from lmpipe.chat.template import start_ids
from lmpipe.data.tokenizer import HFTokenizer
from lmpipe.models import build_model
from lmpipe.models.modern.model import ModernGPT, modern_config

uvicorn = pytest.importorskip("uvicorn")

NAME, KEY = "tiny-modern", "sekrit"
SETTINGS = {"attention_window": 128, "document_mask": True, "value_embeddings": 1}


@pytest.fixture(scope="module")
def native() -> ModernGPT:
    torch.manual_seed(0)
    model = build_model(modern_config(n_layer=2, n_head=2, n_embd=32, block_size=256, **SETTINGS))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


@pytest.fixture(scope="module")
def model_dir(native, tmp_path_factory) -> Path:
    from lmpipe.models.modern import write_hf

    folder = tmp_path_factory.mktemp("serve_modern") / "hf"
    write_hf(native, TOKENIZER_DIR, folder, {"run": "m"})
    return folder


@pytest.fixture(scope="module")
def server(model_dir):
    """(base url, engine, (model, tokenizer)) of a server on the export."""
    from lmpipe.chat.serve.app import create_app
    from lmpipe.chat.serve.engine import Engine

    loaded = cli.load(model_dir)
    engine = Engine(*loaded)
    sock = bind("127.0.0.1", 0)
    srv = uvicorn.Server(uvicorn.Config(create_app(engine, NAME, api_key=KEY), log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", engine, loaded
    srv.should_exit = True
    thread.join(10)


def native_greedy(model: ModernGPT, ids: list[int], n: int, eot: int) -> list[int]:
    """The native model's greedy reply: the full forward on all the tokens each step, no cache,
    up to end-of-text (left out) or n tokens."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(full_forward_last(model, torch.tensor([ids + out]))[0, -1].argmax())
            if nxt == eot:
                break
            out.append(nxt)
    return out


def test_the_export_loads_with_its_own_code(server, model_dir):
    model = server[2][0]
    assert type(model).__name__ == "LmpipeModernForCausalLM"
    assert type(model).__module__.startswith("transformers_modules.")


def test_greedy_completion_past_the_window_is_the_native_uncached_decoding(server, native):
    tokenizer = server[2][1]
    tok = HFTokenizer(tokenizer, "t")
    text = "The assistant wrote a long letter, " * 20  # well over the 128-token window
    ids = start_ids(tok) + tok.encode_ordinary(text)  # GPT-2's tokenizer: no <s> of its own
    assert len(ids) > SETTINGS["attention_window"]
    reply = native_greedy(native, ids, 40, tok.eot_token)
    assert len(reply) == 40  # no early end-of-text: every step is compared
    expected = tokenizer.decode(reply)
    ask = dict(model=NAME, prompt=text, max_tokens=40, temperature=0)
    done = client(server, KEY).completions.create(**ask)
    assert done.choices[0].text == expected
    assert done.usage.prompt_tokens == len(ids)
    chunks = list(client(server, KEY).completions.create(stream=True, **ask))
    assert "".join(c.choices[0].text for c in chunks) == expected


def test_greedy_chat_is_the_native_uncached_decoding(server, native):
    tokenizer = server[2][1]
    ids = chat_prompt(server[2], "Hi there")
    eot = HFTokenizer(tokenizer, "t").eot_token
    reply = native_greedy(native, ids, 30, eot)
    assert len(reply) >= 10
    expected = tokenizer.decode(reply).lstrip()
    ask = dict(model=NAME, messages=[{"role": "user", "content": "Hi there"}], max_tokens=30)
    reply = client(server, KEY).chat.completions.create(temperature=0, **ask)
    assert reply.choices[0].message.content == expected
    chunks = list(client(server, KEY).chat.completions.create(temperature=0, stream=True, **ask))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected


def test_a_modern_folder_without_its_code_is_refused_in_one_line(model_dir, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(model_dir, folder)
    (folder / "modeling_lmpipe_modern.py").unlink()
    assert refused(folder) == [
        f"lmpipe serve: {folder} is not a loadable model folder: {folder}: a modern export"
        " without its model code (modeling_lmpipe_modern.py)"
    ]
