"""Every kind of bad input exits 2 with one clear line on stderr and no traceback.

In this process (``cli_main``: the real command through ``main(argv)``, ``BadInput`` as exit 2 and
its one line, any other exception a failure with its traceback): what matters is what the command
decides. One case through a real process (``test_missing_path``: the console script's exit code
and stderr); tests/unit/cli/test_entry_point.py has a usage error the same way."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file


def _ok_file(path):
    save_file({"w": torch.ones(4, 4), "b": torch.zeros(4)}, str(path))
    return path


def _assert_clean_error(res, *needles):
    assert res.code == 2, (res.code, res.stderr)
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n.lower() in lines[0].lower(), lines[0]


def test_missing_path(cli, tmp_path):
    _assert_clean_error(cli("scan", tmp_path / "nope.safetensors", json_report=False), "not found")


def test_directory_without_safetensors(cli_main, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "readme.txt").write_text("hi")
    _assert_clean_error(cli_main("scan", tmp_path / "d", json_report=False), "no *.safetensors")


def test_truncated_file(cli_main, tmp_path):
    f = _ok_file(tmp_path / "m.safetensors")
    data = f.read_bytes()
    f.write_bytes(data[:-10])
    _assert_clean_error(cli_main("scan", f, json_report=False), "truncated")


def test_garbage_header_length(cli_main, tmp_path):
    f = tmp_path / "g.safetensors"
    f.write_bytes(struct.pack("<Q", 10**15) + b"{}" + b"\0" * 64)
    _assert_clean_error(cli_main("scan", f, json_report=False), "header length")


def test_tiny_file(cli_main, tmp_path):
    f = tmp_path / "t.safetensors"
    f.write_bytes(b"abc")
    _assert_clean_error(cli_main("scan", f, json_report=False), "too short")


def test_header_not_json(cli_main, tmp_path):
    f = tmp_path / "h.safetensors"
    body = b"this is not json at all!"
    f.write_bytes(struct.pack("<Q", len(body)) + body)
    _assert_clean_error(cli_main("scan", f, json_report=False), "not valid JSON")


def test_index_naming_missing_shard(cli_main, tmp_path):
    _ok_file(tmp_path / "model-00001-of-00002.safetensors")
    idx = {
        "metadata": {},
        "weight_map": {"w": "model-00001-of-00002.safetensors", "x": "model-00002-of-00002.safetensors"},
    }
    p = tmp_path / "model.safetensors.index.json"
    p.write_text(json.dumps(idx))
    _assert_clean_error(cli_main("scan", p, json_report=False), "model-00002-of-00002.safetensors", "missing")


def test_unknown_dtype(cli_main, tmp_path):
    f = _ok_file(tmp_path / "m.safetensors")
    _assert_clean_error(cli_main("scan", f, "--dtype", "fp12", json_report=False), "unknown dtype")


def test_json_into_missing_directory(cli_main, tmp_path):
    f = _ok_file(tmp_path / "m.safetensors")
    _assert_clean_error(
        cli_main("scan", f, "--json", tmp_path / "no" / "such" / "r.json", json_report=False),
        "does not exist",
    )


def test_wrong_arch_keys(cli_main, tmp_path):
    f = _ok_file(tmp_path / "m.safetensors")
    arch = tmp_path / "arch.py"
    arch.write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 4)\n")
    _assert_clean_error(
        cli_main("scan", f, "--arch", f"{arch}:build", json_report=False), "missing", "weight"
    )


def test_arch_file_missing(cli_main, tmp_path):
    f = _ok_file(tmp_path / "m.safetensors")
    _assert_clean_error(
        cli_main("scan", f, "--arch", f"{tmp_path}/nope.py:build", json_report=False), "not found"
    )


@pytest.fixture
def linear_ckpt(tmp_path):
    arch = tmp_path / "arch.py"
    arch.write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 4)\n")
    lin = torch.nn.Linear(4, 4)
    save_file(lin.state_dict(), str(tmp_path / "lin.safetensors"))
    return tmp_path / "lin.safetensors", f"{arch}:build"


def test_input_names_not_in_forward(cli_main, tmp_path, linear_ckpt):
    ck, arch = linear_ckpt
    save_file({"x": torch.ones(2, 4)}, str(tmp_path / "in.safetensors"))
    _assert_clean_error(
        cli_main("scan", ck, "--arch", arch, "--inputs", tmp_path / "in.safetensors", json_report=False),
        "'x'",
        "input",
    )


def test_empty_dataset(cli_main, tmp_path, minilm_dir):
    d = tmp_path / "empty.jsonl"
    d.write_text("\n")
    _assert_clean_error(cli_main("scan", minilm_dir, "--data", d, json_report=False), "empty data set")


def test_bad_jsonl_line(cli_main, tmp_path, minilm_dir):
    d = tmp_path / "bad.jsonl"
    d.write_text('{"text": "ok"}\nnot json\n')
    _assert_clean_error(cli_main("scan", minilm_dir, "--data", d, json_report=False), "bad.jsonl:2")


def test_prompt_without_tokenizer(cli_main, tmp_path, linear_ckpt):
    ck, arch = linear_ckpt
    _assert_clean_error(
        cli_main("scan", ck, "--arch", arch, "--prompt", "hi", json_report=False), "tokenizer"
    )


def test_pickle_is_never_unpickled(cli_main, tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    p = tmp_path / "evil.pt"
    p.write_bytes(pickle.dumps({"w": Evil()}))
    res = cli_main("scan", p, json_report=False)
    _assert_clean_error(res, "weights_only")
    assert "pwned" not in res.stdout


def test_checkpoint_is_never_modified(cli_main, tmp_path, linear_ckpt):
    ck, arch = linear_ckpt
    before = ck.read_bytes()
    save_file({"input": torch.full((2, 4), 1e5)}, str(tmp_path / "in.safetensors"))
    cli_main("scan", ck, "--arch", arch, "--inputs", tmp_path / "in.safetensors", "--dtype", "fp16")
    assert ck.read_bytes() == before


# --- data lines and --inputs files are validated, one line each (issue 19) --------------------

BAD_LINES = {
    "not-utf8": (b'{"text": "ok"}\n{"text": "caf\xe9"}\n', "bad.jsonl:2", "not UTF-8"),
    "text-null": (b'{"text": "ok"}\n{"text": null}\n', "bad.jsonl:2", '"text" must be a string, got null'),
    "nested-100000": (
        b'{"text": "ok", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        "bad.jsonl:1",
        "deeper than 127",
    ),
    "text-number": (b'{"text": 3}\n', "bad.jsonl:1", '"text" must be a string, got int'),
    "text-empty": (b'{"text": ""}\n', "bad.jsonl:1", '"text" is empty'),
    "not-an-object": (b'["text"]\n', "bad.jsonl:1", "JSON object"),
    "nan-constant": (b'{"text": "ok", "x": NaN}\n', "bad.jsonl:1", "not valid JSON"),
    "unclosed": (b'{"text": "ok"\n', "bad.jsonl:1", "not valid JSON"),
}
CLI_LINES = ["not-utf8", "text-null", "nested-100000"]  # through the command; all of them through read_jsonl


@pytest.mark.parametrize("case", CLI_LINES)
def test_bad_data_lines_cli(cli_main, tmp_path, minilm_dir, case):
    body, where, needle = BAD_LINES[case]
    d = tmp_path / "bad.jsonl"
    d.write_bytes(body)
    res = cli_main("scan", minilm_dir, "--data", d, json_report=False)
    _assert_clean_error(res, where, needle)
    assert "None" not in res.stderr and res.stdout == ""


@pytest.mark.parametrize("case", BAD_LINES, ids=list(BAD_LINES))
def test_bad_data_lines(tmp_path, case):
    from nan_hunter.errors import BadInput
    from nan_hunter.model.inputs import read_jsonl

    body, where, needle = BAD_LINES[case]
    d = tmp_path / "bad.jsonl"
    d.write_bytes(body)
    with pytest.raises(BadInput) as e:
        read_jsonl(str(d))
    msg = str(e.value)
    assert "\n" not in msg and where in msg and needle.lower() in msg.lower(), msg


def test_huge_data_line_is_truncated_to_the_model_length_with_a_note(cli_main, tmp_path, minilm_dir):
    d = tmp_path / "long.jsonl"
    d.write_text(
        json.dumps({"text": "word " * ((4 << 20) // 5 + 1)}) + "\n" + json.dumps({"text": "short"}) + "\n"
    )
    assert d.stat().st_size > 4 << 20
    res = cli_main("scan", minilm_dir, "--data", d)
    assert res.code == 0, res.stderr
    notes = " ".join(res.report["notes"])
    assert "truncated to 512 tokens: long.jsonl:1" in notes, notes
    assert res.report["run"]["n_inputs"] == 2


def test_inputs_file_goes_through_the_strict_parser(cli_main, tmp_path, linear_ckpt):
    ck, arch = linear_ckpt
    h = b'{"input":{"dtype":"F32","shape":[1,4],"data_offsets":[0,16]},"input":{"dtype":"F32","shape":[1,4],"data_offsets":[0,16]}}'
    p = tmp_path / "in.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 16)
    _assert_clean_error(
        cli_main("scan", ck, "--arch", arch, "--inputs", p, json_report=False), str(p), "given twice"
    )
