"""nan_hunter/modes/rank_split.py, what crosses ranks: ``RankSplit.share``, op events with
their operand statistics and diagnoses with a verified fix, as JSON and back.
(The split itself, torchrun detection and agreement: tests/unit/modes/test_rank_split_process.py.)"""

from __future__ import annotations

import json
import math

import torch

from nan_hunter.capture.ops import OpEvent, operand_stats
from nan_hunter.distributed.global_report import diagnosis_from_json
from nan_hunter.distributed.ranks import RankSplit, share
from nan_hunter.modes.rank_split import _event, _event_back, _span
from nan_hunter.report import Diagnosis, FixVerified


def test_ranksplit_share_is_the_module_share():
    assert RankSplit(1, 3).share(7) == share(7, 1, 3) == [2, 3]
    assert [RankSplit(r, 3).share(7) for r in range(3)] == [[0, 1], [2, 3], [4, 5, 6]]
    assert RankSplit(2, 4).share(1) == []


def test_span_text():
    assert _span([]) == "no inputs" and _span([3]) == "input #3" and _span([2, 3, 4]) == "inputs #2-#4"


def event() -> OpEvent:
    x = torch.tensor([[1.0, -2.0], [0.0, 60000.0]], dtype=torch.float16)
    ops = [operand_stats(0, x), operand_stats(1, 2.5), operand_stats(2, torch.tensor([math.inf, 1.0]))]
    return OpEvent(
        op="aten.mul.Tensor",
        kind="posinf",
        nan=0,
        posinf=2,
        neginf=0,
        source="model.py:3  y = x * k",
        operands=ops,
        out_dtype="float16",
        module="layers.0",
        exact_absmax=1.5e5,
        exact_dtype="fp64",
        grad_fn="MulBackward0",
        call=object(),
    )


def test_op_event_crosses_ranks_as_json_and_comes_back_equal():
    ev = event()
    d = _event(ev)
    assert (
        d is not None and d["call"] is None and ev.call is not None
    )  # the live call stays behind, unchanged
    back = _event_back(json.loads(json.dumps(d, allow_nan=False)))
    assert back == ev  # every field, operands included (``call`` is not compared)
    assert back.call is None
    assert [o.index for o in back.operands] == [0, 1, 2]
    assert back.operands[0].shape == [2, 2] and back.operands[0].absmax == 60000.0
    assert back.operands[1].scalar == 2.5 and back.operands[2].posinf == 1 and not back.operands[2].finite
    assert _event(None) is None and _event_back(None) is None


def test_an_event_without_operands_comes_back_with_an_empty_list():
    ev = OpEvent(op="aten.log.default", kind="nan", nan=1, posinf=0, neginf=0, source=None)
    assert _event_back(json.loads(json.dumps(_event(ev)))) == ev
    d = _event(ev)
    d["operands"] = None
    assert _event_back(d).operands == []


def test_diagnosis_with_a_verified_fix_comes_back_typed():
    d = Diagnosis(
        cause="overflow",
        dtype="fp16",
        module="layers.0",
        op="aten.mul.Tensor",
        summary="s",
        evidence=["a", "b"],
        fix="keep it in fp32",
        fix_verified=FixVerified(change="layers.0 in fp32", finite=True, max_rel_err=1e-3, scope="model"),
    )
    from dataclasses import asdict

    back = diagnosis_from_json(json.loads(json.dumps(asdict(d))))
    assert back == d and isinstance(back.fix_verified, FixVerified)
    plain = Diagnosis(cause="unknown", dtype=None, module=None, op=None, summary="", evidence=[], fix="")
    assert diagnosis_from_json(asdict(plain)) == plain and diagnosis_from_json(None) is None
