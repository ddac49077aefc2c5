"""Re-check ``EXPECTED.yaml`` against the example models, independently of nanhunter.

Usage: ``python examples/incidents/verify.py [--show] [NAME ...]``

For each incident it builds ``model.py:build()``, loads ``model.safetensors`` strictly, casts
floating parameters, buffers and inputs to each of fp32/bf16/fp16, and runs ``forward`` on
every input file under a :class:`NonFiniteRecorder` (a ``TorchDispatchMode`` that records
each aten op whose floating output holds NaN/±Inf, with the innermost module running it;
view ops such as ``aten.t`` of a NaN weight are skipped: they expose values, never produce them).
From that it computes, and compares with ``EXPECTED.yaml``:

- ``op``/``kind``/``module``/``module_type``: the first op whose output holds NaN or +inf
  (−inf-only outputs before it are mask values, listed as ``mask_ops``);
- ``role``: ``input`` if a model input is non-finite, ``weights`` if that module's own
  parameters are, else ``producer``;
- ``exit_code``: 1 if any module output (or a weight) is non-finite, else 0; with 0, a
  recorded +inf/NaN is a ``near_miss`` instead;
- ``failed_inputs`` and ``finite_in`` (dtypes where every input gives a finite output);
- the ``weights_only`` faults of ``corrupt.safetensors`` and the ``tiny_llama`` fault
  (needs transformers; offline).

``--show`` prints what was observed without comparing. Exit status: 0 when everything
agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def kind_of(t: Any) -> str | None:
    """``nan``/``posinf``/``neginf`` for a floating tensor holding such values, else None."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
        return None
    if bool(torch.isfinite(t).all()):
        return None
    if bool(t.isnan().any()):
        return "nan"
    return "posinf" if bool(t.isposinf().any()) else "neginf"


def first_kind(obj: Any) -> str | None:
    """:func:`kind_of` of the first non-finite tensor in a (nested) output."""
    for leaf in tree_flatten(obj)[0]:
        kind = kind_of(leaf)
        if kind:
            return kind
    return None


@dataclass
class OpEvent:
    """An aten op whose output held a non-finite value."""

    op: str
    kind: str
    module: str
    module_type: str


@dataclass
class Trace:
    """What one forward pass did with non-finite values."""

    ops: list[OpEvent] = field(default_factory=list)
    bad_module_outputs: list[str] = field(default_factory=list)
    input_nonfinite: bool = False

    @property
    def fault(self) -> OpEvent | None:
        """The first op with a NaN or +inf output."""
        return next((e for e in self.ops if e.kind != "neginf"), None)

    @property
    def mask_ops(self) -> list[str]:
        """−inf-only ops before the fault (mask values), deduplicated in order."""
        fault = self.fault
        ops = self.ops[: self.ops.index(fault)] if fault else self.ops
        return list(dict.fromkeys(e.op for e in ops if e.kind == "neginf"))


class NonFiniteRecorder(TorchDispatchMode):
    """Record every aten op whose floating output is non-finite, tagged with its module."""

    def __init__(self, model: nn.Module, trace: Trace) -> None:
        super().__init__()
        self.trace = trace
        self.stack: list[tuple[str, nn.Module]] = [("", model)]
        # torch.isfinite is composite (abs, eq, ...): the hooks' own checks must not be recorded.
        self.checking = False
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._enter(name)))
            self.handles.append(module.register_forward_hook(self._exit(name)))

    def _enter(self, name: str) -> Callable[[nn.Module, tuple], None]:
        def hook(module: nn.Module, args: tuple) -> None:
            self.stack.append((name, module))

        return hook

    def _exit(self, name: str) -> Callable[[nn.Module, tuple, Any], None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            self.stack.pop()
            self.checking = True
            try:
                if first_kind(output):
                    self.trace.bad_module_outputs.append(name)
            finally:
                self.checking = False

        return hook

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.checking:
            return out
        # A view (aten.t of a NaN weight, ...) only exposes a value another op produced.
        kind = None if func.is_view else first_kind(out)
        if kind:
            name, module = self.stack[-1]
            self.trace.ops.append(OpEvent(str(func), kind, name, type(module).__name__))
        return out

    def __exit__(self, *exc: Any) -> Any:
        for handle in self.handles:
            handle.remove()
        return super().__exit__(*exc)


def load_factory(arch: str) -> Any:
    """Resolve ``path/to/model.py:build`` (relative to the repository root)."""
    path, _, factory = arch.partition(":")
    spec = importlib.util.spec_from_file_location(f"incident_{Path(path).parent.name}", REPO / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, factory)


def cast_inputs(inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Cast floating tensors to ``dtype``; leave integer/bool tensors alone."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


def run_incident(spec: dict[str, Any], dtype: str) -> tuple[list[Trace], list[torch.Tensor]]:
    """Run every input of an incident in ``dtype``; return one trace and output per input."""
    model = load_factory(spec["arch"])()
    model.load_state_dict(load_file(str(REPO / spec["checkpoint"])), strict=True)
    model = model.to(DTYPES[dtype]).eval()
    traces, outputs = [], []
    for path in spec["inputs"]:
        inputs = cast_inputs(load_file(str(REPO / path)), DTYPES[dtype])
        trace = Trace(input_nonfinite=any(kind_of(v) for v in inputs.values()))
        with torch.no_grad(), NonFiniteRecorder(model, trace):
            outputs.append(model(**inputs))
        traces.append(trace)
    return traces, outputs


def observe_incident(spec: dict[str, Any]) -> dict[str, Any]:
    """Compute the facts of one incident that EXPECTED.yaml states."""
    runs = {dt: run_incident(spec, dt) for dt in DTYPES}
    traces, _ = runs[spec["dtype"]]
    model = load_factory(spec["arch"])()
    model.load_state_dict(load_file(str(REPO / spec["checkpoint"])), strict=True)
    weights_bad = any(kind_of(t) for t in model.state_dict().values())
    failed = [i for i, t in enumerate(traces) if t.bad_module_outputs or weights_bad]
    obs: dict[str, Any] = {
        "exit_code": 1 if failed else 0,
        "failed_inputs": failed,
        "finite_in": [dt for dt, (_, outs) in runs.items() if not any(first_kind(o) for o in outs)],
    }
    first = traces[failed[0]] if failed else next((t for t in traces if t.fault), traces[0])
    fault = first.fault
    obs["mask_ops"] = first.mask_ops
    if failed and fault:
        params_bad = any(kind_of(p) for p in model.get_submodule(fault.module).parameters(recurse=False))
        role = "input" if first.input_nonfinite else "weights" if params_bad else "producer"
        obs.update(
            input_index=failed[0],
            module=fault.module,
            module_type=fault.module_type,
            op=None if role == "input" else fault.op,
            first_op=fault.op,
            kind=fault.kind,
            role=role,
        )
    else:
        obs.update(input_index=None, module=None, module_type=None, op=None, kind=None, role=None)
        if fault:
            obs["near_miss"] = {"module": fault.module, "op": fault.op, "kind": fault.kind}
    if "min_abs_err" in spec:  # large error without non-finite values (RoPE control)
        ref = runs["fp32"][1][0].double()
        obs["abs_err"] = {dt: float((runs[dt][1][0].double() - ref).abs().max()) for dt in ("bf16", "fp16")}
    return obs


CHECKED_KEYS = (
    "exit_code",
    "failed_inputs",
    "input_index",
    "module",
    "module_type",
    "op",
    "kind",
    "role",
    "finite_in",
    "mask_ops",
    "near_miss",
)


def compare(name: str, expected: dict[str, Any], observed: dict[str, Any]) -> list[str]:
    """Return one message per disagreement between EXPECTED.yaml and the observation."""
    errors = []
    for key in CHECKED_KEYS + (("first_op",) if "first_op" in expected else ()):
        if expected.get(key) != observed.get(key):
            errors.append(f"{name}: {key}: expected {expected.get(key)!r}, observed {observed.get(key)!r}")
    if "weights_nonfinite" in expected:
        tensors = load_file(str(REPO / expected["checkpoint"]))
        found = [{"name": k, **info} for k in sorted(tensors) if (info := count_nonfinite(tensors[k]))]
        if found != expected["weights_nonfinite"]:
            errors.append(
                f"{name}: weights_nonfinite: expected {expected['weights_nonfinite']}, found {found}"
            )
    for dt, bound in expected.get("min_abs_err", {}).items():
        if observed["abs_err"][dt] < bound:
            errors.append(f"{name}: abs_err[{dt}] = {observed['abs_err'][dt]:.3g} < {bound}")
    return errors


def count_nonfinite(t: torch.Tensor) -> dict[str, Any] | None:
    """Counts and first (row-major) index of the non-finite entries of a tensor, or None."""
    if not t.is_floating_point() or t.numel() == 0:
        return None
    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return None
    first = torch.nonzero(bad)[0].tolist()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "nan": int(t.isnan().sum()),
        "posinf": int(t.isposinf().sum()),
        "neginf": int(t.isneginf().sum()),
        "first_index": first,
    }


def check_weights_only(section: dict[str, Any], show: bool) -> list[str]:
    """Compare the faults found in the corrupt/clean checkpoints with EXPECTED.yaml."""
    errors = []
    for key in ("corrupt", "clean"):
        tensors = load_file(str(REPO / section[key]["checkpoint"]))
        found = []
        for name in sorted(tensors):
            info = count_nonfinite(tensors[name])
            if info:
                found.append({"name": name, **info})
        if show:
            print(f"weights_only.{key}: {len(tensors)} tensors, nonfinite {found}")
        if len(tensors) != section[key]["n_tensors"]:
            errors.append(f"weights_only.{key}: n_tensors {len(tensors)} != {section[key]['n_tensors']}")
        if found != section[key]["nonfinite"]:
            errors.append(f"weights_only.{key}: nonfinite {found} != {section[key]['nonfinite']}")
    return errors


def check_tiny_llama(section: dict[str, Any], show: bool) -> list[str]:
    """Run the tiny Llama on ``prompts.jsonl`` in each dtype (offline) and check the fault."""
    import json

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:  # pragma: no cover - optional extra
        print("tiny_llama: transformers not installed, skipped")
        return []
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    directory = str(REPO / section["checkpoint"])
    tokenizer = AutoTokenizer.from_pretrained(directory)
    lines = (REPO / section["data"]).read_text().splitlines()
    texts = [json.loads(line)["text"] for line in lines if line.strip()]
    obs: dict[str, Any] = {"finite_in": [], "first": None}
    for dt, torch_dtype in DTYPES.items():
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch_dtype).eval()
        failed = []
        for i, text in enumerate(texts):
            trace = Trace()
            with torch.no_grad(), NonFiniteRecorder(model, trace):
                model(**tokenizer(text, return_tensors="pt"))
            if trace.bad_module_outputs:
                failed.append(i)
                if obs["first"] is None and dt == section["dtype"]:
                    obs["first"] = trace.fault
        if not failed:
            obs["finite_in"].append(dt)
        if dt == section["dtype"]:
            obs["failed_inputs"] = failed
    fault = obs.pop("first")
    obs.update(module=fault.module, module_type=fault.module_type, op=fault.op, kind=fault.kind)
    if show:
        print(f"tiny_llama: {obs}")
    return [
        f"tiny_llama: {key}: expected {section.get(key)!r}, observed {value!r}"
        for key, value in obs.items()
        if section.get(key) != value
    ]


def main(argv: list[str] | None = None) -> int:
    """Check every (or the named) incident; print a table and any disagreement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="incidents to check (default: all)")
    parser.add_argument("--show", action="store_true", help="print observations, do not compare")
    args = parser.parse_args(argv)
    expected = yaml.safe_load((HERE / "EXPECTED.yaml").read_text())
    errors: list[str] = []
    for name, spec in expected["incidents"].items():
        if args.names and name not in args.names:
            continue
        obs = observe_incident(spec)
        where = f"{obs['module']}" if obs["module"] is not None else "-"
        print(
            f"{name:22s} {spec['dtype']:5s} exit={obs['exit_code']} {where:26s} "
            f"{obs.get('first_op') or '-':26s} {obs['kind'] or '-':7s} finite_in={obs['finite_in']}"
        )
        if args.show:
            print(f"    {obs}")
        else:
            errors += compare(name, spec, obs)
    if not args.names:
        errors += check_weights_only(expected["weights_only"], args.show)
        errors += check_tiny_llama(expected["tiny_llama"], args.show)
    if args.show:
        return 0
    for error in errors:
        print("MISMATCH", error)
    print("OK: EXPECTED.yaml agrees" if not errors else f"{len(errors)} mismatch(es)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
