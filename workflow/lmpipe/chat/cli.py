"""Chat in the terminal with a converted model, in the template it was fine-tuned with.

    lmpipe-chat results/runs/embedded-a-chat/model/hf               # interactive; empty line quits
    lmpipe-chat results/runs/embedded-a-chat/model/hf --prompt "Who are you?"   # one turn

The model is a Hugging Face folder `convert` writes (GPT-2's GPT2LMHeadModel, a `model.arch:
hf` run's own class, or a `modern` run's class in the code its folder ships, loaded with
trust_remote_code) with its tokenizer; the prompt is the Vicuna v1.1 template of
`lmpipe.chat.template` on that tokenizer's special tokens, ending with "ASSISTANT:". The model's
own `generate` writes the reply (with its KV cache); tokens are printed as they come
(transformers' TextStreamer) until the model writes the tokenizer's end of text, the `</s>` of
the template. The conversation so far is the context; when it no longer
fits the model's window, the oldest exchanges are dropped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from lmpipe.chat.template import prompt_ids
from lmpipe.data.tokenizer import HFTokenizer


def load(model_dir: str | Path, device: str = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer) of a converted folder, fp32, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json (expected a converted model folder)")
    arch = json.loads((model_dir / "config.json").read_text()).get("lmpipe_arch", "gpt2")
    if arch not in ("gpt2", "hf", "modern"):
        raise ValueError(
            f"{model_dir}: a model.arch {arch!r} folder; the chat CLI reads gpt2, hf, modern ones"
        )
    if arch == "modern":  # its transformers class is the code the folder ships
        from lmpipe.models.modern.hf import SHIPPED

        missing = [name for name in SHIPPED if not (model_dir / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{model_dir}: a modern export without its model code ({', '.join(missing)})"
            )
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=torch.float32,
        use_safetensors=True,
        local_files_only=True,
        trust_remote_code=arch == "modern",
    ).to(device)
    return model.eval(), tokenizer


def fit_prompt(
    tokenizer: Any, history: list[tuple[str, str]], message: str, window: int, reply_tokens: int
) -> list[int]:
    """Prompt ids leaving room for `reply_tokens`: the oldest exchanges go first."""
    tok = HFTokenizer(tokenizer, "the model's tokenizer")
    history = list(history)
    while True:
        ids = prompt_ids(tok, history, message)
        if len(ids) + reply_tokens <= window or not history:
            break
        history.pop(0)
    if len(ids) >= window:
        raise ValueError(
            f"the message takes {len(ids)} tokens with the template; the model's window is {window}"
        )
    return ids


def context_window(config: Any) -> int:
    """The model's context: GPT-2's n_positions, a Llama's or Qwen2's max_position_embeddings."""
    for key in ("n_positions", "max_position_embeddings"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise ValueError(f"{type(config).__name__}: no context length (n_positions)")


@torch.no_grad()
def generate_ids(
    model: Any,
    tokenizer: Any,
    ids: list[int],
    max_new_tokens: int,
    sampling: dict[str, Any] | None = None,
    seed: int | None = None,
    streamer: Any = None,
    stopping_criteria: Any = None,
) -> list[int]:
    """The new token ids the model's own `generate` writes after the prompt `ids`, with its KV
    cache, cut before end-of-text. Greedy unless `sampling` holds generate's sampling options
    (do_sample, temperature, top_k, top_p); `seed` seeds torch first. A transformers streamer
    and stopping criteria are passed through (lmpipe.chat.serve streams and stops with them)."""
    eot = HFTokenizer(tokenizer, "the model's tokenizer").eot_token  # the template's </s>
    input_ids = torch.tensor([ids], device=model.device)
    if seed is not None:
        torch.manual_seed(seed)
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        use_cache=True,  # the model's own KV cache: each new token runs alone
        eos_token_id=eot,  # the end of a reply
        pad_token_id=eot,
        streamer=streamer,
        stopping_criteria=stopping_criteria,
        **(sampling or {"do_sample": False}),
    )
    new = out[0, len(ids) :].tolist()
    return new[: new.index(eot)] if eot in new else new


def reply(
    model: Any,
    tokenizer: Any,
    history: list[tuple[str, str]],
    message: str,
    max_new_tokens: int,
    top_k: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    stream: bool = False,
) -> str:
    """The assistant's answer to `message` (greedy when top_k is 0), streamed to stdout if asked."""
    from transformers import TextStreamer

    window = context_window(model.config)
    ids = fit_prompt(tokenizer, history, message, window, min(max_new_tokens, window // 2))
    sampling = None
    if top_k > 0:
        sampling = {"do_sample": True, "top_k": top_k, "temperature": temperature}
    new = generate_ids(
        model,
        tokenizer,
        ids,
        min(max_new_tokens, window - len(ids)),
        sampling,
        seed=seed if sampling else None,
        streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        if stream
        else None,
    )
    return tokenizer.decode(new).strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model", help="a converted Hugging Face folder (results/runs/RUN/model/hf)")
    p.add_argument("--prompt", help="answer this one message and exit (no interaction)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--top-k", type=int, default=0, help="sample from the top k (0: greedy)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a chat's terminal holds the conversation only
    model, tokenizer = load(args.model, "cuda" if torch.cuda.is_available() else "cpu")
    options = dict(
        max_new_tokens=args.max_new_tokens,
        top_k=args.top_k,
        temperature=args.temperature,
        seed=args.seed,
        stream=True,
    )
    if args.prompt is not None:
        print("ASSISTANT:", end="", flush=True)
        reply(model, tokenizer, [], args.prompt, **options)
        return 0
    history: list[tuple[str, str]] = []
    print(f"chatting with {args.model} (an empty line or Ctrl-D quits)", file=sys.stderr)
    while True:
        try:
            message = input("USER: ").strip()
        except EOFError:
            print()
            return 0
        if not message:
            return 0
        print("ASSISTANT:", end="", flush=True)
        history.append((message, reply(model, tokenizer, history, message, **options)))


if __name__ == "__main__":
    sys.exit(main())
