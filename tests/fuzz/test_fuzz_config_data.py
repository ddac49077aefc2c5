"""Seeded fuzzing of the files a user hands over besides checkpoints: ``--config`` YAML and
``--data`` JSONL. Every mutation must either load or be refused with ``BadInput`` (exit 2) in
one line, quickly and with bounded memory; nothing else may escape (no RecursionError,
MemoryError, TypeError...). A few cases also go through the real CLI."""

from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path

import pytest
import yaml

from nan_hunter.config import CONFIG_DIR, load_config
from nan_hunter.errors import BadInput
from nan_hunter.model.inputs import read_jsonl

SEEDS = (0, 1, 2)
CASES_PER_SEED = 150
VALUES = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    1e400,
    "abc",
    "1e-4",
    "fp16",
    "int8",
    [],
    [1, 2],
    {},
    {"a": 1},
    "&anchor",
    "*alias",
    "\x1b[2J",
    "ü",
    10**50,
    "nan",
    ".inf",
    "-.inf",
]
TEXTS = [
    '{"text": "the quick brown fox"}',
    '{"text": null}',
    '{"text": 3}',
    '{"txt": "a"}',
    "[1, 2]",
    "not json",
    '{"text": "' + "a" * 5000 + '"}',
    '{"text": "\\u0000\\u001b[2J"}',
    "{" * 1000 + "}" * 1000,
    "",
    '"just a string"',
    '{"text": ""}',
    '{"text": "ok", "extra": {"deep": [[[[1]]]]}}',
]


def _default_tree() -> dict:
    merged: dict = {}
    for name in ("default.yaml", "ci.yaml"):
        merged.update(yaml.safe_load((CONFIG_DIR / name).read_text()))
    return merged


def _mutate_config(rng: random.Random, tree: dict) -> str:
    """A YAML text: the shipped configuration with one to three keys changed, removed, renamed
    or given a hostile value, or raw bytes spliced in."""
    data = yaml.safe_load(yaml.safe_dump(tree))
    for _ in range(rng.randint(1, 3)):
        sec = rng.choice(list(data))
        target = data if not isinstance(data[sec], dict) or rng.random() < 0.3 else data[sec]
        key = rng.choice(list(target)) if target else sec
        op = rng.random()
        if op < 0.6:
            target[key] = rng.choice(VALUES)
        elif op < 0.8:
            target.pop(key, None)
        else:
            target[key + rng.choice(["_", "x", "s"])] = target.pop(key, 1)
    text = yaml.safe_dump(data, allow_unicode=True)
    if rng.random() < 0.2:
        cut = rng.randrange(len(text))
        text = (
            text[:cut]
            + rng.choice(["\t", ": :", "[", "&a x\nb: *a", "\x00", "!!python/object:os.system"])
            + text[cut:]
        )
    return text


@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_configs_load_or_exit_2(tmp_path, seed):
    rng = random.Random(seed)
    tree = _default_tree()
    path = tmp_path / "c.yaml"
    t0 = time.monotonic()
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(CASES_PER_SEED):
        path.write_text(_mutate_config(rng, tree), encoding="utf-8", errors="surrogatepass")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        try:
            load_config(str(path))
            outcomes["loaded"] += 1
        except BadInput as e:
            msg = str(e)
            assert "\n" not in msg and str(path) in msg, msg
            outcomes["refused"] += 1
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # the input is never written
    assert outcomes["refused"] > CASES_PER_SEED // 3 and outcomes["loaded"] > 0, outcomes
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_data_files_load_or_exit_2(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "d.jsonl"
    for _ in range(CASES_PER_SEED // 3):
        lines = [rng.choice(TEXTS) for _ in range(rng.randint(1, 4))]
        raw = "\n".join(lines).encode()
        if rng.random() < 0.2:
            cut = rng.randrange(len(raw) + 1)
            raw = raw[:cut] + rng.choice([b"\xff", b"\xc3", b"\x00", b"\r\n"]) + raw[cut:]
        path.write_bytes(raw)
        try:
            texts = read_jsonl(str(path))
        except BadInput as e:
            assert "\n" not in str(e)
            continue
        assert texts and all(isinstance(t, str) and t for t in texts)


def test_config_and_data_through_the_cli(cli_main, tmp_path):
    """A bad config and a bad data file through the real command: exit 2, one stderr line."""
    bad_cfg = tmp_path / "bad.yaml"
    bad_cfg.write_text("near_miss: {overflow_fraction: abc}\n")
    bad_data = tmp_path / "bad.jsonl"
    bad_data.write_bytes(b'{"text": "ok"}\n{"text": null}\n')
    model = Path(__file__).resolve().parents[2] / "examples" / "tiny-llama-fp16"
    for args in (("--config", bad_cfg, "--prompt", "hello"), ("--data", bad_data)):
        res = cli_main("scan", model, *args, json_report=False)
        assert res.code == 2, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
