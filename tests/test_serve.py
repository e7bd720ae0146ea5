"""`lmpipe serve` (lmpipe.chat.serve) on a tiny random Llama, through the official `openai`
client: the greedy reply is the model's own `generate`, token for token, streamed or not; two
clients are both answered; a client that leaves stops its generation; every error is OpenAI's
JSON shape; the chat page streams a reply in headless Chromium.

The server runs in a thread of the test process (uvicorn on a free port), so a test can read the
engine's token count and slow the model down (a forward hook that sleeps)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from hf_models import make_model

from conftest import REPO
from lmpipe.chat import cli
from lmpipe.chat.serve.cli import bind, lmpipe, model_name_of
from lmpipe.chat.template import prompt_ids
from lmpipe.data.tokenizer import HFTokenizer

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

NAME, KEY = "tiny-chat", "sekrit"
PROMPT_CAP, TOKENS_CAP = 64, 300
DELAY = {"s": 0.0}  # seconds each forward pass of the model sleeps


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model("llama", tmp_path_factory.mktemp("serve") / "model")


@pytest.fixture(scope="module")
def loaded(model_dir):
    model, tokenizer = cli.load(model_dir)
    model.register_forward_hook(lambda *_: time.sleep(DELAY["s"]) if DELAY["s"] else None)
    return model, tokenizer


@pytest.fixture(scope="module")
def server(loaded):
    """(base url, engine) of a server with a key, a 64-token prompt cap and a queue of one."""
    from lmpipe.chat.serve.app import create_app
    from lmpipe.chat.serve.engine import Engine

    engine = Engine(*loaded, max_queue=1)
    app = create_app(
        engine, NAME, api_key=KEY, max_prompt_tokens=PROMPT_CAP, max_tokens_cap=TOKENS_CAP
    )
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", engine
    srv.should_exit = True
    thread.join(10)


@pytest.fixture(autouse=True)
def fast_model():
    DELAY["s"] = 0.0
    yield
    DELAY["s"] = 0.0


def client(server, key: str = KEY):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=key, max_retries=0, timeout=30)


def greedy(loaded, ids: list[int], n: int) -> list[int]:
    """The model's own greedy continuation of `ids`, ending before end-of-text."""
    model, tokenizer = loaded
    eot = HFTokenizer(tokenizer, "t").eot_token
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eot,
            pad_token_id=eot,
        )[0, len(ids):].tolist()  # fmt: skip
    return out[: out.index(eot)] if eot in out else out


def chat_prompt(loaded, message: str) -> list[int]:
    return prompt_ids(HFTokenizer(loaded[1], "t"), [], message)


def test_models_lists_the_one_model(server):
    assert [m.id for m in client(server).models.list().data] == [NAME]


def test_greedy_chat_is_the_model_s_generate_streamed_or_not(server, loaded):
    expected = loaded[1].decode(greedy(loaded, chat_prompt(loaded, "Hi there"), 12)).lstrip()
    ask = dict(model=NAME, messages=[{"role": "user", "content": "Hi there"}], max_tokens=12)
    reply = client(server).chat.completions.create(temperature=0, **ask)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens == len(chat_prompt(loaded, "Hi there"))
    chunks = list(client(server).chat.completions.create(temperature=0, stream=True, **ask))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_greedy_completion_streamed_or_not(server, loaded):
    tok = HFTokenizer(loaded[1], "t")
    ids = [loaded[1].bos_token_id] + tok.encode_ordinary("The assistant")
    expected = loaded[1].decode(greedy(loaded, ids, 10))
    ask = dict(model=NAME, prompt="The assistant", max_tokens=10, temperature=0)
    done = client(server).completions.create(**ask)
    assert done.object == "text_completion" and done.choices[0].text == expected
    chunks = list(client(server).completions.create(stream=True, **ask))
    assert "".join(c.choices[0].text for c in chunks) == expected


def test_a_stop_string_ends_the_reply_before_it(server, loaded):
    ask = dict(model=NAME, prompt="The assistant", max_tokens=10, temperature=0)
    whole = client(server).completions.create(**ask).choices[0].text
    stop = whole[3:6]
    cut = client(server).completions.create(stop=[stop], **ask).choices[0]
    assert cut.text == whole[: whole.index(stop)] and cut.finish_reason == "stop"


def test_sampling_with_a_seed_repeats(server):
    ask = dict(model=NAME, prompt="Hello", max_tokens=8, temperature=1.0, top_p=0.9, seed=7)
    first = client(server).completions.create(**ask).choices[0].text
    assert client(server).completions.create(**ask).choices[0].text == first


def test_two_clients_at_once_are_both_answered(server):
    DELAY["s"] = 0.005
    replies: dict[int, str] = {}

    def ask(i: int) -> None:
        messages = [{"role": "user", "content": f"Question {i}"}]
        out = client(server).chat.completions.create(model=NAME, messages=messages, max_tokens=20)
        replies[i] = out.choices[0].finish_reason

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(replies) == {0, 1}


def test_a_client_that_leaves_stops_its_generation(server):
    """Closing a stream mid-reply stops the model within a token or two, and the next request is
    answered at once (a generation that kept running would hold the queue for ~4 s)."""
    url, engine = server
    DELAY["s"] = 0.02  # 250 tokens: 5 s
    before = engine.tokens_generated
    stream = client(server).completions.create(
        model=NAME, prompt="Once", max_tokens=250, temperature=0, stream=True
    )
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.response.close()
    time.sleep(0.5)
    stopped_at = engine.tokens_generated
    time.sleep(0.5)
    assert engine.tokens_generated == stopped_at, "generation went on after the client left"
    assert stopped_at - before < 60
    started = time.time()
    client(server).completions.create(model=NAME, prompt="Next", max_tokens=2)
    assert time.time() - started < 1.5


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in response.text
    return body["error"]


def post(server, route: str, body, key: str = KEY, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    data = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(server[0] + route, content=data, headers=headers, timeout=30, **kw)


CHAT = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def test_errors_are_openai_shaped(server):
    with pytest.raises(openai.AuthenticationError):
        client(server, key="wrong").models.list()
    assert error_of(post(server, "/v1/chat/completions", CHAT, key="wrong"), 401)["code"] == (
        "invalid_api_key"
    )
    assert error_of(httpx.get(server[0] + "/v1/models"), 401)
    with pytest.raises(openai.NotFoundError):
        client(server).chat.completions.create(**{**CHAT, "model": "gpt-4"})
    err = error_of(post(server, "/v1/chat/completions", {**CHAT, "model": "gpt-4"}), 404)
    assert err["param"] == "model"
    long = {**CHAT, "messages": [{"role": "user", "content": "word " * 200}]}
    err = error_of(post(server, "/v1/chat/completions", long), 400)
    assert err["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client(server).completions.create(model=NAME, prompt="Hi", max_tokens=TOKENS_CAP + 1)
    too_many = {"model": NAME, "prompt": "Hi", "max_tokens": TOKENS_CAP + 1}
    assert error_of(post(server, "/v1/completions", too_many), 400)["param"] == "max_tokens"
    assert error_of(post(server, "/v1/chat/completions", '{"model": "tiny-c'), 400)
    assert error_of(post(server, "/v1/chat/completions", {"model": NAME}), 400)["param"]
    wrong_order = {**CHAT, "messages": [{"role": "assistant", "content": "Hi"}]}
    assert error_of(post(server, "/v1/chat/completions", wrong_order), 400)
    assert error_of(httpx.get(server[0] + "/v1/nothing"), 404)


def test_a_full_queue_is_refused_429(server):
    """One generating, one waiting (--max-queue 1): a third request is refused; the two that
    leave free the server."""
    DELAY["s"] = 0.02
    body = json.dumps({**CHAT, "max_tokens": 200, "stream": True})
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    with httpx.Client(timeout=30) as http:
        with (
            http.stream("POST", server[0] + "/v1/chat/completions", content=body, headers=headers),
            http.stream("POST", server[0] + "/v1/chat/completions", content=body, headers=headers),
        ):
            err = error_of(post(server, "/v1/chat/completions", CHAT), 429)
            assert err["type"] == "rate_limit_exceeded"
    DELAY["s"] = 0.0
    deadline = time.time() + 5
    while server[1].admitted and time.time() < deadline:
        time.sleep(0.05)
    assert post(server, "/v1/chat/completions", CHAT).status_code == 200


def refused(folder: Path) -> list[str]:
    """`lmpipe serve FOLDER` refusing it: exit status 2, and its stderr's lines."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    run = subprocess.run(
        [sys.executable, "-m", "lmpipe.chat.serve", str(folder), "--port", "0"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    return run.stderr.strip().splitlines()


def test_the_cli_says_in_one_line_when_the_port_is_taken_or_the_folder_does_not_load(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = str(taken.getsockname()[1])
    try:
        run = subprocess.run(
            [sys.executable, "-m", "lmpipe.chat.serve", str(tmp_path), "--port", port],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
    finally:
        taken.close()
    assert run.returncode == 2 and run.stderr.strip() == f"lmpipe serve: 127.0.0.1:{port} is in use"
    assert refused(tmp_path) == [
        f"lmpipe serve: {tmp_path} is not a loadable model folder: {tmp_path}: no config.json"
        " (expected a converted model folder)"
    ]
    assert lmpipe([]) == 2


def test_the_model_is_named_after_its_run():
    assert model_name_of(Path("results/runs/embedded-a-chat/model/hf")) == "embedded-a-chat"
    assert model_name_of(Path("/tmp/some-model")) == "some-model"


SEND = """(() => {
  document.getElementById("key").value = "%s";
  document.getElementById("message").value = "Hello, who are you?";
  document.getElementById("send").click();
  return document.getElementById("model").textContent;
})()"""
SEEN = """JSON.stringify(Array.from(document.querySelectorAll(".msg")).map(
  m => [m.className, m.querySelector(".text").textContent]).concat(
  [["done", String(!document.getElementById("send").disabled)]]))"""


def test_the_chat_page_streams_a_reply_in_chromium(server):
    from test_browser import CHROMIUM, open_page

    if CHROMIUM is None:
        pytest.skip("no Chromium found")
    DELAY["s"] = 0.01
    shot = Path(os.environ.get("LMPIPE_SCREENSHOT", tempfile.gettempdir() + "/serve_page.png"))
    with open_page(server[0] + "/", ("Page", "Runtime")) as (browser, session):

        def evaluate(expression: str):
            return browser.send("Runtime.evaluate", session, expression=expression)["result"][
                "value"
            ]

        assert evaluate(SEND % KEY) == NAME
        partial, deadline = False, time.time() + 30
        while True:
            seen = json.loads(evaluate(SEEN))
            texts = {cls: text for cls, text in seen}
            reply = texts.get("msg assistant", "")
            partial |= bool(reply) and texts["done"] == "false"  # text while still streaming
            if texts["done"] == "true" and reply:
                break
            assert time.time() < deadline, seen
            time.sleep(0.05)
        shot.write_bytes(
            base64.b64decode(browser.send("Page.captureScreenshot", session, format="png")["data"])
        )
    assert texts["msg user"] == "Hello, who are you?"
    assert partial, "the reply appeared only once complete"
    errors = [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]
    assert errors == []


def test_lm_eval_local_completions_on_the_server_scores_as_its_hf_model(model_dir, loaded):
    """lm-eval's `local-completions` model pointed at the server (echo + logprobs: each
    prompt token's log-probability) gives the log-likelihoods and answers lm-eval's `hf` model
    gives on the same folder, item by item (HellaSwag, 10 items)."""
    import numpy as np

    from conftest import RESOURCES
    from lmpipe.chat.serve.app import create_app
    from lmpipe.chat.serve.engine import Engine
    from lmpipe.eval.harness import LM_EVAL_TASK, run_local_tasks, write_lm_eval_task

    items = RESOURCES / "hellaswag_val_sample.jsonl"
    app = create_app(Engine(*loaded), NAME, max_tokens_cap=TOKENS_CAP)
    sock = bind("127.0.0.1", 0)
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions"

    def samples(model: str, args: dict | None) -> list[dict]:
        out = run_local_tasks(
            model_dir, [LM_EVAL_TASK], lambda work: write_lm_eval_task(items, work), 10, 1,
            log_samples=True, bootstrap_iters=0, model=model, model_args=args,
        )  # fmt: skip
        return sorted(out["samples"][LM_EVAL_TASK], key=lambda s: s["doc_id"])

    try:
        served = samples("local-completions", {
            "base_url": url, "model": NAME, "tokenizer": str(model_dir),
            "tokenizer_backend": "huggingface", "tokenized_requests": True,
            "num_concurrent": 1, "max_retries": 1,
        })  # fmt: skip
    finally:
        srv.should_exit = True
        thread.join(10)
    local = samples("hf", None)
    theirs = np.array([[r[0] for r in s["filtered_resps"]] for s in local])
    ours = np.array([[r[0] for r in s["filtered_resps"]] for s in served])
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4)
    assert [s["acc"] for s in served] == [s["acc"] for s in local]
    assert [s["acc_norm"] for s in served] == [s["acc_norm"] for s in local]
