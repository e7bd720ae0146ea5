"""Pretraining on token shards: the torchrun worker of the `train` rule's pretraining runs.

    torchrun --standalone --nproc-per-node=2 -m lmpipe.train.pretrain \\
        --config-json "$(cat job.json)" --data results/data/embedded/tokens/manifest.json \\
        --out results/runs/embedded-a/train

(`python -m lmpipe.train` starts it so, from the run's launch settings; without torchrun it runs
as one process.) It brings the loop (lmpipe.train.loop) the shards: a ShardLoader over the train
shards and this rank's share of the val shard (a mixture's: a MixtureLoader over its sources, and
each source's val shard in proportion); the model starts from its random init.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lmpipe.config import TrainJob
from lmpipe.data.loader import ShardLoader, val_batches
from lmpipe.data.mixture import is_mixture, read_mixture
from lmpipe.data.mixture_loader import MixtureLoader, mixture_val_batches
from lmpipe.data.shards import read_manifest
from lmpipe.train.loop import Task, worker_main
from lmpipe.train.parallel import Dist


def pretraining(
    job: TrainJob, manifest: Path, d: Dist, init: Path | None, replay: Path | None = None
) -> Task:
    if init is not None:
        raise ValueError(f"--init {init}: pretraining starts from a random init")
    if replay is not None:
        raise ValueError(f"--replay {replay}: replay is fine-tuning's (sft.replay)")
    tc = job.train
    if is_mixture(manifest):
        mixture = read_mixture(manifest)
        return Task(
            train=tc,
            loader=MixtureLoader(mixture, tc.micro_batch, tc.seq_len, tc.batch_tokens, d.group),
            val=mixture_val_batches(mixture, tc.micro_batch, tc.seq_len, tc.val_tokens, d.group),
            data_identity=mixture.identity(),
        )
    shards = read_manifest(manifest)
    # each rank reads its share of the data-parallel group's batches
    loader = ShardLoader(
        shards.files("train"), tc.micro_batch, tc.seq_len, tc.batch_tokens, d.group
    )
    val_file = shards.files("val")[0]
    val = val_batches(
        val_file, tc.micro_batch, tc.seq_len, tc.val_tokens, d.group, shards.eot,
        shards.byte_table(),
    )  # fmt: skip
    return Task(train=tc, loader=loader, val=val, data_identity=shards.identity())


def main(argv: list[str] | None = None) -> int:
    return worker_main(argv, pretraining, __doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
