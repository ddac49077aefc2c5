"""``watch(..., on_fault=...)``: what a watch does at the first fault, besides recording it.

- ``"record"`` (default): nothing more; ``report()`` explains it.
- ``"raise"``: ``NonFiniteError`` carrying the explained report, raised from the hook that first
  saw the fault (the root forward's end, the end of the backward pass, ``optimizer.step()``).
  Under torch.distributed the report carried is this rank's (a global report is a collective the
  other ranks would not join).
- ``"stop"``: ``should_stop`` becomes true; nothing is raised (loops and callbacks poll it). With
  ``optimizer=`` (contract v1.3) the failing step is also undone as ``"skip"`` undoes it, so what
  the user saves after stopping is the last good state, and the step is in ``skipped_steps``.
- ``"abort"`` (serving: continuous batching): the request whose rows went non-finite and that
  fails alone ends with an error naming the cause; every other request is re-run without it, so its
  tokens are those of a batch without it (``serving.tracker``); its KV blocks are freed uncached.
- ``"skip"`` (needs ``optimizer=``): before every ``optimizer.step()`` the parameters the step
  will update and their optimizer state are copied into buffers allocated once (memory: one more
  copy of those parameters and of their state, flat over the run); after the step, when any
  forward since the previous step (gradient accumulation: every micro-batch of the step), its
  gradients or the update itself was non-finite, they are copied back, bitwise. The step's
  forward index is listed in ``run["skipped_steps"]``. (What the optimizer does not hold is not
  restored: an LR scheduler stepped after the update has still counted that step.)

On a host sink (CPU) the verdict of a step is known when ``optimizer.step()`` returns (forwards
are judged when they end, backward passes at their end, the update in the step's post-hook). On
a device sink (CUDA): ``skip`` decides with a device flag (``StatsSink.flag_nonfinite``) and
restores with ``torch.where`` on the device, no host synchronisation (the skipped steps are read
at ``report()``); ``raise`` and ``stop`` read one flag per step, just before ``optimizer.step()``
(the forward and gradients, so a fault is explained with the weights it ran with) and after it
(the update), or at the root forward's end without ``optimizer=``: one read-back per step, none
per hook. (Tested on CPU with the Triton sink's device rows interpreted, TRITON_INTERPRET=1; not
yet on a GPU.)
"""

from __future__ import annotations

import copy
import enum
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..errors import NonFiniteError
from ..tree import local_shard

if TYPE_CHECKING:  # pragma: no cover
    from .training_state import TrainingState


class PolicyHost(Protocol):
    """What ``FaultPolicy`` reads and calls on the watch it serves (a ``session.Watch``): the
    recording's verdicts and rows, the optimizer hooks, what training decided, this rank's report."""

    optimizer: Any
    sink: Any
    first_failed: int | None
    current_step: int
    training: TrainingState

    def rows_on_host(self) -> bool: ...
    def calls_of(self, step: int) -> list[Any] | None: ...
    def failed_forwards(self) -> list[int]: ...
    def judge_finished(self, upto: int) -> None: ...
    def judge_backward(self, steps: Any) -> bool: ...
    def judge_optimizer(self, step: int, calls: list[Any]) -> bool: ...
    def local_report(self) -> Any: ...


class OnFault(enum.Enum):
    """The five policies, and what each asks of the watch: the one place ``on_fault`` is parsed
    and the one place its behaviour is decided (the watch and the callbacks ask these properties,
    never the string)."""

    RECORD = "record"
    RAISE = "raise"
    SKIP = "skip"
    STOP = "stop"
    ABORT = "abort"

    @classmethod
    def parse(cls, value: Any, has_optimizer: bool, who: str = "on_fault") -> OnFault:
        """``value`` (a policy's name, or an ``OnFault``) checked: ``ValueError`` naming the choices,
        or ``skip`` without an optimizer to undo the step with."""
        if isinstance(value, cls):
            policy = value
        else:
            try:
                policy = cls(value)
            except ValueError:
                raise ValueError(f"on_fault must be one of {ON_FAULT}, got {value!r}") from None
        if policy.needs_optimizer and not has_optimizer:
            raise ValueError(
                f"{who}='skip' needs optimizer=: the watch restores the parameters and the "
                "optimizer state the faulty step changed"
            )
        return policy

    @property
    def needs_optimizer(self) -> bool:
        """``skip`` undoes the faulty step's update: it needs the optimizer."""
        return self is OnFault.SKIP

    @property
    def stops(self) -> bool:
        """``should_stop`` is what the loop polls."""
        return self is OnFault.STOP

    @property
    def raises(self) -> bool:
        return self is OnFault.RAISE

    @property
    def reads_each_step(self) -> bool:
        """The loop must learn of a fault before it goes on (``raise``, ``stop``): a device sink reads
        one flag per step (or per root forward without ``optimizer=``)."""
        return self in (OnFault.RAISE, OnFault.STOP)

    @property
    def aborts_requests(self) -> bool:
        """``abort`` (serving, contract v1.4): a faulty request of a packed batch ends with an error and
        the others are served as if it had not been there (``serving.tracker``)."""
        return self is OnFault.ABORT

    def undoes_faulty_steps(self, has_optimizer: bool) -> bool:
        """``skip``, and ``stop`` with ``optimizer=``: a step that saw a fault is not applied."""
        return self is OnFault.SKIP or (self is OnFault.STOP and has_optimizer)


#: the policies' names, as ``watch(on_fault=...)`` and the callbacks take them
ON_FAULT = tuple(p.value for p in OnFault)


def verdict_line(rep: Any) -> str:
    f = rep.first_nonfinite
    if f is None:
        return "nanhunter: a non-finite value was seen"
    where = f"{f.op} in {f.module or '<root>'}" if f.op else (f.module or "<root>")
    cause = f" ({rep.diagnosis.cause}: {rep.diagnosis.summary})" if rep.diagnosis is not None else ""
    return f"nanhunter: first non-finite value ({f.kind}) at step {f.step}, {f.phase}: {where}{cause}"


class _Event:
    """A CUDA event recorded now; on other devices (the interpreted test path) one already done."""

    def __init__(self, device: torch.device) -> None:
        self._e = None
        if device.type == "cuda":
            self._e = torch.cuda.Event()
            self._e.record()

    def query(self) -> bool:
        return self._e is None or self._e.query()

    def synchronize(self) -> None:
        if self._e is not None:
            self._e.synchronize()


class FaultPolicy:
    """The ``on_fault`` half of a ``session.Watch``."""

    def __init__(self, watch: PolicyHost, kind: OnFault) -> None:
        self.kind = kind  # checked once, by the watch's options (``session.options``)
        self.w = watch
        self.on_fault = self.kind.value  # the name, as reports give it (run["on_fault"])
        self.should_stop = False
        self.skipped: list[int] = []  # host sink: forwards whose optimizer step was undone
        # device sink: skip decisions not read yet, (forward, host flag, event, host-state restores)
        # (the flag is copied to pinned memory without a sync; at most a few steps stay pending)
        self._pending: list[tuple[int, torch.Tensor, Any, list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self._last_step_forward = -1  # the forward of the previous optimizer.step()
        self._stepped: set[int] = set()
        self._saved: list[tuple[torch.Tensor, torch.Tensor]] = []  # (parameter, buffer)
        self._buffers: dict[int, torch.Tensor] = {}
        self._state: list[tuple[torch.Tensor, dict[str, Any] | None]] = []
        self._state_buffers: dict[tuple[int, str], torch.Tensor] = {}
        self._raised = False
        self.step_label: dict[int, int] = {}  # forward -> the framework's step when it began (callbacks)

    @property
    def undoes_faulty_steps(self) -> bool:
        """``skip``, and ``stop`` with ``optimizer=``: a step that saw a fault is not applied (the
        save/restore below), so parameters and optimizer state stay the last good ones."""
        return self.kind.undoes_faulty_steps(self.w.optimizer is not None)

    # -- the first fault -----------------------------------------------------------------------
    def on_first_fault(self, forward: int, phase: str) -> None:
        if self.kind.stops:
            self.should_stop = True
        if self.kind.raises and not self._raised:
            self._raised = True
            rep = self.local_report()
            raise NonFiniteError(rep, verdict_line(rep))

    def local_report(self) -> Any:
        """This rank's explained report (the global one is a collective: not from inside a hook)."""
        return self.w.local_report()

    # -- skip (and stop with optimizer=): around optimizer.step() ---------------------------------
    def before_step(self, hooks: Any) -> None:
        w = self.w
        if self.kind.reads_each_step and not w.rows_on_host() and w.first_failed is None:
            # device sink: the step's forwards and gradients, read back once before the update, so
            # a fault is explained with the weights it ran with
            window = list(range(self._last_step_forward + 1, w.current_step + 1))
            flag = self._device_flag(window, [])
            if flag is not None and bool(flag):
                self._judge_now(window, [], w.current_step)
        if not self.undoes_faulty_steps:
            return
        self._settle()  # host-side state (AdamW's step counts) of an earlier skipped step, before this update
        opt = hooks.optimizer
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        with torch.no_grad():
            self._saved = []
            for p in params:
                local = local_shard(p.detach())  # FSDP2: this rank's shard (a DTensor has no foreach copy)
                buf = self._buffers.get(id(p))
                if (
                    buf is None
                    or buf.shape != local.shape
                    or buf.dtype != local.dtype
                    or buf.device != local.device
                ):
                    buf = self._buffers[id(p)] = torch.empty_like(local)
                self._saved.append((local, buf))
            if self._saved:
                torch._foreach_copy_([b for _, b in self._saved], [p for p, _ in self._saved])
            self._state = []
            for p in params:
                st = opt.state.get(p)
                if not st:
                    self._state.append((p, None))  # no state yet: a skipped first step leaves none
                    continue
                kept: dict[str, Any] = {}
                for k, v in st.items():
                    if isinstance(v, torch.Tensor):
                        v = local_shard(v)
                        key = (id(p), k)
                        buf = self._state_buffers.get(key)
                        if (
                            buf is None
                            or buf.shape != v.shape
                            or buf.dtype != v.dtype
                            or buf.device != v.device
                        ):
                            buf = self._state_buffers[key] = torch.empty_like(v)
                        buf.copy_(v)
                        kept[k] = buf
                    elif isinstance(v, (list, dict, tuple)):
                        kept[k] = copy.deepcopy(v)  # LBFGS's histories: lists it changes in place
                    else:
                        kept[k] = v
                self._state.append((p, kept))

    def after_forward(self, forward: int) -> None:
        """A root forward ended. A device sink with ``raise`` or ``stop`` and no ``optimizer=``: its
        flag is read now (one read-back per forward; a host sink judged it already)."""
        w = self.w
        if (
            self.kind.reads_each_step
            and w.optimizer is None
            and not w.rows_on_host()
            and w.first_failed is None
        ):
            flag = self._device_flag([forward], [])
            if flag is not None and bool(flag):
                self._judge_now([forward], [], forward)

    def _judge_now(self, window: list[int], calls: list[Any], forward: int) -> None:
        """Device sink, a step flagged as failing: judge its phases now (reads its rows once), so
        the first fault is known (and raised) before control returns to the loop."""
        w = self.w
        w.judge_finished(forward)
        if w.first_failed is not None:
            return
        if not w.judge_backward(window):
            w.judge_optimizer(forward, calls)

    def after_step(self, forward: int, hooks: Any, calls: list[Any]) -> None:
        w = self.w
        if (
            w.training.scaler is not None
        ):  # read only to tell a step the GradScaler skipped: kept only then (flat memory)
            self._stepped.add(forward)
        # every forward since the previous step: micro-batches, and a closure's re-evaluations (LBFGS)
        window = range(self._last_step_forward + 1, max(forward, w.current_step) + 1)
        self._last_step_forward = max(forward, w.current_step)
        if self.kind.reads_each_step and not w.rows_on_host() and w.first_failed is None:
            flag = self._device_flag(list(window), calls)  # one read-back per step, none per hook
            if flag is not None and bool(flag):
                self._judge_now(list(window), calls, forward)
        if not self.undoes_faulty_steps or not self._saved:
            return
        if w.rows_on_host():
            failed = set(w.failed_forwards()) | set(w.training.pending)
            # the step's own gradients as the optimizer saw them (after DDP's all-reduce: the same on
            # every rank, so every rank skips the same steps), and the update
            rows = w.sink.read([r for c in calls for refs in (c.inputs, c.outputs) for _, r in refs])
            seen = any(
                rows[r][0][1] or rows[r][0][2] or rows[r][0][3]
                for c in calls
                for refs in (c.inputs, c.outputs)
                for _, r in refs
            )
            if seen or any(f in failed for f in window):
                self._restore(hooks.optimizer, None)
                self._skipped(forward)
        else:
            flag = self._device_flag(list(window), calls)
            if flag is not None:
                host_restores = self._restore(hooks.optimizer, flag)
                host = torch.empty((), dtype=torch.bool, pin_memory=flag.device.type == "cuda")
                host.copy_(flag, non_blocking=True)
                event = _Event(flag.device)
                self._pending.append((forward, host, event, host_restores))
        self._saved = []

    def _settle(self, wait: bool | None = None) -> None:
        """Read the skip flags the device has computed: a skipped step is recorded and its host-side
        optimizer state restored. ``wait`` (default: when some pending step has host-side state to
        restore, which the next update must not see) waits for them; else only finished ones."""
        if wait is None:
            wait = any(r for *_, r in self._pending)
        while self._pending:
            forward, host, event, restores = self._pending[0]
            if not wait and not event.query():
                return
            event.synchronize()
            self._pending.pop(0)
            if bool(host):
                self._skipped(forward)
                for cur, v in restores:
                    cur.copy_(v)

    def _device_flag(self, forwards: list[int], step_calls: list[Any]) -> torch.Tensor | None:
        """A device bool: whether any call of ``forwards`` (forward, backward, optimizer) has a
        non-finite output, or their data held NaN/+inf; computed without a host sync."""
        w = self.w
        calls = [c for f in forwards for c in (w.calls_of(f) or [])]
        outs = [r for c in calls for _, r in c.outputs] + [r for c in step_calls for _, r in c.inputs]
        data = [r for c in calls if c.parent is None and c.phase == "forward" for _, r in c.inputs]
        if not outs and not data:
            return None
        return w.sink.flag_nonfinite(outs, data)

    def _restore(self, opt: Any, flag: torch.Tensor | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Undo the step: now (``flag`` None), or on the device where ``flag`` is True (no host
        sync). Returns the restores a device flag cannot select on the host without a sync: state
        tensors in host memory (AdamW's step counts), as (tensor, saved value) for ``_settle``."""
        deferred: list[tuple[torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            params = [p for p, _ in self._saved]  # local shards: views of the parameters
            saved = [b for _, b in self._saved]
            if flag is None:
                torch._foreach_copy_(params, saved)
            else:
                for p, b in self._saved:
                    torch.where(flag, b, p, out=p)
            for p, kept in self._state:
                if kept is None:
                    if flag is None:
                        opt.state.pop(p, None)
                    continue  # device sink: a first step's fresh state stays (the parameters are restored)
                st = opt.state[p]
                for k, v in kept.items():
                    if isinstance(v, torch.Tensor):
                        cur = st.get(k)
                        if not isinstance(cur, torch.Tensor):
                            st[k] = v.clone()
                        elif flag is None:
                            local_shard(cur).copy_(v)
                        elif v.device != flag.device:  # reading the flag here would be a sync: later
                            deferred.append((local_shard(cur), v.clone()))
                        else:
                            cur_l = local_shard(cur)
                            torch.where(flag, v, cur_l, out=cur_l)
                    elif flag is None:
                        st[k] = copy.deepcopy(v) if isinstance(v, (list, dict, tuple)) else v
        return deferred

    def _skipped(self, forward: int) -> None:
        """Record a step whose update was undone, and say so as it happens (the ``nan_hunter``
        logger: a training log shows each skipped step, not only the report at the end)."""
        import logging

        self.skipped.append(forward)
        if self.kind.stops:
            # stop with optimizer=: a step undone here stops the loop too, also on a rank that saw the
            # fault only in its gradients after DDP's all-reduce (it never located one of its own):
            # every rank then leaves the loop at the same step, none waits alone in the next all-reduce
            self.should_stop = True
        logging.getLogger("nan_hunter").warning(
            "nanhunter: step %s went non-finite; its optimizer update was undone (on_fault=%r)",
            self.label(forward),
            self.on_fault,
        )

    # -- the report ----------------------------------------------------------------------------
    def skipped_steps(self) -> list[int]:
        if not self.undoes_faulty_steps:
            return []
        self._settle(wait=True)
        out = set(self.skipped)
        w = self.w
        if w.training.scaler is not None:  # a real fault the GradScaler kept from stepping: skipped too
            out |= {
                f
                for f in w.failed_forwards()
                if f not in self._stepped and f not in w.training.scaler_skipped
            }
        return sorted(out)

    def finish(self, rep: Any) -> None:
        """``run["skipped_steps"]`` and ``run["on_fault"]``; under a callback, steps named as the
        framework counts them."""
        rep.run["on_fault"] = self.on_fault
        rep.run["skipped_steps"] = [self.label(f) for f in self.skipped_steps()]
        if self.step_label and rep.first_nonfinite is not None:
            rep.first_nonfinite.step = self.label(rep.first_nonfinite.step)

    def label(self, forward: int) -> int:
        """The framework's step (``state.global_step``) a forward belongs to: the latest step
        that began at or before it; the forward index itself when no framework labels steps."""
        if not self.step_label:
            return forward
        starts = [f for f in self.step_label if f <= forward]
        return self.step_label[max(starts)] if starts else forward
