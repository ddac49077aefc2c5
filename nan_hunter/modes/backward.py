"""``nanhunter scan ... --backward [--loss file.py:fn]``: each input's forward then the backward of
a loss, under module-level capture with gradients captured (the harness's).

The loss: ``fn(outputs, batch) -> scalar tensor`` from ``--loss`` (loaded as ``--arch`` code is:
no ``__pycache__`` written, ``sys.exit`` is an error), else the model's own, for Hugging Face
causal LMs: ``labels`` = ``input_ids`` with padding positions (``attention_mask`` 0) set to -100,
passed through the model's ``labels=`` argument. Gradients are computed into ``.grad`` and
cleared after each input; the weights never change (no optimizer step).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BadInput
from ..kernels.compare import flat
from ..model.build import load_factory
from .base import ModeBase

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..locate.located import Located
    from ..model.prepare import Prepared
    from ..report import Report


@dataclass
class Loss:
    """How one batch becomes a scalar to differentiate: extra forward arguments, then the value."""

    describe: str
    extra: Callable[[dict[str, Any]], dict[str, Any]]
    value: Callable[[Any, dict[str, Any]], Any]

    def of(self, model: Any, kw: dict[str, Any]) -> torch.Tensor:
        """Forward (with grad) and the loss of batch ``kw``; bad outputs of the user's code are BadInput."""
        return self.run(model, kw)[1]

    def run(self, model: Any, kw: dict[str, Any]) -> tuple[Any, torch.Tensor]:
        """(the model's outputs, the loss) of batch ``kw``, forward with grad."""
        import torch

        try:
            out = model(**kw, **self.extra(kw))
        except BadInput:
            raise
        except Exception as e:
            raise BadInput(
                f"the model raised {type(e).__name__} in {type(model).__name__}.forward(): "
                f"{_line(e)}; check that the inputs match what the model expects"
            ) from None
        try:
            val = self.value(out, kw)
        except SystemExit as e:
            raise BadInput(
                f"--loss: {self.describe} called sys.exit({e.code!r}); it must return a scalar tensor"
            ) from None
        except BadInput:
            raise
        except Exception as e:
            raise BadInput(f"--loss: {self.describe} raised {type(e).__name__}: {_line(e)}") from None
        if not (isinstance(val, torch.Tensor) and val.numel() == 1 and val.is_floating_point()):
            raise BadInput(
                f"--loss: {self.describe} returned {type(val).__name__}"
                f"{'' if not isinstance(val, torch.Tensor) else f' of shape {list(val.shape)}'}, "
                "not a floating scalar tensor"
            )
        if not val.requires_grad:
            raise BadInput(
                f"--loss: {self.describe} returned a tensor that does not depend on the model's "
                "parameters (no grad_fn); return a loss computed from the outputs"
            )
        return out, val.reshape(())


def _line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else ""


def is_causal_lm(model: Any) -> bool:
    """A transformers causal LM whose forward takes ``labels`` (it computes its own loss)."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    if not isinstance(model, PreTrainedModel) or not type(model).__name__.endswith("ForCausalLM"):
        return False
    return "labels" in inspect.signature(model.forward).parameters


def causal_lm_labels(kw: dict[str, Any]) -> dict[str, Any]:
    if "labels" in kw:  # an --inputs file that brings its own labels
        return {}
    ids = kw.get("input_ids")
    if ids is None:
        raise BadInput(
            "--backward: the model's own loss needs input_ids (labels = input_ids); give --prompt, --data "
            "or --inputs with input_ids, or pass --loss file.py:fn"
        )
    labels = ids.clone()
    mask = kw.get("attention_mask")
    if mask is not None and mask.shape == ids.shape:
        labels[mask == 0] = -100  # padding positions take no loss
    return {"labels": labels}


def load_loss(model: Any, spec: str | None) -> Loss:
    """``--loss file.py:fn`` (or ``package.module:fn``), else the causal LM's own loss; neither: exit 2."""
    if spec:
        try:
            fn = load_factory(spec)
        except BadInput as e:
            raise BadInput(
                str(e)
                .replace("--arch", "--loss", 1)
                .replace("must return an nn.Module", "must return a loss")
            ) from None
        return Loss(f"{spec}", lambda kw: {}, fn)
    if is_causal_lm(model):
        return Loss(
            f"{type(model).__name__}'s own loss (labels = input_ids)",
            causal_lm_labels,
            lambda out, kw: out.loss,
        )
    raise BadInput(
        f"--backward: {type(model).__name__} is not a Hugging Face causal LM, so there is no loss of its own "
        "to differentiate; pass --loss file.py:fn with fn(outputs, batch) -> scalar tensor"
    )


class BackwardMode(ModeBase):
    """``--backward [--loss file.py:fn]``: each input's forward, then the backward of the loss,
    under module-level capture with gradients captured. Gradients are computed into ``.grad`` and
    cleared after each input; the weights never change (no optimizer step). A backward fault is
    re-run from the gradients kept at the model's outputs (``locate.rerun``), so the loss is not
    computed again."""

    name = "backward"
    grad = True

    def __init__(self, loss_spec: str | None) -> None:
        self.loss_spec = loss_spec
        self.loss: Loss | None = None  # known once a model is given (``check``)

    @classmethod
    def wanted(cls, request: Any) -> bool:
        return request.backward

    @classmethod
    def from_request(cls, request: Any) -> BackwardMode:
        return cls(request.loss)

    def check(self, p: Prepared) -> None:
        self.loss = load_loss(p.model, self.loss_spec)
        for q in p.model.parameters():
            if q.is_floating_point():
                q.requires_grad_(True)

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        assert self.loss is not None
        out, val = self.loss.run(model, kwargs)
        val.backward()
        model.zero_grad(set_to_none=True)
        return flat(out)

    def finish(self, p: Prepared, rep: Report, extra: dict[str, Any], located: Located | None) -> None:
        assert self.loss is not None and rep.run is not None  # protocol.fill sets rep.run before finish
        rep.run.backward = True
        rep.run.loss = self.loss.describe
        rep.notes.append(f"--backward: forward then backward of {self.loss.describe} for each input")
