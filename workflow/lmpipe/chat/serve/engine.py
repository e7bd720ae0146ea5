"""One model, one generation at a time: the queue, the streamed tokens, the stop.

A request is admitted while fewer than `1 + max_queue` are in (the one generating, the rest
waiting); beyond that it is refused (the server's 429). Generation runs on a thread (the model's
own `generate`, lmpipe.chat.cli.generate_ids, KV cache and all); each new token crosses to the
event loop through an asyncio queue. Text is decoded from all the reply's ids so far (a token may
be half a character), and held back while it could be the start of a stop string. Whoever stops
reading (a client gone, a stop string found) sets the generation's cancel flag, which a stopping
criterion checks before every token: the thread ends after at most one more token, and the next
request starts only once it has.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lmpipe.chat.cli import context_window, generate_ids
from lmpipe.data.tokenizer import HFTokenizer


class QueueFull(RuntimeError):
    """More requests than the queue holds."""


@dataclass
class Sampling:
    """What one request asks of the generation."""

    max_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    def generate_options(self) -> dict[str, Any] | None:
        if self.temperature == 0:
            return None  # greedy
        # top_k 0: no top-k cut (generate's default is 50); OpenAI's API has none
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": 0}


@dataclass
class Piece:
    """A stretch of the reply's text; the last one carries why it ended ("stop" or "length")."""

    text: str
    finish_reason: str | None = None
    tokens: int = 0  # on the last piece: the reply's tokens


@dataclass
class Scored:
    """A scored prompt and the token after it: each token's log-probability (None for the
    first, which nothing predicts) and, from each position, the `top` most likely next ids."""

    ids: list[int]
    logprobs: list[float | None]
    top: list[dict[int, float] | None]


class _Push:
    """A transformers streamer handing each new token id to the event loop (the first `put` is
    the prompt, skipped), counting every token generated on the engine."""

    def __init__(self, engine: Engine, send: Callable[[Any], None]) -> None:
        self.engine, self.send, self.prompt_seen = engine, send, False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            self.engine.tokens_generated += 1
            self.send(int(token))

    def end(self) -> None:
        pass


class _Cancelled:
    """A stopping criterion: true once the request's cancel flag is set."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool)


class Engine:
    def __init__(self, model: Any, tokenizer: Any, max_queue: int = 8) -> None:
        self.model, self.tokenizer, self.max_queue = model, tokenizer, max_queue
        self.window = context_window(model.config)
        self.eot = HFTokenizer(tokenizer, "the model's tokenizer").eot_token
        self.admitted = 0  # generating or waiting
        self.tokens_generated = 0  # all requests together: what a client that left still cost
        self._turn = asyncio.Lock()  # the queue, in arrival order
        self._model_lock = threading.Lock()  # one generate at a time, even past a cancelled wait

    def admit(self) -> None:
        """Count a request in, or raise QueueFull."""
        if self.admitted >= 1 + self.max_queue:
            raise QueueFull(
                f"the server is busy: one generation running and {self.max_queue} waiting"
            )
        self.admitted += 1

    def release(self) -> None:
        self.admitted -= 1

    async def stream(
        self,
        ids: list[int],
        sampling: Sampling,
        gone: Callable[[], Awaitable[bool]],
        strip_leading: bool = False,
    ) -> AsyncIterator[Piece]:
        """The reply to prompt `ids`, piece by piece, for an admitted request. `gone()` says
        whether the client has left: then generation stops. `strip_leading` drops the reply's
        leading whitespace (a chat reply's first token carries the space after "ASSISTANT:")."""
        async with self._turn:
            loop = asyncio.get_running_loop()
            tokens: asyncio.Queue[Any] = asyncio.Queue()
            cancel = threading.Event()

            def send(item: Any) -> None:
                loop.call_soon_threadsafe(tokens.put_nowait, item)

            thread = threading.Thread(
                target=self._generate, args=(ids, sampling, cancel, send), daemon=True
            )
            thread.start()
            new: list[int] = []
            sent = 0
            try:
                while True:
                    item = await tokens.get()
                    if isinstance(item, Exception):
                        raise item
                    done = item is None or item == self.eot
                    if not done:
                        new.append(item)
                    text = self.tokenizer.decode(new, skip_special_tokens=True)
                    if strip_leading:
                        text = text.lstrip()
                    cut = _first_stop(text, sampling.stop)
                    if cut is not None:
                        yield Piece(text[sent:cut], "stop", len(new))
                        return
                    if done:
                        reason = (
                            "length" if item is None and len(new) >= sampling.max_tokens else "stop"
                        )
                        yield Piece(text[sent:], reason, len(new))
                        return
                    safe = _safe_end(text, sampling.stop)
                    if safe > sent:
                        yield Piece(text[sent:safe])
                        sent = safe
                    if await gone():
                        return
            finally:
                cancel.set()  # the client left, a stop string came, or the reply is done
                await asyncio.shield(asyncio.to_thread(thread.join))

    async def score(self, prompts: list[list[int]], top: int) -> list[Scored]:
        """Each prompt's tokens' log-probabilities and the greedy next token (an admitted
        request's turn in the queue, on a thread): what OpenAI's completions give with `echo`
        and `logprobs`, which lm-eval's `local-completions` model scores log-likelihoods by."""
        async with self._turn:
            return await asyncio.to_thread(self._score, prompts, top)

    @torch.no_grad()
    def _score(self, prompts: list[list[int]], top: int) -> list[Scored]:
        device = next(self.model.parameters()).device
        out = []
        with self._model_lock:
            for ids in prompts:
                logits = self.model(torch.tensor([ids], device=device)).logits[0].float()
                logp = torch.log_softmax(logits, dim=-1)  # (T, V): position t predicts t + 1
                given = logp[:-1].gather(1, torch.tensor(ids[1:], device=device)[:, None])
                best = logp.topk(top, dim=-1)
                nxt = int(best.indices[-1, 0])
                self.tokens_generated += 1
                out.append(
                    Scored(
                        ids + [nxt],
                        [None, *given[:, 0].tolist(), float(best.values[-1, 0])],
                        [None]
                        + [
                            dict(zip(map(int, i), map(float, v), strict=True))
                            for i, v in zip(
                                best.indices.tolist(), best.values.tolist(), strict=True
                            )
                        ],
                    )
                )
        return out

    def _generate(
        self, ids: list[int], sampling: Sampling, cancel: threading.Event, send: Callable
    ) -> None:
        """On the generation thread: each new token id, then None (or the exception) sent."""
        with self._model_lock:
            try:
                generate_ids(
                    self.model,
                    self.tokenizer,
                    ids,
                    sampling.max_tokens,
                    sampling.generate_options(),
                    seed=sampling.seed,
                    streamer=_Push(self, send),
                    stopping_criteria=[_Cancelled(cancel)],
                )
                send(None)
            except Exception as e:  # handed to the request, which answers 500
                send(e)


def _first_stop(text: str, stops: list[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def _safe_end(text: str, stops: list[str]) -> int:
    """How much of `text` can be sent: not a trailing half character, nor a tail that may grow
    into a stop string."""
    end = len(text.rstrip("\ufffd"))
    for s in stops:
        for k in range(min(len(s) - 1, end), 0, -1):
            if text[:end].endswith(s[:k]):
                end -= k
                break
    return end
