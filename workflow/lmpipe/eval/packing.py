"""Scoring rows packed as prefix trees: every shared prefix through the model once.

A scoring row is (context tokens, continuation tokens): the model reads the row but its last
token, and the log-probabilities of the continuation's tokens are summed. Rows often share a
prefix: an item's choices share its context (ARC, PIQA, SciQ, ...), Winogrande's two contexts
share the words before the blank, MMLU's items of a subject share their instruction line. A
row scored alone runs its prefix again for every choice.

Here the rows are sorted by their tokens and merged, in that order, into prefix trees (tries):
a row's tokens after the longest prefix it shares with the row before it become new nodes, each
the child of the node before it. A pack is one sequence of up to `pack_tokens` nodes (one tree
or several), in which each node sits at its depth's position and attends to itself and its
ancestors only (a boolean mask): its hidden state is the one it has in its row scored alone,
causal attention over the same tokens at the same positions, up to float rounding. The LM head
runs at the nodes that predict a continuation token only, once a node (MMLU's four letters are
read from one softmax). Packs fill a sequence, so a forward pass has little padding too.

A row whose inputs are longer than the model's block_size is truncated from the left first, as
lm-eval truncates it (its last block_size + 1 tokens), and packed so: one-token choices of a
long context still share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

Row = tuple[list[int], list[int]]

# nodes a pack at most: dense masked attention over a pack costs ~4 * pack * n_embd FLOPs a token
# a layer, against ~24 * n_embd**2 for the rest of the layer (+~5% at 124M)
PACK_TOKENS = 256


@dataclass
class Pack:
    """One packed sequence: its nodes, and for each row scored in it the nodes that predict the
    row's continuation tokens (the node of the token before each)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: a tree's root
    positions: list[int] = field(default_factory=list)  # a node's depth = its position in a row
    rows: list[int] = field(default_factory=list)  # indices into the rows packed
    predictors: list[list[int]] = field(default_factory=list)  # a row's nodes, one a target
    targets: list[list[int]] = field(default_factory=list)  # a row's continuation tokens

    def mask(self, length: int) -> np.ndarray:
        """(length, length) bool: node i may attend to node j, j = i or an ancestor of i; a
        padding position (beyond the nodes) attends to itself only."""
        m = np.zeros((length, length), dtype=bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                m[i] = m[parent]  # parents come before their children
            m[i, i] = True
        for i in range(len(self.parents), length):
            m[i, i] = True
        return m


def truncate(row: Row, block_size: int) -> Row:
    """lm-eval's left truncation: a row whose inputs (all its tokens but the last) are longer
    than block_size keeps its last block_size + 1 tokens, the continuation whole."""
    ctx, cont = row
    if len(ctx) + len(cont) - 1 <= block_size:
        return row
    if len(cont) > block_size:
        raise ValueError(f"a continuation of {len(cont)} tokens is longer than block_size")
    kept = (ctx + cont)[-(block_size + 1) :]
    return kept[: -len(cont)], cont


def pack_rows(rows: list[Row], pack_tokens: int, block_size: int) -> list[Pack]:
    """The rows (truncated to block_size) in packs, each of up to `pack_tokens` nodes, or up to
    block_size where one row's inputs alone need more, or a row shares more of its inputs with
    the pack than it adds."""
    rows = [truncate(row, block_size) for row in rows]
    for i, (ctx, cont) in enumerate(rows):
        assert ctx and cont, f"row {i}: a context and a continuation are needed"
    seqs = [ctx + cont[:-1] for ctx, cont in rows]  # the inputs
    packs: list[Pack] = []
    pack, prev, prev_nodes = None, [], []
    for i in sorted(range(len(rows)), key=seqs.__getitem__):
        seq = seqs[i]
        shared = 0
        if pack is not None:
            limit = min(len(seq), len(prev))
            while shared < limit and seq[shared] == prev[shared]:
                shared += 1
            new = len(seq) - shared
            # past pack_tokens, a row stays where it adds fewer nodes than it shares (an item's
            # next choice after a long context): anywhere else it would run that context again
            grown = len(pack.tokens) + new
            if grown > pack_tokens and (new > shared or grown > block_size):
                pack, shared = None, 0
        if pack is None:
            pack = Pack()
            packs.append(pack)
        nodes = prev_nodes[:shared]
        for position in range(shared, len(seq)):
            pack.parents.append(nodes[-1] if nodes else -1)
            pack.tokens.append(seq[position])
            pack.positions.append(position)
            nodes.append(len(pack.tokens) - 1)
        n_ctx = len(rows[i][0])
        pack.rows.append(i)
        pack.predictors.append(nodes[n_ctx - 1 :])  # inputs n_ctx-1 .. end predict the targets
        pack.targets.append(rows[i][1])
        prev, prev_nodes = seq, nodes
    return packs


def forward_batches(packs: list[Pack], batch_rows: int) -> list[list[Pack]]:
    """Packs in forward passes: each takes packs (in order) until it scores `batch_rows` rows."""
    batches: list[list[Pack]] = []
    current: list[Pack] = []
    for pack in packs:
        current.append(pack)
        if sum(len(p.rows) for p in current) >= batch_rows:
            batches.append(current)
            current = []
    return batches + [current] if current else batches


@torch.no_grad()
def packed_logprobs(
    model: torch.nn.Module, batch: list[Pack], device: str | torch.device = "cpu"
) -> list[tuple[int, float]]:
    """(row index, summed log-probability of its continuation) of every row in one forward pass
    of `batch`'s packs. `model`: hidden_states(idx, positions, mask) and head(h) (lmpipe.models)."""
    length = max(len(p.tokens) for p in batch)
    idx = torch.zeros((len(batch), length), dtype=torch.long)
    positions = torch.zeros((len(batch), length), dtype=torch.long)
    mask = torch.from_numpy(np.stack([p.mask(length) for p in batch]))[:, None]  # (B, 1, L, L)
    for b, p in enumerate(batch):
        idx[b, : len(p.tokens)] = torch.tensor(p.tokens)
        positions[b, : len(p.tokens)] = torch.tensor(p.positions)
    h = model.hidden_states(idx.to(device), positions.to(device), mask.to(device))  # (B, L, C)

    # the head once a predicting node: (batch, node) -> its row in `logits`
    where: dict[tuple[int, int], int] = {}
    for b, p in enumerate(batch):
        for nodes in p.predictors:
            for node in nodes:
                where.setdefault((b, node), len(where))
    at = torch.tensor(list(where), device=device)  # (N, 2)
    logits = model.head(h[at[:, 0], at[:, 1]])  # (N, V) fp32
    norm = torch.logsumexp(logits, dim=-1)
    picks, targets, owner, rows = [], [], [], []
    for b, p in enumerate(batch):
        for row, nodes, tokens in zip(p.rows, p.predictors, p.targets, strict=True):
            picks += [where[b, node] for node in nodes]
            targets += tokens
            owner += [len(rows)] * len(tokens)
            rows.append(row)
    picks_t = torch.tensor(picks, device=device)
    logp = logits[picks_t, torch.tensor(targets, device=device)] - norm[picks_t]
    sums = torch.zeros(len(rows), dtype=torch.float64, device=device)
    sums.index_add_(0, torch.tensor(owner, device=device), logp.double())
    return list(zip(rows, sums.cpu().tolist(), strict=True))


def pack_size(block_size: int) -> int:
    """Nodes a pack for a model of `block_size`: that, at most PACK_TOKENS."""
    return min(block_size, PACK_TOKENS)


def forward_plan(model: torch.nn.Module, rows: list[Row], batch_rows: int) -> list[list[Pack]]:
    """The rows packed for `model` and grouped into forward passes, as `score_rows` runs them.
    A caller that scores the same rows again (an eval during training) keeps it; its length is
    the forwards that FSDP ranks must equal (train.evaluators.as_many_forwards_as_any_rank)."""
    block_size = model.config.block_size
    packs = pack_rows(rows, pack_size(block_size), block_size)
    return forward_batches(packs, batch_rows)


def score_rows(
    model: torch.nn.Module,
    rows: list[Row],
    batch_rows: int,
    device: str | torch.device = "cpu",
    progress: tqdm | None = None,
    rows_per_step: float = 1.0,
    plan: list[list[Pack]] | None = None,
) -> np.ndarray:
    """Summed log-probability of each row's continuation given its context, the rows packed
    (module docstring), a forward pass packs until `batch_rows` rows; `plan`: the rows'
    `forward_plan`, where the caller keeps it. `progress` advances by one for every
    `rows_per_step` rows scored (HellaSwag: an item)."""
    out = np.zeros(len(rows), dtype=np.float64)
    plan = forward_plan(model, rows, batch_rows) if plan is None else plan
    for batch in plan:
        for i, logp in packed_logprobs(model, batch, device):
            out[i] = logp
        if progress is not None:
            progress.update(sum(len(p.rows) for p in batch) / rows_per_step)
    return out
