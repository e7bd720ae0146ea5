"""Chat evaluations of a converted model: held-out conversation loss and answers to fixed prompts.

    python -m lmpipe.sft_eval loss --config-json J --model HF_DIR --data SFT_MANIFEST --out F
    python -m lmpipe.sft_eval chat --config-json J --model HF_DIR --out F

Run for a fine-tuned run and for its base, so the report shows both side by side. `J` is the
run's eval slice (`lmpipe.config.eval_params`). Results are small JSON files in the shape of
`lmpipe.evaluate`'s: {"metric", "value", "tokens", "produced_by", ...}.

- loss: mean cross-entropy over the tokens the SFT loss counts (assistant replies and the
  end-of-text closing each) of every held-out conversation, weighted by token, not by row.
- chat: each of CHAT_PROMPTS as a one-turn conversation in the template, answered greedily (so
  the answers are reproducible) until end-of-text or `eval.sample_tokens` tokens.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from lmpipe.chat import load, reply
from lmpipe.convert import load_native_from_hf
from lmpipe.evaluate import default_device, eval_config, produced_by, write_result
from lmpipe.sft_data import IGNORE, load_split

# The first two are the identity questions of FastChat's dummy data; the others are not in it.
CHAT_PROMPTS = (
    "Who are you?",
    "What is your name?",
    "What is the capital of France?",
    "Write a short poem about the sea.",
)


@torch.no_grad()
def held_out_loss(model, manifest: str, batch: int, device: str) -> tuple[float, int, int]:
    """(mean loss a counted token, counted tokens, conversations) over the val split."""
    inputs, targets = load_split(manifest, "val")
    total, count = 0.0, 0
    for start in range(0, len(inputs), batch):
        x = torch.from_numpy(inputs[start : start + batch]).long().to(device)
        y = torch.from_numpy(targets[start : start + batch]).long().to(device)
        logits, _ = model(x)
        loss = F.cross_entropy(
            logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=IGNORE, reduction="sum"
        )
        total += loss.item()  # a host sync a batch: fine for an eval
        count += int((y != IGNORE).sum())
    return total / count, count, len(inputs)


def run_loss(config_json: str, model_dir: str, manifest: str, out: str) -> None:
    _, cfg = eval_config(config_json)
    device = default_device()
    model = load_native_from_hf(model_dir).to(device)
    loss, tokens, conversations = held_out_loss(model, manifest, cfg.val_batch, device)
    write_result(
        out,
        {
            "metric": "sft_loss",
            "value": loss,
            "tokens": tokens,
            "conversations": conversations,
            "produced_by": produced_by(
                model_dir,
                "mean cross-entropy of the assistant tokens of the held-out conversations",
                data=str(manifest),
                device=device,
            ),
        },
    )


def run_chat(config_json: str, model_dir: str, out: str) -> None:
    _, cfg = eval_config(config_json)
    device = default_device()
    model, tokenizer = load(model_dir, device)
    samples = []
    for prompt in CHAT_PROMPTS:
        answer = reply(model, tokenizer, [], prompt, cfg.sample_tokens)
        print(f"USER: {prompt}\nASSISTANT: {answer}\n")
        samples.append({"prompt": prompt, "reply": answer})
    write_result(
        out,
        {
            "metric": "chat_samples",
            "samples": samples,
            "tokens": cfg.sample_tokens,
            "produced_by": produced_by(
                model_dir, "greedy, vicuna_v1.1 template, until end-of-text", device=device
            ),
        },
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("loss", "chat"):
        s = sub.add_parser(name)
        s.add_argument("--config-json", required=True, help="the run's eval settings (JSON)")
        s.add_argument("--model", required=True, help="converted Hugging Face model folder")
        s.add_argument("--out", required=True, help="result JSON file to write")
    sub.choices["loss"].add_argument("--data", required=True, help="SFT data manifest.json")
    args = p.parse_args(argv)
    if args.what == "loss":
        run_loss(args.config_json, args.model, args.data, args.out)
    else:
        run_chat(args.config_json, args.model, args.out)


if __name__ == "__main__":
    main()
