"""lmpipe.manifests: every manifest.json written and read through one module, in the formats the
stages have always written (older results folders still read), a broken one an error naming it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import REPO
from lmpipe import manifests
from lmpipe.manifests import ManifestError, ManifestNotFound

PACKAGE = REPO / "workflow" / "lmpipe"
# a raw read or write of a file: what a manifest's writer or reader must leave to lmpipe.manifests
RAW_IO = re.compile(
    r"json\.loads?\(|json\.dumps?\(|\.read_text\(|\.write_text\(|write_text_atomic\(|atomic_file\("
)


def raw_manifest_io(root: Path) -> list[str]:
    """Each line of code under `root` (lmpipe.manifests left out) that reads or writes a file raw
    where it names a manifest: `path:line: code`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "manifests.py" and path.parent == root:
            continue
        for i, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if "manifest" in code.lower() and RAW_IO.search(code):
                found.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    return found


def test_no_manifest_is_read_or_written_outside_the_module():
    assert raw_manifest_io(PACKAGE) == []


def test_the_check_finds_a_planted_raw_read(tmp_path):
    root = tmp_path / "lmpipe"
    (root / "data").mkdir(parents=True)
    (root / "manifests.py").write_text("x = json.loads(manifest.read_text())\n")  # the module's own
    (root / "data" / "planted.py").write_text(
        "import json\n\ndef shards(d):\n    return json.loads((d / 'manifest.json').read_text())\n"
    )
    assert raw_manifest_io(root) == [
        "data/planted.py:4: return json.loads((d / 'manifest.json').read_text())"
    ]


# ---- the formats as the stages write them ----


def test_a_tokens_manifest_reads_as_tokenize_writes_it(tmp_path):
    path = tmp_path / "tokens" / "manifest.json"
    manifests.write(path, {
        "dataset": "embedded", "tokenizer": "gpt2", "eot": 50256,
        "token_bytes": {"file": "token_bytes.npy", "how": "tiktoken"},
        "shards": [{"file": "v.bin", "split": "val", "tokens": 10, "sha256": "ab"},
                   {"file": "t.bin", "split": "train", "tokens": 30, "sha256": "cd"}],
    })  # fmt: skip
    assert json.loads(path.read_text())["shards"][0]["file"] == "v.bin"  # the JSON as given
    m = manifests.read_tokens(path)
    assert m.files("val") == [path.parent / "v.bin"] and m.tokens("train") == 30
    assert m.token_bytes == path.parent / "token_bytes.npy" and m.tokenizer == "gpt2"
    assert m.identity() == ["ab", "cd"] and m.dataset == "embedded"


def test_an_older_tokens_manifest_still_reads(tmp_path):
    """Written before the byte table and the eot: GPT-2's, no bits per byte."""
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"shards": [{"file": "a.bin", "split": "val"}]}))
    m = manifests.read_tokens(path)
    assert m.eot == manifests.GPT2_EOT and m.token_bytes is None and m.byte_table() is None
    assert m.tokens("val") == 0 and m.identity() == ["a.bin"]


def test_each_kind_reads_back(tmp_path):
    raw = tmp_path / "raw" / "manifest.json"
    manifests.write(raw, {"source": {"kind": "local"}, "files": [{"file": "a.jsonl", "rows": 3}]})
    assert manifests.read_raw(raw).files[0].file == raw.parent / "a.jsonl"
    mix = tmp_path / "mix" / "tokens" / "manifest.json"
    manifests.write(mix, {"dataset": "m", "mixture": {"a": {"weight": 1.0, "manifest": "x.json"}}})
    assert manifests.is_mixture(mix) and manifests.read_mixture(mix).sources["a"][0] == 1.0
    conv = tmp_path / "sft" / "manifest.json"
    manifests.write(conv, {"kind": "conversations", "seq_len": 8, "kept": {"val": 2},
                           "shards": [{"file": "v.npy", "split": "val", "array": "inputs"}]},
                    indent=1)  # fmt: skip
    assert manifests.read_conversations(conv).rows("val") == 2
    suite = tmp_path / "suite" / "manifest.json"
    manifests.write(suite, {"package": "p==1", "tasks": {"copa": {"folder": "copa"}}}, indent=1)
    assert manifests.read_suite(suite).folder("copa") == suite.parent / "copa"
    tok = tmp_path / "tok" / "manifest.json"
    manifests.write(tok, {"name": "t", "vocab_size": 300, "eot": 299})
    assert manifests.read_tokenizer(tok).vocab_size == 300


@pytest.mark.parametrize(
    "text,message",
    [
        (None, "tokens manifest not found"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a tokens manifest (a JSON list)"),
        ('{"shards": [{"split": "val"}]}', "not a tokens manifest (`shards`, each with `file`"),
    ],
    ids=["missing", "bad_json", "not_an_object", "no_file"],
)
def test_a_broken_manifest_is_one_error_naming_the_file(tmp_path, text, message):
    path = tmp_path / "manifest.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ManifestError) as e:
        manifests.read_tokens(path)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)
    assert isinstance(e.value, FileNotFoundError) == (text is None)
    assert isinstance(e.value, ManifestNotFound) == (text is None)
