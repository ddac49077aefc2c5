"""Scan every committed fixture (``examples/``, ``tests/data/quant/``, ``tests/data/dtypes/``), fast and
exact, weights only: the weights blocks the reports of ``tests/unit/load/test_weights_reference.py``
are compared with.

    PYTHONPATH=TREE python tests/parity/scan_fixtures.py --write tests/data/weights_reference.json

writes them as the tree on ``PYTHONPATH`` computes them (the reference was written by the torch path,
commit d6e40c4); under the recorder (``sitecustomize.py`` in this folder, ``NANHUNTER_PARITY_LOG``) the
scans also go to a parity log.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nan_hunter.config import default_config
from nan_hunter.errors import BadInput
from nan_hunter.explain.weights_verdict import weights_section
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.weights import scan_weights
from nan_hunter.report import json_safe

ROOT = Path(__file__).resolve().parents[2]


def fixtures() -> list[Path]:
    ex = ROOT / "examples"
    out = sorted(
        p
        for p in ex.rglob("*")
        if p.suffix in (".safetensors", ".pt", ".gguf") or p.name.endswith(".index.json")
    )
    out += sorted(p.parent for p in ex.rglob("config.json"))
    out += sorted(p for p in (ROOT / "tests" / "data" / "quant").iterdir() if p.is_dir())
    out += sorted((ROOT / "tests" / "data" / "dtypes").glob("*.safetensors"))
    return out


def weights_blocks(p: Path) -> dict:
    """``{"fast": weights block, "full": weights block}`` of checkpoint ``p`` (or the one-line error)."""
    out = {}
    for level, exact in (("fast", False), ("full", True)):
        try:
            out[level] = json_safe(
                weights_section(scan_weights(open_checkpoint(p), exact=exact), default_config())
            )
        except BadInput as e:
            out[level] = {"error": str(e).replace(str(ROOT) + "/", "")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", help="write the weights blocks of every fixture to this JSON file")
    args = ap.parse_args()
    got = {str(p.relative_to(ROOT)): weights_blocks(p) for p in fixtures()}
    if args.write:
        text = "{\n" + ",\n".join(
            f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(got.items())
        )
        Path(args.write).write_text(text + "\n}\n", encoding="utf-8")
    print(f"{len(got)} fixtures")


if __name__ == "__main__":
    main()
