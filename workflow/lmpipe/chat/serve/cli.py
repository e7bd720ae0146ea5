"""The command line: `lmpipe serve MODEL_DIR` (the `lmpipe` console script; `serve` is its one
subcommand) or `python -m lmpipe.chat.serve MODEL_DIR`.

The port is taken before the model loads (a port in use says so in one line, at once), and a
folder that does not load says why in one line; both end with exit status 2.
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys
from pathlib import Path


def model_name_of(model_dir: Path) -> str:
    """A run's name for its folder (results/runs/RUN/model/hf -> RUN), else the folder's."""
    path = model_dir.resolve()
    if path.name == "hf" and path.parent.name == "model" and path.parent.parent.name:
        return path.parent.parent.name
    return path.name


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lmpipe serve",
        description="Serve a converted model with an OpenAI-compatible API and a chat page.",
    )
    p.add_argument(
        "model", type=Path, help="a converted Hugging Face folder (results/runs/RUN/model/hf)"
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="(default: %(default)s)")
    p.add_argument("--model-name", help="the model's name in the API (default: the run's name)")
    p.add_argument("--api-key", help="require `Authorization: Bearer KEY` on the /v1 routes")
    p.add_argument(
        "--max-queue", type=int, default=8,
        help="requests waiting while one generates; more get 429 (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--max-prompt-tokens", type=int,
        help="the longest prompt taken, in tokens (default: the model's window less one)",
    )  # fmt: skip
    p.add_argument(
        "--max-tokens-cap", type=int, default=512,
        help="the most max_tokens a request may ask for (default: %(default)s)",
    )  # fmt: skip
    p.add_argument("--device", default=None, help="cpu, cuda... (default: cuda when there is one)")
    return p


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or SystemExit with one line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror})"
        print(f"lmpipe serve: {host}:{port} {why}", file=sys.stderr)
        raise SystemExit(2) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sock = bind(args.host, args.port)
    import torch
    import uvicorn
    from transformers.utils import logging as transformers_logging

    from lmpipe.chat.cli import load
    from lmpipe.chat.serve.app import create_app
    from lmpipe.chat.serve.engine import Engine

    transformers_logging.disable_progress_bar()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model, tokenizer = load(args.model, device)
    except Exception as e:  # the folder's own error, in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(
            f"lmpipe serve: {args.model} is not a loadable model folder: {first}", file=sys.stderr
        )
        sock.close()
        return 2
    name = args.model_name or model_name_of(args.model)
    app = create_app(
        Engine(model, tokenizer, args.max_queue),
        name,
        api_key=args.api_key,
        max_prompt_tokens=args.max_prompt_tokens,
        max_tokens_cap=args.max_tokens_cap,
    )
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"lmpipe serve: {name} on http://{shown}:{args.port}/ (API at /v1)", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])
    return 0


def lmpipe(argv: list[str] | None = None) -> int:
    """The `lmpipe` console script: `lmpipe serve MODEL_DIR [options]`."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("serve",):
        print("usage: lmpipe serve MODEL_DIR [options]   (lmpipe serve --help)", file=sys.stderr)
        return 2
    return main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
