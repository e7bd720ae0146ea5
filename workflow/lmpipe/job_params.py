"""A job's params in a file, for its shell command to name rather than hold.

Each rule keeps a job's settings as a Snakemake param (canonical JSON, lmpipe.config's
`*_params`): Snakemake reruns a job whose params changed. Its shell command passes them as
`--config-json @results/params/<sha256>.json`, a file holding that JSON on one line, which the
stage's argparse reads in place of the argument (`fromfile_prefix_chars="@"`, argparse's own
mechanism). So a command, and what a dry run prints with `-p` (the `slurm` profile sets it), is a
line of paths, not kilobytes of JSON; and the same command runs by hand, under SLURM (the
results folder is on the shared file system every job reads), or with the JSON itself.

The file is named by its content and written by the Snakefile when it plans the job (atomically,
once: equal params are one file), never by a dry run, so a job finds its file whatever node it
runs on, and a changed setting is another file.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

PREFIX = "@"  # the stages' argparse fromfile_prefix_chars


def params_file(text: str, folder: str | Path, write: bool = True) -> str:
    """`@FILE`: the file under `folder` that holds `text` (one line), named by its sha256;
    written unless it is there already or `write` is false (a dry run)."""
    if "\n" in text:
        raise ValueError("a params file holds one line: argparse reads a line an argument")
    path = Path(folder) / f"{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"
    if write and not path.is_file():
        # a temporary name of this process's own: the planning Snakemake and a job's own (under
        # SLURM, on another node) may write the same file at once
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, path)
    return f"{PREFIX}{path}"
