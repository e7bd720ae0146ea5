"""The prepared conversations (lmpipe.chat.data) against the output its docstring promises:
`{split}_inputs.npy` / `{split}_targets.npy` int32 (rows, seq_len), padded with end-of-text and -1,
a manifest with the counts; sources read from a JSON list or JSON lines; a stable split by id."""

from __future__ import annotations

import hashlib
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import TOKENIZER_DIR
from lmpipe.chat import data
from lmpipe.chat.template import check_conversation, render
from lmpipe.config import ConfigError, ConversationsConfig, canonical_json
from lmpipe.data.tokenizer import EOT, EOT_ID, gpt2_encoding

ENC = gpt2_encoding(str(TOKENIZER_DIR))


def chat(cid: str, reply: str = "Hello") -> dict:
    return {
        "id": cid,
        "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": reply}],
    }


REPLY = [{"from": "gpt", "value": "ok"}]


def config(**kw) -> ConversationsConfig:
    return ConversationsConfig(
        **({"dataset": "c", "source": "local", "seq_len": 64, "val_percent": 50.0} | kw)
    )


def test_split_0_percent_holds_out_nothing_100_everything_and_sets_nest():
    """val_percent p holds out a share p of ids; a larger share holds out a superset."""
    ids = [f"c{i}" for i in range(400)]
    assert {data.split_of(i, 0) for i in ids} == {"train"}
    assert {data.split_of(i, 100) for i in ids} == {"val"}
    at = {p: {i for i in ids if data.split_of(i, p) == "val"} for p in (5, 30, 60)}
    assert at[5] <= at[30] <= at[60]
    assert 0.2 < len(at[30]) / 400 < 0.4 and 0.5 < len(at[60]) / 400 < 0.7


def test_prepare_refuses_an_unknown_template_and_an_empty_split():
    """A template not in TEMPLATES, or a split left without conversations, is an error."""
    with pytest.raises(ValueError, match="template 'alpaca' unknown"):
        data.prepare([chat("a")], config(template="alpaca"), ENC)
    with pytest.raises(ValueError, match=r"datasets\.c: no val conversations left out of 3"):
        data.prepare([chat("a"), chat("b"), chat("c")], config(val_percent=0.0), ENC)


def test_written_arrays_and_manifest_follow_the_format(tmp_path, capsys):
    """int32 (rows, seq_len) arrays padded with EOT / -1, and a manifest with every count."""
    huge = {"id": "huge", "conversations": [{"from": "human", "value": "z " * 80}] + REPLY}
    records = [chat(f"c{i}") for i in range(6)] + [{"id": "bad"}, huge, {"conversations": []}]
    records += [chat(f"d{i}") for i in range(6)] + [chat("long", "word " * 40)]
    cfg = config(on_malformed="skip")
    m = data.write(data.prepare(records, cfg, ENC), cfg, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "manifest.json",
        "train_inputs.npy",
        "train_targets.npy",
        "val_inputs.npy",
        "val_targets.npy",
    ]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == m
    assert m["conversations"] == 16 and m["kept"]["train"] + m["kept"]["val"] == 13
    assert m["skipped"] == {"malformed": 2, "too_long": 1} and m["too_long_ids"] == ["huge"]
    assert (m["truncated"], m["truncated_ids"]) == (1, ["long"])
    assert m["seq_len"] == 64 and m["eot"] == EOT_ID and m["ignore_index"] == -1
    assert m["dataset"] == "c" and m["kind"] == "conversations" and m["template"] == "vicuna_v1.1"
    assert (m["tokenizer"], m["val_percent"], m["on_malformed"]) == ("gpt2", 50.0, "skip")
    assert "'bad'" in m["malformed_examples"][0] and "'#8'" in m["malformed_examples"][1]
    assert "skipped: conversation 'bad'" in capsys.readouterr().out
    for split in ("train", "val"):
        x = np.load(tmp_path / "out" / f"{split}_inputs.npy", allow_pickle=False)
        y = np.load(tmp_path / "out" / f"{split}_targets.npy", allow_pickle=False)
        assert x.dtype == y.dtype == np.int32 and x.shape == y.shape == (m["kept"][split], 64)
        assert m["target_tokens"][split] == int((y != -1).sum())
        short = x[y[:, -1] == -1]  # rows that end in padding: end-of-text
        assert (short[:, -1] == EOT_ID).all()
    for entry in m["shards"]:
        digest = hashlib.sha256((tmp_path / "out" / entry["file"]).read_bytes()).hexdigest()
        assert entry["sha256"] == digest
        assert entry["file"] == f"{entry['split']}_{entry['array']}.npy"
        assert entry["rows"] == m["kept"][entry["split"]]


def test_the_manifest_lists_at_most_50_ids_of_each_kind(tmp_path):
    """The counts are whole; the listed ids stop at MAX_LISTED_IDS."""
    records = [chat(f"c{i}") for i in range(10)] + [{"id": f"bad{i}"} for i in range(60)]
    cfg = config(on_malformed="skip")
    m = data.write(data.prepare(records, cfg, ENC), cfg, tmp_path / "out")
    assert m["skipped"]["malformed"] == 60 and len(m["malformed_examples"]) == 50


def test_a_row_holds_seq_len_inputs_and_their_next_tokens(tmp_path):
    """A conversation of seq_len + 1 tokens fills a row untruncated; one token more is truncated."""
    _, turns = check_conversation(chat("a", "Hello there"), 0)
    tokens = ENC.encode(render(turns), allowed_special={EOT})
    exact = data.to_row(ENC, turns, seq_len=len(tokens) - 1)
    assert exact.truncated is False
    assert exact.inputs.tolist() == tokens[:-1] and exact.targets[-1] == EOT_ID
    assert exact.inputs.dtype == exact.targets.dtype == np.int32
    assert data.to_row(ENC, turns, seq_len=len(tokens) - 2).truncated is True


@pytest.mark.parametrize("form", ["list", "lines"])
def test_a_local_source_is_a_json_list_or_json_lines(tmp_path, form):
    """ShareGPT records from a JSON list or one JSON object a line (blank lines skipped)."""
    records = [chat("a"), chat("b")]
    path = tmp_path / "chats.json"
    text = json.dumps(records) if form == "list" else "\n".join(map(json.dumps, records)) + "\n\n"
    path.write_text(text)
    assert data.read_records(config(path=str(path))) == records


def test_a_bad_local_source_is_named(tmp_path):
    """Missing file, neither JSON nor JSON lines, or JSON that is not a list: errors naming it."""
    with pytest.raises(FileNotFoundError, match=r"datasets\.c\.path: .*nope\.json does not exist"):
        data.read_records(config(path=str(tmp_path / "nope.json")))
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": 1}\n{oops\n')
    with pytest.raises(
        ValueError, match=r"bad\.json: neither a JSON list \(line 2: .*\) nor JSON lines \(line 2: "
    ):
        data.read_records(config(path=str(bad)))
    bad.write_text('{"id": 1}')
    with pytest.raises(ValueError, match=r"bad\.json: expected a JSON list of conversations"):
        data.read_records(config(path=str(bad)))


def test_the_cli_prepares_a_local_file(tmp_path, capsys):
    """`python -m lmpipe.chat prepare`'s worker: config JSON in, arrays and manifest out."""
    path = tmp_path / "chats.json"
    path.write_text(json.dumps([chat(f"c{i}") for i in range(8)]))
    params = {
        "dataset": "c",
        "source": "local",
        "path": str(path),
        "seq_len": 64,
        "val_percent": 50.0,
    }
    data.main(
        [
            "--config-json",
            canonical_json(params),
            "--tokenizer",
            str(TOKENIZER_DIR),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["conversations"] == 8 and m["seq_len"] == 64 and m["dataset"] == "c"
    assert "c: 8 conversations ->" in capsys.readouterr().out


def test_a_hub_source_is_loaded_with_the_configs_repo_name_split_and_revision(monkeypatch):
    """source huggingface: datasets.load_dataset(repo, name, split=, revision=) as configured."""
    calls = []
    fake = SimpleNamespace(load_dataset=lambda *a, **k: calls.append((a, k)) or ["records"])
    monkeypatch.setitem(sys.modules, "datasets", fake)
    cfg = config(
        source="huggingface", repo="org/chats", name="en", split="train_sft", revision="v2"
    )
    assert data.read_records(cfg) == ["records"]
    assert calls == [(("org/chats", "en"), {"split": "train_sft", "revision": "v2"})]


def test_the_cli_requires_its_arguments_and_names_a_bad_config_key(tmp_path, capsys):
    """The CLI requires its three arguments, has --help, and names a bad config key."""
    with pytest.raises(SystemExit) as e:
        data.main([])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "the following arguments are required: --config-json, --tokenizer, --out" in err
    with pytest.raises(SystemExit):
        data.main(["--help"])
    assert "Conversations for chat fine-tuning (SFT)" in capsys.readouterr().out
    params = canonical_json({"dataset": "c", "source": "local", "seq_len": 64, "zz": 1})
    args = ["--config-json", params, "--tokenizer", str(TOKENIZER_DIR), "--out", str(tmp_path)]
    with pytest.raises(ConfigError, match="^datasets: unknown key 'zz'"):
        data.main(args)
