"""The FastAPI app: OpenAI's routes over one Engine, errors in OpenAI's shape, the chat page.

Request and response shapes follow lm-sys/FastChat's fastchat/serve/openai_api_server.py (and
fastchat/protocol/openai_api_protocol.py): `chat.completion` / `chat.completion.chunk` with a
first delta carrying the role and a last one carrying `finish_reason`, `text_completion` for
/v1/completions, `data: {...}` server-sent events ending with `data: [DONE]`, a Bearer key
checked on every /v1 route. Unlike FastChat (which answers every error 400 in its own shape),
errors here are OpenAI's `{"error": {"message", "type", "param", "code"}}` with OpenAI's status
codes, and there is no controller or worker: the model lives in this process.
"""

from __future__ import annotations

import html
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from lmpipe.chat.serve.engine import Engine, Piece, QueueFull, Sampling
from lmpipe.chat.template import SYSTEM, prompt_ids, start_ids
from lmpipe.data.tokenizer import HFTokenizer

PAGE = Path(__file__).with_name("page.html")


class APIError(Exception):
    """An OpenAI-shaped error answer."""

    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", param=None, code=None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type_,
            param,
            code,
        )

    def response(self) -> JSONResponse:
        body = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[dict[str, Any]]


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI's other fields (logprobs, user...) ignored

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=1)  # one choice: one generation at a time
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False


class ChatRequest(_Common):
    messages: list[Message]


class CompletionRequest(_Common):
    # text, texts, token ids, or lists of token ids (lm-eval's `local-completions` sends ids)
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)


class API:
    """The server's settings and what each route does with a request."""

    def __init__(
        self,
        engine: Engine,
        model_name: str,
        api_key: str | None = None,
        max_prompt_tokens: int | None = None,
        max_tokens_cap: int = 512,
    ) -> None:
        self.engine, self.name, self.key, self.tokens_cap = (
            engine,
            model_name,
            api_key,
            max_tokens_cap,
        )
        self.tok = HFTokenizer(engine.tokenizer, "the model's tokenizer")
        self.prompt_cap = min(max_prompt_tokens or engine.window - 1, engine.window - 1)
        self.default_max_tokens = min(256, max_tokens_cap)

    def check_key(self, request: Request) -> None:
        if self.key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {self.key}".encode()):
            raise APIError(401, "invalid API key", code="invalid_api_key")

    def sampling(self, body: _Common) -> Sampling:
        """The request's generation settings, checked: its model, max_tokens, stop strings."""
        if body.model != self.name:
            raise APIError(
                404,
                f"the model {body.model!r} does not exist; this server has {self.name!r}",
                param="model",
                code="model_not_found",
            )
        max_tokens = body.max_tokens or self.default_max_tokens
        if max_tokens > self.tokens_cap:
            raise APIError(
                400,
                f"max_tokens {max_tokens} is above this server's cap of {self.tokens_cap}",
                param="max_tokens",
            )
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stops) > 4:
            raise APIError(400, "at most 4 stop sequences", param="stop")
        return Sampling(max_tokens, body.temperature, body.top_p, body.seed, stops)

    def fit(self, ids: list[int], sampling: Sampling, param: str) -> Sampling:
        """Refuse a prompt over the cap; cut max_tokens to what the window leaves."""
        if len(ids) > self.prompt_cap:
            raise APIError(
                400,
                f"the prompt takes {len(ids)} tokens; this server takes at most {self.prompt_cap}",
                param=param,
                code="context_length_exceeded",
            )
        sampling.max_tokens = min(sampling.max_tokens, self.engine.window - len(ids))
        return sampling

    def prompts(self, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
        """A completion request's prompts as token ids: text encoded after <s> where the
        tokenizer has one; ids as given."""
        many = (
            prompt
            if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
            else [prompt]
        )
        if not many or any(isinstance(p, list) and not p for p in many):
            raise APIError(400, "an empty prompt", param="prompt")
        ids = [p if isinstance(p, list) else start_ids(self.tok) + self.tok.encode_ordinary(p)
               for p in many]  # fmt: skip
        if any(i < 0 or i >= self.tok.n_vocab for p in ids for i in p):
            raise APIError(
                400, f"a token id outside the vocabulary of {self.tok.n_vocab}", param="prompt"
            )
        return ids

    async def scored(self, body: CompletionRequest, prompts: list[list[int]]) -> dict[str, Any]:
        """`echo` with `logprobs`: each prompt's tokens with their log-probabilities and top
        `logprobs` alternatives, then the greedy next token (OpenAI's legacy completions, as
        lm-eval's `local-completions` model reads them: `token_logprobs`, `top_logprobs`)."""
        self.sampling(body)  # the model's name
        if (body.max_tokens or 1) > 1 or body.stream:
            raise APIError(
                400, "with echo and logprobs: max_tokens 1 and no stream", param="max_tokens"
            )
        for ids in prompts:
            self.fit(ids, Sampling(1, 0.0, 1.0, None, []), "prompt")
        try:
            self.engine.admit()
        except QueueFull as e:
            raise APIError(429, str(e), "rate_limit_exceeded", code="queue_full") from None
        try:
            results = await self.engine.score(prompts, max(1, body.logprobs or 1))
        finally:
            self.engine.release()
        choices = []
        for index, r in enumerate(results):
            top = [None if t is None else {self.word(i): lp for i, lp in t.items()} for t in r.top]
            logprobs = {"tokens": [self.word(i) for i in r.ids], "token_logprobs": r.logprobs,
                        "top_logprobs": top, "text_offset": None}  # fmt: skip
            text = self.tok.decode(r.ids)
            choices.append({"index": index, "text": text, "logprobs": logprobs,
                            "finish_reason": "length"})  # fmt: skip
        prompt_tokens = sum(len(p) for p in prompts)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": self.name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(prompts),
                      "total_tokens": prompt_tokens + len(prompts)},
        }  # fmt: skip

    def word(self, token: int) -> str:
        """One token's text, as OpenAI's logprobs name tokens."""
        return self.tok.decode([token])

    def page(self) -> str:
        settings = {
            "model": self.name,
            "needsKey": self.key is not None,
            "maxTokens": self.default_max_tokens,
            "maxTokensCap": self.tokens_cap,
        }
        text = PAGE.read_text().replace("{{TITLE}}", html.escape(self.name))
        return text.replace("{{SETTINGS}}", json.dumps(settings).replace("<", "\\u003c"))

    async def answer(
        self, request: Request, ids: list[int], sampling: Sampling, stream: bool, chat: bool
    ) -> Any:
        """The reply, whole or as server-sent events, once the request is in the queue."""
        try:
            self.engine.admit()
        except QueueFull as e:
            raise APIError(429, str(e), "rate_limit_exceeded", code="queue_full") from None
        prefix, kind = ("chatcmpl", "chat.completion") if chat else ("cmpl", "text_completion")
        head = {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.name,
        }
        pieces = self.engine.stream(ids, sampling, request.is_disconnected, strip_leading=chat)
        if stream:
            return StreamingResponse(
                self.events(pieces, head, chat), media_type="text/event-stream"
            )
        try:
            text, reason, count = "", None, 0
            async with aclosing(pieces) as it:
                async for piece in it:
                    text, reason, count = text + piece.text, piece.finish_reason, piece.tokens
        finally:
            self.engine.release()
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        usage = {"prompt_tokens": len(ids), "completion_tokens": count}
        usage["total_tokens"] = len(ids) + count
        return {**head, "choices": [{**choice, "finish_reason": reason}], "usage": usage}

    async def events(self, pieces: AsyncIterator[Piece], head: dict[str, Any], chat: bool):
        """OpenAI's chunks: for a chat, a first delta with the role; the text; a last chunk with
        the finish reason alone; then [DONE]."""
        try:
            if chat:
                yield chunk(head, chat, None, first=True)
            async with aclosing(pieces) as it:
                async for piece in it:
                    if piece.finish_reason and piece.text:  # the text, then the reason alone
                        yield chunk(head, chat, Piece(piece.text))
                        piece = Piece("", piece.finish_reason)
                    yield chunk(head, chat, piece)
            yield "data: [DONE]\n\n"
        finally:
            self.engine.release()


def chunk(head: dict[str, Any], chat: bool, piece: Piece | None, first: bool = False) -> str:
    if chat:
        delta: dict[str, Any] = {}
        if first:
            delta = {"role": "assistant", "content": ""}
        elif piece and piece.text:
            delta = {"content": piece.text}
        choice = {"index": 0, "delta": delta}
    else:
        choice = {"index": 0, "text": piece.text if piece else "", "logprobs": None}
    body = {**head, "object": head["object"] + ".chunk" if chat else head["object"]}
    body["choices"] = [{**choice, "finish_reason": piece.finish_reason if piece else None}]
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def create_app(
    engine: Engine,
    model_name: str,
    api_key: str | None = None,
    max_prompt_tokens: int | None = None,
    max_tokens_cap: int = 512,
) -> FastAPI:
    api = API(engine, model_name, api_key, max_prompt_tokens, max_tokens_cap)
    app = FastAPI(title=f"lmpipe serve: {model_name}", docs_url=None, redoc_url=None)
    app.state.engine = engine
    add_error_handlers(app)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(api.page())

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        api.check_key(request)
        card = {"id": model_name, "object": "model", "created": CREATED, "owned_by": "lmpipe"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request, body: ChatRequest) -> Any:
        api.check_key(request)
        sampling = api.sampling(body)
        system, history, message = conversation(body.messages)
        ids = prompt_ids(api.tok, history, message, system)
        sampling = api.fit(ids, sampling, "messages")
        return await api.answer(request, ids, sampling, body.stream, chat=True)

    @app.post("/v1/completions")
    async def complete(request: Request, body: CompletionRequest) -> Any:
        api.check_key(request)
        prompts = api.prompts(body.prompt)
        if body.echo and body.logprobs is not None:
            return await api.scored(body, prompts)
        sampling = api.sampling(body)
        if len(prompts) != 1:
            raise APIError(400, "one prompt a request (or echo with logprobs)", param="prompt")
        sampling = api.fit(prompts[0], sampling, "prompt")
        return await api.answer(request, prompts[0], sampling, body.stream, chat=False)

    return app


def add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's JSON: never a traceback, never FastAPI's own shape."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message = "the body is not valid JSON"
        else:
            message = f"{'.'.join(where) or 'body'}: {first.get('msg', 'invalid request')}"
        return APIError(400, message, param=".".join(where) or None).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), code=code).response()

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        return APIError(500, f"{type(exc).__name__}: {exc}", "server_error").response()


CREATED = int(time.time())


def conversation(messages: list[Message]) -> tuple[str, list[tuple[str, str]], str]:
    """(system line, [(user, assistant), ...], the last user message) of OpenAI's messages: an
    optional system message first, then user and assistant in turn, ending with the user's."""
    system = SYSTEM
    texts = [(m.role, text_of(m, i)) for i, m in enumerate(messages)]
    if texts and texts[0][0] == "system":
        system = texts.pop(0)[1]
    for i, (role, _) in enumerate(texts):
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected:
            raise APIError(
                400,
                f"messages: {role!r} where {expected!r} was expected (an optional system"
                " message, then user and assistant in turn, ending with the user's)",
                param="messages",
            )
    if not texts or texts[-1][0] != "user":
        raise APIError(400, "messages: the last message must be the user's", param="messages")
    history = [(texts[i][1], texts[i + 1][1]) for i in range(0, len(texts) - 1, 2)]
    return system, history, texts[-1][1]


def text_of(message: Message, index: int) -> str:
    if isinstance(message.content, str):
        return message.content
    parts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise APIError(400, f"messages.{index}: text parts only", param="messages")
        parts.append(part["text"])
    return "".join(parts)
