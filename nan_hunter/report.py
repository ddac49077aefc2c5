"""Report v1: plain dataclasses and their JSON form (``schema: nanhunter.report/v1``).

Every key of docs/contract.md is always present (null where it does not apply). Extensions live
beside them under names the contract does not use (``notes``, ``near_misses``, ``modules``,
``weights.tensors``...). No rich, no torch here.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .outputs import write_text
from .version import __version__

SCHEMA = "nanhunter.report/v1"
TEXT_CHARS = 500  # inputs[i].text: the first characters of a prompt or data line


@dataclass
class FirstNonfinite:
    input_index: int
    module: str
    module_type: str
    op: str | None
    kind: str  # nan | posinf | neginf
    role: str  # producer | weights | input
    call_index: int = 0
    source: str | None = None  # "file.py:123  code" of the op's call site, when known
    tensor: str | None = None  # which output/parameter/input held it
    # contract v1.1
    step: int = 0  # decode step under --generate (0: the prompt's forward); root-call index under watch()
    position: int | None = None  # index into the input's own tokens of the first row holding it
    phase: str = "forward"  # forward | backward | optimizer
    grad_fn: str | None = None  # backward: the autograd node that produced it (``SqrtBackward0``)
    param: str | None = None  # optimizer: dotted parameter name; FSDP2 weights: the full parameter
    rank: int | None = None  # under torch.distributed: the rank of the first fault
    # contract v1.2: the failing region re-run from its captured inputs and weights on the same device,
    # dtype and autocast faulted again (True), did not (False: cause not_reproducible), or was not re-run (None)
    reproducible: bool | None = None
    # contract v1.2: ``source`` split so editors can link to it
    source_file: str | None = None
    source_line: int | None = None
    # contract v1.4: the dtype the located op computed in (under autocast, the op's own: not every op is lowered)
    dtype: str | None = None

    def __post_init__(self) -> None:
        self.sync_source()

    def sync_source(self) -> None:
        """``source_file``/``source_line`` from ``source`` (``"file.py:123  code"``), when it is set."""
        if self.source is not None:
            self.source_file, self.source_line, _ = split_source(self.source)


_SOURCE = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?:\s+(?P<code>.*))?$", re.S)


def split_source(source: str | None) -> tuple[str | None, int | None, str | None]:
    """``"path/file.py:123  code"`` → (path, 123, code); (source, None, None) when it has no line."""
    if not source:
        return None, None, None
    m = _SOURCE.match(source)
    if m is None:
        return source, None, None
    return m["file"], int(m["line"]), (m["code"] or None)


class Keyed:
    """A typed row whose fields read as keys too (``row["finite"]``, ``row.get("rel_err")``,
    ``dict(row)``, ``row["step"] = k``): the dicts it replaced were read and written so. Its JSON
    form is ``to_dict()``: every field but those ``omitted()`` (keys the JSON has only when set)."""

    def omitted(self) -> tuple[str, ...]:
        return ()

    def keys(self) -> list[str]:
        gone = self.omitted()
        return [k for k in self.__dataclass_fields__ if k not in gone]  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.keys()}

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__ or key in self.omitted():  # type: ignore[attr-defined]
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            raise KeyError(f"{type(self).__name__} has no field {key!r}")
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return key in self.__dataclass_fields__ and key not in self.omitted()  # type: ignore[attr-defined]

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self else default


@dataclass
class ReplayRow(Keyed):
    """One dtype of the replay matrix (``replay[dtype]``): the failing region re-run in that dtype,
    its non-finite counts, the largest finite |output| and ``rel_err`` against float64 (null when
    not comparable)."""

    finite: bool
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    absmax: float | None = None
    rel_err: float | None = None
    error: str | None = None  # the run raised (its first line); the key is in the JSON only then

    def omitted(self) -> tuple[str, ...]:
        return ("error",) if self.error is None else ()


@dataclass
class CompileResult(Keyed):
    """Contract v1.1 ``compile`` (``scan --compile``): the run under ``torch.compile`` against eager."""

    backend: str
    eager_finite: bool
    compiled_finite: bool
    first_divergent_module: str | None = None  # the module whose compiled form parts from eager first
    max_rel_err: float | None = None  # over every input, compiled against eager
    #: inductor only, when they part: the compiled run again with emulate_precision_casts:
    #: {compiled_finite, max_rel_err}
    emulate_precision_casts: dict[str, Any] | None = None


@dataclass
class ModuleRow(Keyed):
    """One module call of the report's ``modules`` table (``locate.producer.call_table``), in
    completion order: its output's absmax and non-finite counts, the largest |input|, abs-min,
    the subnormal share in its own dtype and, per target dtype, the share a cast flushes to zero."""

    module: str
    module_type: str
    call_index: int
    input_index: int
    depth: int
    absmax: float | None
    in_absmax: float | None
    nan: int
    posinf: int
    neginf: int
    min_nonzero: float | None
    subnormal_frac: float | None
    flush_frac: dict[str, float | None]
    phase: str = "forward"  # in the JSON only for backward and optimizer rows
    param: str | None = None  # an optimizer row's parameter (in the JSON only then)
    step: int | None = None  # v1.1 --generate: the decode step (in the JSON only then)

    def omitted(self) -> tuple[str, ...]:
        return tuple(
            k
            for k, gone in (
                ("phase", self.phase == "forward"),
                ("param", not self.param),
                ("step", self.step is None),
            )
            if gone
        )


def rows_json(rows: list[Any] | None) -> list[dict[str, Any]] | None:
    """Typed rows at the JSON edge (a row given as a plain dict stays one)."""
    return [r.to_dict() if isinstance(r, Keyed) else r for r in rows] if rows is not None else None


def module_rows_from_json(rows: list[dict[str, Any]]) -> list[ModuleRow]:
    """A module table that crossed ranks as JSON, typed again."""
    return [ModuleRow(**r) for r in rows]


def replay_json(replay: dict[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    """The replay matrix at the JSON edge (a row given as a plain dict stays one)."""
    if replay is None:
        return None
    return {d: r.to_dict() if isinstance(r, ReplayRow) else r for d, r in replay.items()}


def replay_from_json(replay: dict[str, dict[str, Any]] | None) -> dict[str, ReplayRow] | None:
    """A replay matrix that crossed ranks as JSON, typed again."""
    return {d: ReplayRow(**r) for d, r in replay.items()} if replay is not None else None


@dataclass
class FixVerified:
    """Contract v1.2 "Verified fixes": the proposed fix applied to a copy of the failing region or
    model and re-run on the failing input. ``finite``: the fault is gone; ``max_rel_err``: max
    |fixed − fp32| / max |fp32| over the outputs (None when it could not be compared)."""

    change: str
    finite: bool
    max_rel_err: float | None
    scope: str = (
        "region"  # region: the failing module re-run from its captured inputs; model: a whole forward
    )
    reference: str = "fp32"  # what max_rel_err is against: the all-fp32 run, or "eager" for a compiled run
    #: contract v1.4: exactly what the user applies: {kind: policy|dtype|option|code, policy: {module: dtype}|null,
    #: dtype: str|null, option: str|null}
    applied_as: dict[str, Any] | None = None


@dataclass
class Diagnosis:
    cause: str
    dtype: str | None
    module: str | None
    op: str | None
    summary: str
    evidence: list[str]
    fix: str
    fix_verified: FixVerified | None = None  # contract v1.2; None: no mechanical fix, or nothing ran
    param: str | None = None  # the parameter named as the cause (one that does not fit the run's dtype)
    #: why ``fix_verified`` is null when the fix has a mechanical change (``explain.fix_check.UNVERIFIED``)
    fix_unverified: str | None = None
    #: contract v1.4: how IEEE arithmetic made the first non-finite element (``capture.mechanism.Mechanism``);
    #: null only when the op cannot be evaluated (a note says so)
    mechanism: str | None = None
    #: contract v1.4: what in the model it happened to (``explain.facts.Subject``), or null
    subject: str | None = None
    #: contract v1.4: other proposals, each with its own verification: [{fix, fix_verified}]
    alternatives: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class BisectResult:
    dtype: str
    keep_dtype: str
    keep_modules: list[str]
    runs: int
    finite_after: bool
    max_rel_err: float | None
    granularity: str = "leaf"
    bound: int | None = None
    candidates: int | None = None
    failing_inputs: list[int] | None = None
    shortest_failing_prefix: dict[str, int] | None = None
    over: str = "modules"  # modules: a keep set; inputs: which inputs fail (its own verdict)
    already_finite: bool = False  # the low-precision run needed nothing kept
    keep_in_fp32_modules: list[str] | None = None  # transformers' _keep_in_fp32_modules for this set


@dataclass
class RequestOutcome:
    """One request of a packed batch (contract v1.4, "Serving: packed batches")."""

    id: str
    failed: bool  # its outputs went non-finite in the batch
    origin: bool  # replayed alone, it still fails: its own input or state caused it
    poisoned_by: str | None = None  # the origin request whose fault reached it through the packed batch
    step: int | None = (
        None  # its own decode step at its first non-finite row (0: the forward reading its prompt)
    )
    position: int | None = None  # that row's position in its own sequence
    token: dict[str, Any] | None = None  # {id, text} read at that position
    module: str | None = None
    op: str | None = None
    cause: str | None = None


@dataclass
class Eviction:
    """What a failing request wrote from its failing step on: to evict, never to reuse."""

    request: str
    blocks: list[int] = field(default_factory=list)  # KV blocks (the paged cache's block ids)
    prefixes: list[str] = field(
        default_factory=list
    )  # prefix-cache entries (content hashes) pointing at them


@dataclass
class RunInfo:
    """The report's ``run`` block, typed. Every field is present in the JSON (null where it does
    not apply); fields are readable as attributes or keys (``rep.run["generate"]``)."""

    dtype: str | None  # the run's precision (contract v1)
    device: str
    n_inputs: int
    failed_inputs: list[int] = field(default_factory=list)  # data-set indices that went non-finite
    compute_dtype: str | None = None  # what activations are stored in (an fp8 run: bf16 or fp32)
    inputs: list[str] = field(default_factory=list)  # a label per input ("prompt 0", a file name...)
    generate: dict[str, Any] | None = None  # --generate: contract v1.1 "Generation"
    backward: bool | None = None  # gradients captured (--backward, watch(backward=True))
    loss: str | None = None  # --backward: what was differentiated
    optimizer_steps: int | None = None  # watch(optimizer=...): steps seen
    scaler_skipped_steps: list[int] | None = None  # GradScaler skips that were not faults
    capsule: str | None = None  # where the capsule of the first fault was written
    autocast: dict[str, str] | None = None  # {device_type, dtype} of the failing (or latest) step's autocast
    ranks: int | None = None  # under torchrun: how many ranks split the data set
    command: list[str] | None = None  # contract v1.2: the command line as run (argv)
    skipped_steps: list[int] | None = (
        None  # on_fault "skip", or "stop" with optimizer=: steps whose update was undone
    )
    on_fault: str | None = None  # watch(on_fault=...): record | raise | skip | stop | abort
    requests: list[RequestOutcome] | None = (
        None  # contract v1.4: a packed batch's requests (continuous batching)
    )
    evict: list[Eviction] | None = None  # contract v1.4: KV blocks and prefix entries a failing request wrote
    #: the quantization method of a model run in its own quantized form (bitsandbytes: not cast to ``dtype``
    #: asked, its unquantized parts in ``dtype``); null for a plain model
    quantized: str | None = None
    level: str | None = None  # contract v1.4: watch(level=...) as it ran: sentinel | blocks | modules | ops
    sample_every: int | None = (
        None  # contract v1.4: sentinel, full block statistics every N-th step (0: never)
    )
    latent: list[dict[str, Any]] | None = (
        None  # sentinel, sampled steps: [{step, module}] non-finite inside, finite out
    )
    eval: dict[str, Any] | None = (
        None  # contract v1.4: the callbacks' evaluation loops (integrations.eval_loops)
    )

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self.__dataclass_fields__:
            raise KeyError(f"run has no field {key!r}")
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return key in self.__dataclass_fields__

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default) if key in self.__dataclass_fields__ else default

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    checkpoint: dict[str, Any] | None = None
    weights: dict[str, Any] | None = None
    run: RunInfo | None = None
    first_nonfinite: FirstNonfinite | None = None
    replay: dict[str, ReplayRow] | None = None
    diagnosis: Diagnosis | None = None
    bisect: BisectResult | None = None
    # extensions
    notes: list[str] = field(default_factory=list)
    near_misses: list[dict[str, Any]] = field(default_factory=list)
    modules: list[ModuleRow] | None = None  # per-module-call stats in execution order
    inputs: list[dict[str, Any]] | None = None  # per input: finite, first_nonfinite summary
    check: dict[str, Any] | None = None
    compile: CompileResult | None = None  # scan --compile: eager against torch.compile
    baseline: dict[str, Any] | None = None  # check --baseline OLD: {path, compared, regressions}
    mode: str = "scan"
    #: contract v1.4, watch reports: the overflow forecast from the sentinel's sampled steps
    #: ([{module, signal, dtype, headroom_db, rate_db_per_100_steps, projected_step, confidence}];
    #: null when no step was sampled) and the precursor warnings ([{code, step, module, evidence, fix}])
    forecast: list[dict[str, Any]] | None = None
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def run_fact(self, key: str, default: Any = None) -> Any:
        """``run[key]``; ``default`` where the key is unset or the report has no ``run`` block."""
        return self.run.get(key, default) if self.run is not None else default

    @property
    def nonfinite_found(self) -> bool:
        if self.weights and self.weights.get("nonfinite"):
            return True
        return self.first_nonfinite is not None

    def exit_code(self) -> int:
        if self.bisect is not None:
            if self.bisect.over == "inputs":  # listing the failing inputs is the answer
                return 0 if self.bisect.failing_inputs is not None else 1
            return 0 if self.bisect.finite_after else 1
        if self.check is not None:
            return 0 if self.check.get("passed") else 1
        fault = self.diagnosis is not None and self.diagnosis.cause in (
            "compile_divergence",
            "bad_scale",
            "bad_zero_point",
        )
        return 1 if self.nonfinite_found or fault else 0

    def add_context(self, command: list[str] | None = None, texts: list[str | None] | None = None) -> None:
        """Contract v1.2: ``run.command`` (the argv as run) and ``inputs[i].text`` (the prompt or data
        line, first ``TEXT_CHARS`` characters; null for a file)."""
        if self.run is not None and command is not None:
            self.run["command"] = list(command)
        for row in self.inputs or []:
            i = row.get("index")
            if texts is not None and isinstance(i, int) and 0 <= i < len(texts):
                text = texts[i]
                row["text"] = text[:TEXT_CHARS] if text is not None else None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": SCHEMA,
            "nanhunter_version": __version__,
            "torch_version": torch_version(),
            "checkpoint": self.checkpoint,
            "weights": self.weights,
            "run": self.run.to_dict() if isinstance(self.run, RunInfo) else self.run,
            "first_nonfinite": None,
            "replay": replay_json(self.replay),
            "diagnosis": asdict(self.diagnosis) if self.diagnosis else None,
            "notes": self.notes,
            "near_misses": self.near_misses,
            "modules": rows_json(self.modules),
            "inputs": self.inputs,
            "compile": self.compile.to_dict() if isinstance(self.compile, CompileResult) else self.compile,
            "mode": self.mode,
        }
        if isinstance(d["run"], dict):
            d["run"] = {**d["run"], "command": d["run"].get("command")}
        if d["inputs"] is not None:
            d["inputs"] = [{**row, "text": row.get("text")} for row in d["inputs"]]
        if self.first_nonfinite is not None:
            self.first_nonfinite.sync_source()
            d["first_nonfinite"] = asdict(self.first_nonfinite)
        if self.bisect is not None:
            d["bisect"] = asdict(self.bisect)
        elif self.mode == "bisect":
            d["bisect"] = None
        if self.check is not None:
            d["check"] = self.check
        if self.baseline is not None:
            d["baseline"] = self.baseline
        if self.mode == "watch":
            d["forecast"], d["warnings"] = self.forecast, self.warnings
        safe: dict[str, Any] = json_safe(d)  # a dict stays a dict
        return safe


def torch_version() -> str | None:
    """The version of the torch that runs (or would run) the model: ``torch.__version__`` when torch is
    loaded; else read from the installed package's ``torch/version.py`` (where ``torch.__version__``
    comes from) without importing it, so a weights-only report costs no torch start-up; None when torch
    is not installed."""
    import sys

    if "torch" in sys.modules:
        return str(sys.modules["torch"].__version__)
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    for where in spec.submodule_search_locations or ():
        try:
            with open(f"{where}/version.py", encoding="utf-8") as f:
                m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(1 << 16), re.M)
        except OSError:
            continue
        if m:
            return m.group(1)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def json_safe(obj: Any) -> Any:
    """JSON has no NaN/Infinity: non-finite floats become null (strict JSON parsers accept it)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def json_text(report: Report | list[Report]) -> str:
    """One report as report v1; a list (``check`` over several checkpoints) as a JSON array of them."""
    data = [r.to_dict() for r in report] if isinstance(report, list) else report.to_dict()
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def write_json(report: Report | list[Report], path: str) -> None:
    """``--json PATH`` (``-``: stdout), written atomically by ``nan_hunter.outputs``."""

    write_text("--json", path, json_text(report))
