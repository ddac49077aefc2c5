"""transformers' ``_keep_in_fp32_modules`` for a keep set, printed only when it was tried and worked
(contract v1.4): the model's own class, with the keep set as its ``_keep_in_fp32_modules``, loaded
from the checkpoint directory in the low dtype the way a user would (``from_pretrained(dir,
dtype=...)``) and run on the bisected inputs. Many architectures (Llama, Qwen2, Mistral) keep the
weights in fp32 but do not cast activations at the kept module's boundary, so the forward raises
a dtype mismatch: then the line is not printed, and a note says why and what works instead (the
policy). Only for a transformers model loaded from a Hugging Face directory; never for ``--arch``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ..dtypes import RunDtype
from ..model.execute import cast_batch, run_context
from ..model.placement import dtype_keyword
from ..tree import float_tensors


def is_transformers_model(model: Any) -> bool:
    tf = sys.modules.get("transformers")
    return tf is not None and isinstance(model, tf.PreTrainedModel)


def try_keep_in_fp32(
    path: str, model: Any, keep: list[str], run: RunDtype, batches: list[dict[str, Any]]
) -> tuple[bool, str]:
    """Whether loading ``path`` with ``_keep_in_fp32_modules = keep`` in ``run``'s dtype and running
    ``batches`` gives finite outputs; and a line saying what happened."""
    cls = type(model)
    name = cls.__name__
    if run.is_fp8 or run.compute not in ("fp16", "bf16"):
        return (
            False,
            f"transformers' _keep_in_fp32_modules not tried: it applies to fp16/bf16 loading, not {run.name}",
        )
    sub: type[Any] = type(name, (cls,), {"_keep_in_fp32_modules": list(keep), "__module__": cls.__module__})
    try:
        m = sub.from_pretrained(
            path,
            local_files_only=True,
            trust_remote_code=False,  # dtype: by version
            attn_implementation=getattr(model.config, "_attn_implementation", None),
            **{dtype_keyword(): run.torch_compute},
        ).eval()
        dev = next(m.parameters()).device
        with torch.no_grad(), run_context(run):
            for kw in batches:
                outs = [t for _, t in float_tensors(m(**cast_batch(kw, run, dev)))]
                if not all(bool(torch.isfinite(t).all()) for t in outs):
                    return False, (
                        f"transformers' _keep_in_fp32_modules = {list(keep)} was tried on {name} in "
                        f"{run.name}: the outputs stay non-finite; apply the policy instead "
                        "(nan_hunter.apply_policy / --policy-out)"
                    )
    except Exception as e:  # noqa: BLE001 - the architecture cannot run with it: that is the answer
        msg = str(e).splitlines()[0] if str(e) else ""
        return False, (
            f"transformers' _keep_in_fp32_modules = {list(keep)} was tried on {name} in {run.name} and "
            f"fails ({type(e).__name__}: {msg}): {name} does not cast activations at a kept module's "
            "boundary; apply the policy instead (nan_hunter.apply_policy / --policy-out)"
        )
    return (
        True,
        f"transformers' _keep_in_fp32_modules = {list(keep)} was tried on {name} in {run.name}: finite",
    )
