"""Fuzz the whole scan: mutated safetensors files and mutated checkpoint indexes.

Seeded and bounded. Every case goes through ``nan_hunter.scan`` (in a child process with a
capped address space, ``scan_cases.py``) and a sample through the real CLI. Every case must
end in exit 0, 1 or 2 (2: one line, nothing else), within seconds, without reading outside its
checkpoint directory, without leaking the outside file's tensor name, and without changing any
input file's bytes.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import torch
from clirun import ROOT, cli_env, invoke
from safetensors.torch import save_file
from safetensors_mutations import mutated_file, mutated_index

SEED = 1919
N_FILES = 220
N_INDEXES = 80
N_CLI = 6
SECRET = "LEAKED_SECRET_TENSOR"
HERE = Path(__file__).resolve().parent


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _index_case(d: Path, rng: random.Random) -> tuple[Path, bool]:
    ck, out = d / "ck", d / "outside"
    ck.mkdir(parents=True)
    out.mkdir()
    save_file({"w": torch.ones(3)}, str(ck / "shard-1.safetensors"))
    save_file({"v": torch.tensor([1.0, float("nan")])}, str(ck / "shard-2.safetensors"))
    save_file({SECRET: torch.full((2,), float("inf"))}, str(out / "secret.safetensors"))
    text, hostile = mutated_index(rng, SECRET)
    text = text.replace("ABSOLUTE", str(out / "secret.safetensors"))
    if "link.safetensors" in text:
        (ck / "link.safetensors").symlink_to("../outside/secret.safetensors")
    if "linkdir" in text:
        (ck / "linkdir").symlink_to("../outside", target_is_directory=True)
    (ck / "model.safetensors.index.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    return (ck / "model.safetensors.index.json" if rng.random() < 0.7 else ck), hostile


def test_scan_fuzz(tmp_path):
    rng = random.Random(SEED)
    cases = []
    for i in range(N_FILES):
        d = tmp_path / f"f{i}"
        d.mkdir()
        p = d / "model.safetensors"
        c = mutated_file(rng)
        p.write_bytes(c.data)
        cases.append({"id": i, "path": str(p), "steps": c.steps, "hostile": False})
    for j in range(N_INDEXES):
        d = tmp_path / f"i{j}"
        target, hostile = _index_case(d, rng)
        cases.append(
            {"id": N_FILES + j, "path": str(target), "outside": str(d / "outside"), "hostile": hostile}
        )
    warm = tmp_path / "warm.safetensors"
    save_file({"w": torch.ones(4)}, str(warm))
    before = _hashes(tmp_path)
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps({"warmup": str(warm), "secret": SECRET, "cases": cases}))
    results = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, str(HERE / "scan_cases.py"), str(spec), str(results)],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {r["id"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert len(got) == len(cases)
    codes = []
    for c in cases:
        r = got[c["id"]]
        assert r["code"] in (0, 1, 2), (c, r)
        if r["code"] == 2:
            assert "\n" not in r["msg"] and r["msg"].strip(), (c, r)
        assert not r["leak"], (c, r)
        assert not r.get("opened_outside"), (c, r)
        if c["hostile"]:
            assert r["code"] == 2, (c, r)
        assert r["seconds"] < 20, (c, r)
        codes.append(r["code"])
    assert {0, 1, 2} <= set(codes)  # the cases reach every outcome
    assert _hashes(tmp_path / "f0").keys()  # sanity: hashing saw the files
    after = {k: v for k, v in _hashes(tmp_path).items() if k in before}
    assert after == before

    # a sample through the real CLI (in this process): the same verdict, one line for exit 2, no traceback
    sample = [c for c in cases if got[c["id"]]["code"] == 2][: N_CLI // 2]
    sample += [c for c in cases if got[c["id"]]["code"] in (0, 1)][: N_CLI - len(sample)]
    for c in sample:
        res = invoke("scan", c["path"], "--json", "-")
        assert res.code == got[c["id"]]["code"], (c, res.stderr)
        assert "Traceback" not in res.stderr and SECRET not in res.stdout + res.stderr
        if res.code == 2:
            assert [ln for ln in res.stderr.splitlines() if ln.strip()] == [
                f"nanhunter: error: {got[c['id']]['msg']}"
            ]
        else:
            assert json.loads(res.stdout)["schema"] == "nanhunter.report/v1"
    assert _hashes(tmp_path).items() >= before.items()
