"""llm.c token shards and the manifest that lists them, as the data stage's modules name them.

The shard format is lmpipe.llmc_shards' (in the ground: the report reads shards too), the tokens
manifest lmpipe.manifests' (`read_manifest` is its `read_tokens`: the loaders, the val-loss
evaluation, the data's identity in the settings hash read it so).
"""

from __future__ import annotations

from lmpipe.llmc_shards import (
    FORMATS,
    GPT2_FORMAT,
    HEADER_BYTES,
    HEADER_INTS,
    LLAMA3_FORMAT,
    ShardError,
    ShardFormat,
    ShardHeader,
    header_bytes,
    read_header,
    read_shard,
    read_shard_header,
    shard_format,
    write_shard,
)
from lmpipe.manifests import GPT2_EOT, ManifestShard, TokensManifest
from lmpipe.manifests import read_tokens as read_manifest

__all__ = [
    "FORMATS", "GPT2_EOT", "GPT2_FORMAT", "HEADER_BYTES", "HEADER_INTS", "LLAMA3_FORMAT",
    "ManifestShard", "ShardError", "ShardFormat", "ShardHeader", "TokensManifest",
    "header_bytes", "read_header", "read_manifest", "read_shard", "read_shard_header",
    "shard_format", "write_shard",
]  # fmt: skip
