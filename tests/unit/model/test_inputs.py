"""nan_hunter/model/inputs.py: --inputs files, --prompt and --data lines, names checked against forward()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from nan_hunter.errors import BadInput
from nan_hunter.model.inputs import Batch, batch_notes, build_batches, check_names, forward_params, read_jsonl


class Takes(nn.Module):
    def forward(self, input_ids, attention_mask=None, *, scale=1.0):
        return input_ids


def test_forward_params_and_check_names():
    assert forward_params(Takes()) == (["input_ids", "attention_mask", "scale"], False)
    check_names(Takes(), ["input_ids", "scale"], "--inputs f")
    with pytest.raises(BadInput, match="'pixels' not an argument of Takes.forward"):
        check_names(Takes(), ["input_ids", "pixels"], "--inputs f")


def test_inputs_file_becomes_one_batch_of_owned_tensors(tmp_path):
    f = tmp_path / "in.safetensors"
    save_file({"input_ids": torch.tensor([[1, 2]])}, str(f))
    before = f.read_bytes()
    (b,) = build_batches(Takes(), None, [str(f)], None, None)
    assert b.label == "in.safetensors" and torch.equal(b.kwargs["input_ids"], torch.tensor([[1, 2]]))
    b.kwargs["input_ids"].fill_(0)
    assert f.read_bytes() == before
    save_file({"other": torch.ones(1)}, str(f))
    with pytest.raises(BadInput, match="not an argument"):
        build_batches(Takes(), None, [str(f)], None, None)
    save_file({}, str(f))
    with pytest.raises(BadInput, match="holds no tensors"):
        build_batches(Takes(), None, [str(f)], None, None)


def test_read_jsonl_texts_skip_blank_lines_and_a_bom(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_bytes(b'\xef\xbb\xbf{"text": "a"}\n\n{"text": "b", "x": 1}\n')
    assert read_jsonl(str(f)) == ["a", "b"]


@pytest.mark.parametrize(
    "content, words",
    [
        (b'{"text": "a"}\n[1]\n', "d.jsonl:2: expected a JSON object"),
        (b'{"txt": "a"}\n', '"text" field per line'),
        (b'{"text": 3}\n', "must be a string, got int"),
        (b'{"text": ""}\n', "is empty"),
        (b'{"text": "\xff"}\n', "not UTF-8"),
        (b"\n\n", "empty data set"),
    ],
)
def test_read_jsonl_bad_lines_name_file_and_line(tmp_path, content, words):
    f = tmp_path / "d.jsonl"
    f.write_bytes(content)
    with pytest.raises(BadInput, match=words):
        read_jsonl(str(f))


def test_prompts_need_a_tokenizer():
    with pytest.raises(BadInput, match="need a tokenizer"):
        build_batches(Takes(), None, None, ["hello"], None)


def test_prompts_are_tokenized_and_truncated_with_a_note(minilm_dir):
    """The real MiniLM tokenizer (model_max_length 512); the model is a plain module, so the
    tokenizer's maximum is the limit. (Imports transformers: seconds when run alone.)"""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    assert tok.model_max_length == 512
    short, long = build_batches(Takes(), tok, None, ["hello world", "word " * 600], None)
    assert short.label == "prompt 0" and short.truncated_to is None
    assert set(short.kwargs) == {"input_ids", "attention_mask"}  # token_type_ids: not an argument of Takes
    assert long.truncated_to == 512 and long.kwargs["input_ids"].shape[-1] == 512
    (note,) = batch_notes([short, long])
    assert "1 input(s)" in note and "truncated to 512 tokens: prompt 1" in note
    assert batch_notes([Batch("x", {})]) == []


@pytest.mark.parametrize(
    "given, items",
    [
        ("hello", ("hello",)),  # a string is one item, not five characters
        (Path("in.safetensors"), ("in.safetensors",)),
        (["a", "b"], ("a", "b")),
        (("a", Path("b")), ("a", "b")),
        ((x for x in ["a"]), ("a",)),  # any iterable of strings
        (None, ()),
        ([], ()),
    ],
)
def test_one_or_many_takes_a_string_as_one_item(given, items):
    from nan_hunter.model.inputs import one_or_many

    assert one_or_many(given, "prompts") == items


@pytest.mark.parametrize(
    "given, word",
    [
        (b"hello", "bytes"),
        (42, "int"),
        ({"a": 1}, "dict"),
        ([1, 2], "item of type int"),
        (["a", None], "NoneType"),
    ],
)
def test_one_or_many_refuses_what_is_not_text(given, word):
    from nan_hunter.model.inputs import one_or_many

    with pytest.raises(BadInput, match=f"prompts: .*{word}"):
        one_or_many(given, "prompts")


def test_one_path_is_one_file():
    from nan_hunter.model.inputs import one_path

    assert one_path("d.jsonl", "data") == "d.jsonl" and one_path(Path("d.jsonl"), "data") == "d.jsonl"
    assert one_path(None, "data") is None
    with pytest.raises(BadInput, match="data: expected one file name"):
        one_path(["a.jsonl", "b.jsonl"], "data")
