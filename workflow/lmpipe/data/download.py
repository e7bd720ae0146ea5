"""The download stage: raw text into `results/data/{dataset}/raw/`, plus a manifest.

Sources:
- `huggingface`: the parquet files of a dataset config (e.g. HuggingFaceFW/fineweb, sample-10BT),
  fetched file by file with `huggingface_hub.hf_hub_download`. It downloads to an `.incomplete` file
  and renames when done, and resumes it on the next call, so an interrupted download never leaves a
  partial file that counts. Files already present with the expected size are not fetched again.
  `HF_TOKEN` is honoured by huggingface_hub itself; this module never prints or stores it.
- `local`: a parquet or jsonl file (the embedded default), or a plain .txt file (one document),
  copied in.

The manifest (`manifest.json`: files, rows, bytes, sha256) is written last and atomically: its
presence means the download is complete. It is the rule's only declared output, so a failed job
leaves the already-downloaded files in place for the retry.

This is the only stage that uses the network; the Snakefile runs it as a local rule.

    python -m lmpipe.data download --config-json J --out results/data/D/raw
    python -m lmpipe.data download --hellaswag --out results/data/hellaswag/hellaswag_val.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from tqdm import tqdm

from lmpipe import manifests
from lmpipe.config import SourceConfig, build
from lmpipe.files import atomic_file, sha256_file

log = logging.getLogger("lmpipe.download")

MANIFEST = manifests.MANIFEST


def count_rows(path: Path) -> int:
    """Rows of a parquet file (from its footer), lines of a jsonl file; a .txt file is one."""
    if path.suffix == ".parquet":
        return pq.ParquetFile(path).metadata.num_rows
    if path.suffix == ".txt":
        return 1
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def write_manifest(out: Path, files: list[Path], source: dict[str, Any]) -> dict[str, Any]:
    """Describe the downloaded files; written to a temp name and renamed (atomic)."""
    entries = []
    for path in tqdm(files, desc="hashing", unit="file", file=sys.stderr):
        entries.append(
            {
                "file": str(path.relative_to(out)),
                "bytes": path.stat().st_size,
                "rows": count_rows(path),
                "sha256": sha256_file(path),
            }
        )
    manifest = {
        "source": source,
        "files": entries,
        "rows": sum(e["rows"] for e in entries),
        "bytes": sum(e["bytes"] for e in entries),
    }
    manifests.write(out / MANIFEST, manifest)
    return manifest


def fetch_local(cfg: SourceConfig, out: Path) -> list[Path]:
    src = Path(cfg.path)
    if not src.is_file():
        raise FileNotFoundError(f"dataset path {src}: no such file")
    if src.suffix not in (".parquet", ".jsonl", ".txt"):
        raise ValueError(f"dataset path {src}: expected a .parquet, .jsonl or .txt file")
    dest = out / src.name
    with atomic_file(dest) as tmp:
        shutil.copyfile(src, tmp)
    return [dest]


def hub_data_files(cfg: SourceConfig) -> list[str]:
    """The repo paths of the config's parquet files, as the dataset card's `configs:` names them."""
    import datasets

    builder = datasets.load_dataset_builder(cfg.repo, cfg.name, revision=cfg.revision)
    urls = [u for files in builder.config.data_files.values() for u in files]
    # resolved as hf://datasets/{repo}@{commit}/{path in the repo}
    return sorted({u.split("@", 1)[1].split("/", 1)[1] for u in urls if u.endswith(".parquet")})


def fetch_huggingface(cfg: SourceConfig, out: Path) -> list[Path]:
    from huggingface_hub import hf_hub_download

    log.info("HF_TOKEN %s", "is set (used, not shown)" if os.environ.get("HF_TOKEN") else "not set")
    files = hub_data_files(cfg)
    if cfg.max_files:
        files = files[: cfg.max_files]
    if not files:
        raise RuntimeError(f"{cfg.repo} ({cfg.name}): no parquet files found")
    log.info("%s (%s): %d parquet files", cfg.repo, cfg.name, len(files))
    paths = []
    for name in tqdm(files, desc="download", unit="file", file=sys.stderr):
        local = hf_hub_download(
            cfg.repo, name, repo_type="dataset", revision=cfg.revision, local_dir=out
        )
        paths.append(Path(local))
    return paths


def download_dataset(cfg: SourceConfig, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # the manifest marks completeness: not until the end
    if cfg.source == "local":
        files = fetch_local(cfg, out)
        source = {"source": "local", "path": cfg.path}
    else:
        files = fetch_huggingface(cfg, out)
        source = {"source": "huggingface", "repo": cfg.repo, "name": cfg.name}
        source["revision"] = cfg.revision
    return write_manifest(out, files, source)


def download_hellaswag(out_file: Path) -> None:
    """The full HellaSwag validation set, rewritten in rowanz's original jsonl format."""
    import datasets

    ds = datasets.load_dataset("Rowan/hellaswag", split="validation")
    with atomic_file(out_file) as tmp, open(tmp, "w") as f:
        for row in ds:
            row = dict(row)
            row["label"] = int(row["label"])
            f.write(json.dumps(row) + "\n")
    log.info("wrote %d HellaSwag items to %s", len(ds), out_file)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-json", help="lmpipe.config.download_params")
    parser.add_argument("--hellaswag", action="store_true", help="download HellaSwag validation")
    parser.add_argument("--out", required=True, type=Path, help="raw folder (or the jsonl file)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    if args.hellaswag:
        download_hellaswag(args.out)
        return
    if not args.config_json:
        parser.error("--config-json is required (unless --hellaswag)")
    cfg = build(SourceConfig, json.loads(args.config_json), "dataset")
    manifest = download_dataset(cfg, args.out)
    log.info(
        "%d files, %d rows, %d bytes -> %s",
        len(manifest["files"]),
        manifest["rows"],
        manifest["bytes"],
        args.out,
    )


if __name__ == "__main__":
    main()
