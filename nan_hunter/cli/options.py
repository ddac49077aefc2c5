"""The argument parser and the flags commands share (loading, inputs, device, config, JSON)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

DTYPES_HELP = "fp32|bf16|fp16|fp8-e4m3|fp8-e5m2"


class Parser(argparse.ArgumentParser):
    """argparse with the project's error style: one line on stderr, exit 2, no usage block; and
    no abbreviated flags (``--pol`` for ``--policy-out``), so adding a flag never changes what an
    existing command line means."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"nanhunter: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


def add_checkpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a .safetensors file, a *.safetensors.index.json, or a model directory")


def add_model_inputs(p: argparse.ArgumentParser) -> None:
    """How the model is built and what it is run on (shared by every command)."""
    p.add_argument("--arch", help="path/to/file.py:factory or package.module:factory")
    p.add_argument("--inputs", action="append", metavar="FILE",
                   help="a .safetensors of forward() kwargs (repeatable)")
    p.add_argument("--prompt", action="append", metavar="TEXT", help="text to tokenize (repeatable)")
    p.add_argument("--data", metavar="FILE", help='a .jsonl file with {"text": ...} per line')
    p.add_argument("--device", default="auto", help="auto|cpu|cuda (default: auto)")
    p.add_argument("--attn", help="transformers attn_implementation (eager|sdpa)")


def add_json(p: argparse.ArgumentParser, help: str = "write the JSON report here ('-' for stdout)") -> None:
    p.add_argument("--json", metavar="PATH", help=help)


def add_config(p: argparse.ArgumentParser, help: str = "YAML merged over configs/default.yaml") -> None:
    p.add_argument("--config", metavar="FILE", help=help)


def add_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", metavar="PATH",
                   help="also write a report: PATH.html (self-contained page) or PATH.md (Markdown + PATH.png)")
    p.add_argument("--strip", action=argparse.BooleanOptionalAction, default=None,
                   help="per-module headroom strip in the terminal (default: on for failing runs)")


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", "-q", action="store_true", help="no terminal report")


def add_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--generate", type=int, metavar="N", default=None,
                   help="greedy decoding of up to N new tokens per input through the model's generate(), "
                        "every step captured; stops at the first non-finite value")
    p.add_argument("--batch", action="store_true",
                   help="--generate: decode all inputs together as one left-padded batch")


def add_device_map(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device-map", metavar="auto", default=None,
                   help="place a model bigger than one device with accelerate (GPUs, then CPU memory, then "
                        "disk offload); overrides --device")
    p.add_argument("--max-memory", action="append", metavar="DEV=SIZE",
                   help="--device-map: memory cap per device, e.g. cpu=200MB or cuda:0=10GiB (repeatable)")


def add_backward(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backward", action="store_true",
                   help="forward then backward of a loss for each input; the backward is captured too")
    p.add_argument("--loss", metavar="FILE.py:FN",
                   help="--backward: fn(outputs, batch) -> scalar tensor (default: a causal LM's own loss, "
                        "labels = input_ids)")
