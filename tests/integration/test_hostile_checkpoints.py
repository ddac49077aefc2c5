"""Hostile and broken checkpoints through the real CLI: no checkpoint code ever runs, nothing
outside the checkpoint directory is read, no FIFO blocks, files larger than RAM scan with flat
memory, nothing is silently invented, and the checkpoint's bytes never change.

The command runs in this process (``run_main``) except where only a process of its own can tell:
every file it opens (an audit hook, which cannot be removed), a FIFO that must not block (a hang
is a timeout, not a stuck test run), peak memory and Ctrl-C."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from clirun import ROOT, cli_env
from safetensors.torch import save_file


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_error_line(res, *needles: str) -> str:
    """Exit 2 with exactly one line on stderr, no traceback, each needle in it; returns the line."""
    assert res.code == 2, (res.code, res.stderr[-3000:])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n.lower() in lines[0].lower(), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, minilm_dir) -> Path:
    """A tiny BertModel (real transformers checkpoint) with MiniLM's real tokenizer files."""
    from transformers import BertConfig, BertModel

    d = tmp_path_factory.mktemp("tiny-bert") / "bert"
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    BertModel(cfg).save_pretrained(d)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir / f, d / f)
    return d


def copy_of(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


# --- 1a. code shipped in a checkpoint never runs, and nothing prompts --------------------------

EVIL = "open({marker!r}, 'w').write('ran')\nimport os\nos.system('touch {marker}')\n"


@pytest.mark.parametrize("stdin", ["y\n", None], ids=["answers-y", "stdin-closed"])
def test_config_auto_map_code_never_runs_and_never_prompts(run_main, tiny_bert, tmp_path, stdin):
    d = copy_of(tiny_bert, tmp_path)
    marker = tmp_path / "MARKER"
    (d / "modeling_evil.py").write_text(EVIL.format(marker=str(marker)))
    (d / "configuration_evil.py").write_text(EVIL.format(marker=str(marker)))
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(
        model_type="evil-bert",
        architectures=["EvilModel"],
        auto_map={"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel"},
    )
    (d / "config.json").write_text(json.dumps(cfg))
    before = sha256(d / "model.safetensors")
    res = run_main("scan", d, "--json", "-", stdin=stdin)
    line = one_error_line(res, "custom code", "auto_map", "does not run", "--arch file.py:factory")
    assert res.stdout == ""  # no prompt, and --json - is not corrupted
    assert not marker.exists(), line
    assert not (d / "__pycache__").exists()
    assert sha256(d / "model.safetensors") == before


def test_tokenizer_auto_map_code_never_runs(run_main, tiny_bert, tmp_path):
    d = copy_of(tiny_bert, tmp_path)
    marker = tmp_path / "MARKER"
    (d / "tokenization_evil.py").write_text(EVIL.format(marker=str(marker)))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc.update(
        tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    )
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    res = run_main("scan", d, "--prompt", "hello", "--json", "-", stdin="y\n")
    one_error_line(res, "custom code", "tokenizer_config.json", "--arch file.py:factory")
    assert res.stdout == ""
    assert not marker.exists()
    # --inputs need no tokenizer: the model (built-in BertModel) runs, the tokenizer code still never does
    save_file({"input_ids": torch.tensor([[101, 7592, 102]])}, str(tmp_path / "ids.safetensors"))
    res = run_main("scan", d, "--inputs", tmp_path / "ids.safetensors", "--json", tmp_path / "r.json")
    assert res.code == 0, res.stderr
    assert json.loads((tmp_path / "r.json").read_text())["run"]["n_inputs"] == 1
    assert not marker.exists()


# --- 1b. nothing outside the checkpoint directory is read ----------------------------------------

SECRET = "LEAKED_SECRET_TENSOR"


@pytest.fixture
def index_layout(tmp_path):
    """ck/ holds a real shard; outside/secret.safetensors (a NaN tensor named SECRET) sits beside it."""
    ck, out = tmp_path / "ck", tmp_path / "outside"
    ck.mkdir()
    out.mkdir()
    save_file({"w": torch.ones(4)}, str(ck / "shard-1.safetensors"))
    save_file({SECRET: torch.full((4,), float("nan"))}, str(out / "secret.safetensors"))
    return ck, out


def write_index(ck: Path, shard_name: str) -> Path:
    idx = ck / "model.safetensors.index.json"
    idx.write_text(
        json.dumps({"metadata": {}, "weight_map": {"w": "shard-1.safetensors", SECRET: shard_name}})
    )
    return idx


ESCAPES = {
    "etc-passwd": ("/etc/passwd", "absolute path"),
    "absolute": (None, "absolute path"),  # the secret file's own absolute path
    "dot-dot": ("../outside/secret.safetensors", "'..'"),
    "dot-dot-inside": ("sub/../../outside/secret.safetensors", "'..'"),
    "symlink-out": ("link.bin", "outside the checkpoint directory"),
}


@pytest.mark.parametrize("case", ESCAPES, ids=list(ESCAPES))
def test_index_shards_must_stay_inside(run_main, index_layout, case):
    ck, out = index_layout
    name, needle = ESCAPES[case]
    if case == "symlink-out":
        (ck / "link.bin").symlink_to(out / "secret.safetensors")  # not *.safetensors: only the index names it
        name = "link.bin"
    idx = write_index(ck, name or str(out / "secret.safetensors"))
    before = sha256(out / "secret.safetensors")
    for target in (idx, ck):  # the index itself, and the directory holding it
        res = run_main("scan", target, "--json", "-")
        one_error_line(res, needle, "nothing outside")
        assert SECRET not in res.stdout + res.stderr
        assert "root:" not in res.stdout + res.stderr  # no byte of /etc/passwd
    assert sha256(out / "secret.safetensors") == before


def test_directory_file_symlinked_out_is_refused(run_main, index_layout):
    ck, out = index_layout
    (ck / "link.safetensors").symlink_to(out / "secret.safetensors")
    res = run_main("scan", ck)  # no index: ck's *.safetensors, one of them a link out
    one_error_line(res, "link.safetensors", "outside the checkpoint directory")
    assert SECRET not in res.stdout + res.stderr


AUDIT_DRIVER = r"""
import os, sys
log = open(sys.argv[1], "w")
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        log.write(f"{os.fsdecode(args[0])}\t{args[1]}\t{args[2]}\n")
        log.flush()
sys.addaudithook(hook)
sys.argv = ["nanhunter", *sys.argv[2:]]
from nan_hunter.cli.main import run
run()
"""


def audited_opens(tmp_path: Path, *args) -> tuple[int, list[tuple[Path, object, object]]]:
    """Run the CLI with an audit hook logging every file open; (exit code, [(resolved path, mode, flags)])."""
    log = tmp_path / "opens.log"
    proc = subprocess.run(
        [sys.executable, "-c", AUDIT_DRIVER, str(log), *map(str, args)],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        timeout=120,
    )
    opens = []
    for row in log.read_text().splitlines():
        p, mode, flags = row.split("\t")
        opens.append((Path(os.path.abspath(p)).resolve(), mode, flags))
    return proc.returncode, opens


def test_nothing_outside_is_opened_and_the_checkpoint_is_opened_read_only(tmp_path, index_layout):
    ck, out = index_layout
    write_index(ck, "../outside/secret.safetensors")
    code, opens = audited_opens(tmp_path, "scan", ck / "model.safetensors.index.json")
    assert code == 2
    assert not [p for p, _, _ in opens if out in p.parents or p == Path("/etc/passwd")]
    # a clean index: the shards are read, read-only
    save_file({SECRET: torch.ones(2)}, str(ck / "shard-2.safetensors"))
    write_index(ck, "shard-2.safetensors")
    code, opens = audited_opens(tmp_path, "scan", ck / "model.safetensors.index.json")
    assert code == 0
    mine = [(p, m, f) for p, m, f in opens if ck.resolve() in p.parents]
    assert {p.name for p, _, _ in mine} >= {
        "model.safetensors.index.json",
        "shard-1.safetensors",
        "shard-2.safetensors",
    }
    write_bits = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    for p, mode, flags in mine:
        assert not set(mode) & set("wax+") if mode not in ("None", "") else True, (p, mode)
        assert flags in ("None", "") or int(flags) & write_bits == 0, (p, flags)
    assert not [p for p, _, _ in opens if out in p.parents]


def test_symlink_loop_is_refused(run_main, tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "a.safetensors").symlink_to("b.safetensors")
    (d / "b.safetensors").symlink_to("a.safetensors")
    one_error_line(run_main("scan", d), "a.safetensors")


def test_hub_cache_snapshot_links_into_blobs_are_followed(run_main, tmp_path):
    """The Hugging Face cache stores snapshot files as links to ../../blobs/<hash>: allowed."""
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    save_file({"w": torch.ones(3)}, str(repo / "blobs" / "9f86d08"))
    (snap / "model.safetensors").symlink_to("../../blobs/9f86d08")
    res = run_main("scan", snap, "--json", tmp_path / "r.json")
    assert res.code == 0, res.stderr
    assert json.loads((tmp_path / "r.json").read_text())["weights"]["n_tensors"] == 1


# --- 3. anything that is not a regular file is refused, never waited on --------------------------


def _fifo(p: Path) -> Path:
    os.mkfifo(p)
    return p


FIFO_CASES = ["checkpoint", "index", "shard", "torch", "config.json", "inputs", "data"]


@pytest.mark.parametrize("case", FIFO_CASES)
def test_fifos_are_refused_without_blocking(run_cli, tmp_path, tiny_bert, case):
    ok = tmp_path / "ok.safetensors"
    save_file({"w": torch.ones(2)}, str(ok))
    args: list[object]
    if case == "checkpoint":
        args = [_fifo(tmp_path / "m.safetensors")]
    elif case == "index":
        args = [_fifo(tmp_path / "model.safetensors.index.json")]
    elif case == "shard":
        _fifo(tmp_path / "shard.safetensors")
        args = [write_index_plain(tmp_path, {"w": "shard.safetensors"})]
    elif case == "torch":
        args = [_fifo(tmp_path / "m.pt")]
    elif case == "config.json":
        d = tmp_path / "hf"
        d.mkdir()
        shutil.copy(ok, d / "model.safetensors")
        _fifo(d / "config.json")
        args = [d]
    elif case == "inputs":
        d = copy_of(tiny_bert, tmp_path)
        args = [d, "--inputs", _fifo(tmp_path / "in.safetensors")]
    else:
        d = copy_of(tiny_bert, tmp_path)
        args = [d, "--data", _fifo(tmp_path / "data.jsonl")]
    t = time.monotonic()
    res = run_cli("scan", *args, timeout=120)
    one_error_line(res, "FIFO", "not a regular file")
    assert time.monotonic() - t < 100


def write_index_plain(d: Path, weight_map: dict) -> Path:
    idx = d / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": weight_map}))
    return idx


# --- 4. any size: flat memory, read-only ------------------------------------------------------

RSS_LAUNCHER = """
import json, os, sys
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.execv(sys.executable, [sys.executable, "-m", "nan_hunter", *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss]))
"""


def _cli_max_rss_mb(*args) -> tuple[int, int, str]:
    """Run the CLI and return (exit code, its peak RSS in MB, stderr). A small launcher forks it:
    a child forked straight from pytest would start with pytest's own RSS as its peak."""
    proc = subprocess.run(
        [sys.executable, "-c", RSS_LAUNCHER, *map(str, args)],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        timeout=300,
    )
    code, kb = json.loads(proc.stdout)
    return code, kb >> 10, proc.stderr


def _header(tensors: dict[str, tuple[str, list[int], int]]) -> bytes:
    off, h = 0, {}
    for name, (dtype, shape, nbytes) in tensors.items():
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    b = json.dumps(h).encode()
    return b + b" " * (-len(b) % 8)


def test_sparse_checkpoint_larger_than_ram_scans_with_flat_memory(tmp_path):
    """A single tensor bigger than the machine's RAM: scanned to its last element (a NaN planted
    there is found at its exact index) while the process's peak RSS stays that of a tiny scan."""
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    n = (max(30 << 30, ram + (2 << 30)) // 4) // 4096 * 4096  # float32 elements
    big = tmp_path / "big.safetensors"
    h = _header({"huge": ("F32", [n // 4096, 4096], n * 4)})
    start = 8 + len(h)
    with open(big, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(start + n * 4)  # sparse: zeros, valid finite data
        f.seek(start + (1 << 30))
        f.write(struct.pack("<f", 3.5) * (4 << 20))  # 16 MiB of real data at 1 GiB
        f.seek(start + (n - 3) * 4)
        f.write(struct.pack("<f", float("nan")))  # past the end of RAM
    assert big.stat().st_size > ram
    small = tmp_path / "small.safetensors"
    save_file({"w": torch.ones(8)}, str(small))
    code0, base_mb, err0 = _cli_max_rss_mb("scan", small, "--json", tmp_path / "small.json")
    assert code0 == 0, err0
    t = time.monotonic()
    code, rss_mb, err = _cli_max_rss_mb("scan", big, "--json", tmp_path / "big.json")
    took = time.monotonic() - t
    assert code == 1, err  # the planted NaN
    (bad,) = json.loads((tmp_path / "big.json").read_text())["weights"]["nonfinite"]
    assert bad["name"] == "huge" and bad["nan"] == 1 and bad["first_index"] == [n // 4096 - 1, 4093]
    assert rss_mb < base_mb + 200, (rss_mb, base_mb)
    assert took < 120, took


def test_dense_checkpoint_streams_in_bounded_windows(tmp_path):
    """One 512 MiB tensor of real (non-sparse) data: peak RSS grows by far less than the tensor
    (a whole-file or copy-on-write map adds all of it), and the bytes are unchanged."""
    n = (512 << 20) // 2
    p = tmp_path / "dense.safetensors"
    h = _header({"a": ("F16", [n], 2 * n)})
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        one = struct.pack("<e", 1.0) * (1 << 20)
        for _ in range((2 * n) // len(one)):
            f.write(one)
    before = sha256(p)
    small = tmp_path / "small.safetensors"
    save_file({"w": torch.ones(8)}, str(small))
    _, base_mb, _ = _cli_max_rss_mb("scan", small, "--json", tmp_path / "s.json")
    code, rss_mb, err = _cli_max_rss_mb("scan", p, "--json", tmp_path / "d.json")
    assert code == 0, err
    rep = json.loads((tmp_path / "d.json").read_text())["weights"]
    assert rep["n_tensors"] == 1 and rep["nonfinite"] == [] and rep["tensors"][0]["absmax"] == 1.0
    assert rss_mb < base_mb + 150, (rss_mb, base_mb)
    assert sha256(p) == before


def test_million_entry_header_is_refused_with_bounded_memory(tmp_path):
    """The 68 MB header declaring a million empty tensors (it used to take 3.6 GB and die):
    one line naming the limit, and memory never near the header's size in Python objects."""
    p = tmp_path / "many.safetensors"
    body = ",".join(
        f'"model.layers.{i}.w":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(1_000_000)
    )
    h = ("{" + body + "}").encode()
    p.write_bytes(struct.pack("<Q", len(h)) + h)
    assert len(h) > 60_000_000
    small = tmp_path / "small.safetensors"
    save_file({"w": torch.ones(8)}, str(small))
    _, base_mb, _ = _cli_max_rss_mb("scan", small, "--json", tmp_path / "s.json")
    code, rss_mb, err = _cli_max_rss_mb("scan", p)
    assert code == 2, err
    assert (
        err.strip() == f"nanhunter: error: {p}: more than 500,000 tensors, nanhunter's limit per file; "
        "re-export or re-download the checkpoint"
    )
    assert rss_mb < base_mb + 300, (rss_mb, base_mb)


# --- 5. no silent wrong answers -----------------------------------------------------------------


def test_hf_directory_missing_weights_is_refused_with_their_names(run_main, tiny_bert, tmp_path):
    from safetensors.torch import load_file

    d = copy_of(tiny_bert, tmp_path)
    sd = load_file(str(d / "model.safetensors"))
    gone = "encoder.layer.0.attention.self.query.weight"
    del sd[gone]
    save_file(sd, str(d / "model.safetensors"))
    res = run_main("scan", d, "--prompt", "hi")
    one_error_line(res, "lacks 1 of", gone, "random")
    save_file({"unrelated": torch.ones(2)}, str(d / "model.safetensors"))  # none of them
    res = run_main("scan", d, "--prompt", "hi")
    one_error_line(res, "lacks 23 of the 23", "embeddings.LayerNorm.bias", "and 19 more")


ARCH = "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 4))\n"


def test_training_checkpoint_tensors_are_walked_and_named_by_path(cli_main, tmp_path):
    w = torch.randn(4, 4)
    w[1, 2] = float("nan")
    sq = torch.rand(4, 4)
    sq[0, 3] = float("inf")
    ckpt = {
        "model": {"0.weight": w, "0.bias": torch.zeros(4)},
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(4, 4), "exp_avg_sq": sq}},
            "param_groups": [{"lr": 1e-3, "params": [0, 1]}],
        },
        "ema": [torch.ones(2)],
        "epoch": 3,
    }
    p = tmp_path / "train.pt"
    torch.save(ckpt, p)
    before = sha256(p)
    res = cli_main("scan", p)
    assert res.code == 1, res.stderr
    bad = {t["name"]: t for t in res.report["weights"]["nonfinite"]}
    assert set(bad) == {"model.0.weight", "optimizer.state.0.exp_avg_sq"}
    assert (
        bad["model.0.weight"]["first_index"] == [1, 2] and bad["optimizer.state.0.exp_avg_sq"]["posinf"] == 1
    )
    names = {t["name"] for t in res.report["weights"]["tensors"]}
    assert {"optimizer.state.0.step", "ema.0", "model.0.bias"} <= names
    # --arch finds the model's weights under their "model." prefix; the optimizer's are not weights
    w[1, 2] = 0.5
    torch.save({**ckpt, "optimizer": {"state": {}}}, p)
    (tmp_path / "arch.py").write_text(ARCH)
    save_file({"input": torch.ones(2, 4)}, str(tmp_path / "in.safetensors"))
    res = cli_main(
        "scan", p, "--arch", f"{tmp_path / 'arch.py'}:build", "--inputs", tmp_path / "in.safetensors"
    )
    assert res.code == 0, res.stderr
    assert res.report["run"]["n_inputs"] == 1
    assert sha256(p) != before  # (rewritten above, by the test)


def test_legacy_torch_save_is_read_with_weights_only(cli_main, tmp_path):
    w = torch.ones(3, 3)
    w[2, 1] = float("-inf")
    p = tmp_path / "legacy.pt"
    torch.save({"layer.weight": w}, p, _use_new_zipfile_serialization=False)
    before = sha256(p)
    res = cli_main("scan", p)
    assert res.code == 1, res.stderr
    (bad,) = res.report["weights"]["nonfinite"]
    assert bad["name"] == "layer.weight" and bad["neginf"] == 1 and bad["first_index"] == [2, 1]
    assert sha256(p) == before


@pytest.mark.parametrize("where", ["factory", "module"])
def test_arch_calling_sys_exit_is_an_error_not_a_clean_scan(run_main, tmp_path, where):
    save_file(torch.nn.Linear(4, 4).state_dict(), str(tmp_path / "lin.safetensors"))
    body = (
        "import sys, torch\ndef build():\n    sys.exit(0)\n"
        if where == "factory"
        else "import sys\nsys.exit(0)\ndef build():\n    pass\n"
    )
    (tmp_path / "arch.py").write_text(body)
    res = run_main("scan", tmp_path / "lin.safetensors", "--arch", f"{tmp_path / 'arch.py'}:build")
    one_error_line(res, "sys.exit(0)", "nothing was scanned")


def test_arch_import_leaves_no_pycache_in_the_checkpoint_directory(run_main, tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    lin = torch.nn.Linear(4, 4)
    save_file(lin.state_dict(), str(d / "model.safetensors"))
    (d / "helper.py").write_text("import torch\ndef make():\n    return torch.nn.Linear(4, 4)\n")
    (d / "model.py").write_text("from helper import make\ndef build():\n    return make()\n")
    save_file({"input": torch.ones(1, 4)}, str(tmp_path / "in.safetensors"))
    res = run_main(
        "scan",
        d,
        "--arch",
        f"{d / 'model.py'}:build",
        "--inputs",
        tmp_path / "in.safetensors",
        env={"PYTHONDONTWRITEBYTECODE": None},
    )  # bytecode is written unless nanhunter stops it
    assert res.code == 0, res.stderr
    assert sorted(os.listdir(d)) == ["helper.py", "model.py", "model.safetensors"]


def test_arch_factory_that_never_returns_is_interruptible(run_cli, tmp_path):
    save_file(torch.nn.Linear(4, 4).state_dict(), str(tmp_path / "lin.safetensors"))
    started = tmp_path / "started"
    (tmp_path / "arch.py").write_text(
        "import time\ndef build():\n"
        f"    open({str(started)!r}, 'w').close()\n"
        "    while True:\n        time.sleep(0.05)\n"
    )
    res = run_cli(
        "scan",
        tmp_path / "lin.safetensors",
        "--arch",
        f"{tmp_path / 'arch.py'}:build",
        interrupt_when=started,
        timeout=120,
    )
    assert res.code == 130, res.stderr
    assert res.interrupt_s is not None and res.interrupt_s < 5
