"""The argument parser and the flags commands share (loading, inputs, device, config, JSON)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

DTYPES_HELP = "fp32|bf16|fp16|fp8-e4m3|fp8-e5m2"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and example sections kept as written; every option's default shown after its
    help unless the help already states it or there is none to show (a flag, a list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default in (None, False, True, argparse.SUPPRESS) or isinstance(default, list) or "default" in text
                or action.option_strings == []):
            return text
        return f"{text} (default: {default})"


class Parser(argparse.ArgumentParser):
    """argparse with the project's error style: one line on stderr, exit 2, no usage block, a
    "did you mean" for a mistyped option; and no abbreviated flags (``--pol`` for
    ``--policy-out``), so adding a flag never changes what an existing command line means."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"nanhunter: error: {message}{did_you_mean(message, self.option_names())} "
                         f"(see `{self.prog} --help`)\n")
        sys.exit(2)

    def option_names(self) -> list[str]:
        """Every option string of this parser and of its commands."""
        names = list(self._option_string_actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    names += list(sub._option_string_actions)
        return sorted(set(names))


#: options users reach for by another tool's name, and ours
SYNONYMS = {"--html": "--report", "--md": "--report", "--markdown": "--report", "--output": "--json",
            "--out": "--json", "--precision": "--dtype", "--junit-xml": "--junit", "--junitxml": "--junit"}


def did_you_mean(message: str, names: list[str]) -> str:
    """"; did you mean --dtype?" for an unrecognized ``--dtpye`` (difflib) or ``--precision``
    (``SYNONYMS``), else ""."""
    import difflib

    if not message.startswith("unrecognized arguments:"):
        return ""
    hints = []
    for word in message.split(":", 1)[1].split():
        flag = word.split("=", 1)[0]
        if flag.startswith("--"):
            same = SYNONYMS.get(flag)
            close = ([same] if same in names else
                     difflib.get_close_matches(flag, [n for n in names if n.startswith("--")], n=1, cutoff=0.6))
            if close:
                hints.append((flag, close[0]))
    if len(hints) == 1:
        return f"; did you mean {hints[0][1]}?"
    return "; did you mean " + ", ".join(f"{good} for {bad}" for bad, good in hints) + "?" if hints else ""


def examples(*lines: tuple[str, str]) -> str:
    """An "examples:" section for a command's help: (what it does, the command line)."""
    return "examples:\n" + "\n".join(f"  # {what}\n  {cmd}\n" for what, cmd in lines)


def add_checkpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a .safetensors file, a *.safetensors.index.json, or a model directory")


class Groups:
    """A command's options grouped by purpose in its --help."""

    def __init__(self, p: argparse.ArgumentParser) -> None:
        self.model = p.add_argument_group("model", "how the model is built")
        self.inputs = p.add_argument_group("inputs", "what the model is run on (one input per file, prompt or line)")
        self.run = p.add_argument_group("precision and device")
        self.mode = p.add_argument_group("what to run")
        self.output = p.add_argument_group("output")


def add_model_inputs(p: argparse.ArgumentParser, g: Groups | None = None) -> None:
    """How the model is built and what it is run on (shared by every command); by purpose when
    ``g`` is given."""
    model, inputs, run = (g.model, g.inputs, g.run) if g is not None else (p, p, p)
    model.add_argument("--arch", metavar="FILE.py:FACTORY",
                       help="the model: path/to/file.py:factory or package.module:factory; factory() returns the "
                            "nn.Module the weights load into (default: config.json of a model directory)")
    inputs.add_argument("--inputs", action="append", metavar="FILE",
                        help="a .safetensors of forward() kwargs (repeatable)")
    inputs.add_argument("--prompt", action="append", metavar="TEXT", help="text to tokenize (repeatable)")
    inputs.add_argument("--data", metavar="FILE.jsonl", help='a .jsonl file with {"text": ...} per line')
    run.add_argument("--device", default="auto", metavar="auto|cpu|cuda",
                     help="where the model runs (auto: cuda when available)")
    model.add_argument("--attn", metavar="eager|sdpa",
                       help="transformers attn_implementation (default: the model's own)")


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
    p.add_argument("--quiet", "-q", action="store_true", help="no terminal report and no progress on stderr")


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


def add_trace(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", metavar="PATH",
                   help="write a numerics trace of the run (nanhunter.trace/v1, JSON lines; .gz: gzip) for "
                        "`nanhunter diff`")
    p.add_argument("--trace-level", default="modules", metavar="modules|ops",
                   help="--trace: one entry per module call, or per aten op (with producer links)")
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="--trace: run each input N times (N >= 2) and store each entry's run-to-run spread")


def trace_output(args: argparse.Namespace) -> list:
    """``--trace PATH`` as an output (checked with the others before any work; never stdout)."""
    from ..outputs import Output

    return [Output("--trace", args.trace, text=False)] if getattr(args, "trace", None) else []

