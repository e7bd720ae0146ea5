"""A mixture of tokenized datasets: each step's rows drawn from the sources in proportion.

A `datasets:` entry `{mixture: {fineweb10B: 0.7, fineweb-edu10B: 0.3}}` is a dataset like the
others: its tokens manifest (written by the `mixture` rule, next to a tokenized dataset's) names
each source's own tokens manifest and weight. Each source is downloaded and tokenized once, as a
dataset of its own, and shared by every run and mixture that names it; changing a weight
rewrites only this small manifest, so the training reruns and tokenization never does.

How a step is drawn (lmpipe.data.mixture_loader.MixtureLoader). A step is
`batch_tokens / seq_len` rows of `seq_len` tokens. Row `g` of the run (counting over all steps)
goes to the source furthest below its share so far: the one with the largest
`weight * (g + 1) - rows_taken` (ties: the first in name order). Each source's count thus stays
within about one row of its exact share at every step, whatever the weights, and the rows of a
step depend only on the step: not on the ranks, the micro-batches or a restart. A source's rows
of a step are consecutive `seq_len`-token windows of its own stream of train shards (as llm.c
reads one dataset); the step's rows are then interleaved in the order they were drawn, and rank
`r`'s micro-batch `i` is rows `(i * W + r) * B ...` of them, as ShardLoader slices one stream. A
source that runs out of train shards starts again from its first (another epoch), which the
loader logs.

    python -m lmpipe.data mixture --dataset ab --weights-json '{"a": 0.7, "b": 0.3}' \\
        --source a=results/data/a/tokens/manifest.json --source b=... --out M
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpipe import manifests
from lmpipe.data.shards import TokensManifest, read_manifest

log = logging.getLogger("lmpipe.mixture")


@dataclass(frozen=True)
class Source:
    """One dataset of a mixture: its share of the rows and its tokenized shards."""

    name: str
    weight: float  # the share of the rows, the weights normalised to sum to 1
    tokens: TokensManifest


@dataclass(frozen=True)
class Mixture:
    """A mixture's tokens manifest: its sources in name order."""

    path: Path
    name: str  # the `datasets:` entry's
    sources: list[Source]

    def identity(self) -> dict[str, Any]:
        """The weights and each source's shards: the data's part of a run's settings hash."""
        return {s.name: {"weight": s.weight, "shards": s.tokens.identity()} for s in self.sources}

    @property
    def weights(self) -> dict[str, float]:
        return {s.name: s.weight for s in self.sources}


is_mixture = manifests.is_mixture


def read_mixture(path: str | Path) -> Mixture:
    """A mixture's manifest; each source's own manifest read (and checked) too."""
    m = manifests.read_mixture(path)
    sources = []
    for name, (weight, manifest) in sorted(m.sources.items()):
        try:
            tokens = read_manifest(os.path.normpath(manifest))
        except (OSError, ValueError) as e:
            raise ValueError(f"{m.path}: source {name!r}: {e}") from None
        sources.append(Source(name, weight, tokens))
    return Mixture(m.path, m.dataset, sources)


def text_sources(path: str | Path) -> Mixture:
    """A tokens manifest as a mixture: a mixture's own, or one dataset as a mixture of one
    source at weight 1 (what fine-tuning replays, lmpipe.chat.replay, reads either way)."""
    path = Path(path)
    if is_mixture(path):
        return read_mixture(path)
    name = manifests.dataset_of(path)
    return Mixture(path, name, [Source(name, 1.0, read_manifest(path))])


def write_mixture(
    out: Path, name: str, weights: dict[str, float], sources: dict[str, Path]
) -> None:
    """The mixture's manifest: weights normalised to sum to 1, each source's manifest by a path
    relative to it (the data folder can move as a whole)."""
    total = sum(weights.values())
    entries = {
        name: {
            "weight": weights[name] / total,
            "manifest": os.path.relpath(Path(sources[name]).resolve(), out.parent.resolve()),
        }
        for name in sorted(weights)
    }
    # the sources' tokens: GPT-2's, or one `arch: hf` model's own (tokens-{model}/) for all
    tokens_of = {manifests.tokens_of(m) for m in sources.values()}
    if len(tokens_of) > 1:
        raise ValueError(
            f"{out}: the sources are in different tokens ({sorted(map(str, tokens_of))})"
        )
    manifest = {"dataset": name, "mixture": entries}
    if (model := tokens_of.pop()) is not None:
        manifest["tokens_of"] = model
    manifests.write(out, manifest)


def draw_rows(weights: list[float], taken: list[int], rows: int) -> list[int]:
    """The sources of the next `rows` rows, given the rows each has had: each row to the source
    furthest below its share (the largest `weight * (rows so far + 1) - taken`). Updates
    `taken`."""
    drawn = []
    done = sum(taken)
    for g in range(done, done + rows):
        deficits = [w * (g + 1) - t for w, t in zip(weights, taken, strict=True)]
        k = max(range(len(weights)), key=deficits.__getitem__)
        taken[k] += 1
        drawn.append(k)
    return drawn


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write a mixture's tokens manifest.")
    p.add_argument("--weights-json", required=True, help="source name -> weight (JSON)")
    p.add_argument("--source", action="append", default=[], help="NAME=tokens manifest")
    p.add_argument("--dataset", required=True, help="the mixture's name (its datasets: key)")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    weights = json.loads(args.weights_json)
    sources = dict(s.split("=", 1) for s in args.source)
    if set(sources) != set(weights):
        p.error(f"--source names {sorted(sources)} differ from the weights' {sorted(weights)}")
    for path in sources.values():
        read_manifest(path)  # each source's manifest is there and readable
    write_mixture(args.out, args.dataset, weights, {n: Path(m) for n, m in sources.items()})


if __name__ == "__main__":
    main()
