"""The forward mode: one no-grad forward per input (``nanhunter scan``, ``check``, bisect)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .recording import Recording

if TYPE_CHECKING:  # pragma: no cover
    from ..explain.assemble import Located
    from ..model.prepare import Prepared
    from ..report import Report


class ForwardMode:
    name = "forward"
    one_step_table = False

    @classmethod
    def wanted(cls, request: Any) -> bool:
        return True  # one forward per input: what any other request falls back to

    @classmethod
    def from_request(cls, request: Any) -> ForwardMode:
        return cls()

    def check(self, p: Prepared) -> None:
        return None

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        from ..kernels.compare import flat

        return flat(model(**kwargs))

    def record(self, p: Prepared, indices: list[int]) -> Recording:
        from ..capture.run import capture_run
        from ..explain.assemble import near_misses
        from ..locate.producer import call_table, failed_inputs, first_finding, mask_notes

        rec = capture_run(p.model, [p.batches[i] for i in indices], "modules", p.run, self.run_input)
        rec.renumber_steps(indices)  # local forward number → data-set index
        rows = rec.sink.rows()
        finding = first_finding(rec.calls, rows)  # by input first: the lowest data-set index wins
        failed = failed_inputs(rec.calls, rows)
        absorbed: list[dict[str, Any]] = []
        if finding is None and p.cfg.near_miss.absorbed_intermediates and indices:
            ops = capture_run(p.model, [p.batches[i] for i in indices], "ops", p.run, self.run_input).op_records
            absorbed = near_misses([], p.run, p.cfg, ops)
        return Recording(finding, finding.call.input_index if finding else None, failed,
                         call_table(rec.calls, rows), mask_notes(rec.calls, rows), absorbed)

    def locate(self, p: Prepared, rec: Recording, replay: bool) -> Located:
        from ..capture.run import forward

        kw = p.batches[rec.first_input]
        return locate_forward(p, rec.finding, lambda: forward(p.model, kw, p.run, lambda: self.run_input(p.model, kw, None)),
                              rec.first_input, replay)

    def merge(self, extras: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def finish(self, p: Prepared, rep: Report, extra: dict[str, Any], located: Located | None) -> None:
        return None


def locate_forward(p: Prepared, finding: Any, rerun: Any, input_index: int, replay: bool,
                   step: int = 0) -> Located:
    """Op location and replay of a forward finding: re-run (``rerun``, a forward of the whole model
    from copies of the failing forward's inputs) to the failing module, then that module alone
    (under ``FirstBadOp``, then in every dtype). The region (module, args, kwargs) is kept in
    ``Located.region`` for fix verification."""
    from ..capture.blocks import main_blocks
    from ..explain import fix_check
    from ..explain.assemble import Located
    from ..explain.replay import replay as do_replay
    from ..locate.first_op import locate_op
    from ..locate.mha_slow_path import through_slow_path
    from ..locate.producer import to_first_nonfinite
    from ..model.placement import materialized
    from ..progress import stage

    call = finding.call
    matrix = None
    notes: list[str] = []
    with materialized(p.model, call.module):  # --device-map: offloaded weights in place for the re-runs
        with stage("locate"):
            ev, target, margs, mkw = through_slow_path(locate_op(p.model, rerun, finding, p.run),
                                                       lambda: locate_op(p.model, rerun, finding, p.run), notes)
        if replay and finding.role == "producer":
            with stage("replay"):
                matrix = do_replay(target, margs, mkw, p.run)
    first = to_first_nonfinite(finding, ev, step=step)
    first.input_index = input_index
    # the whole model is copied for the check only where it is in memory: a placed model (--device-map)
    # keeps offloaded weights on meta between calls, so its failing module is checked alone
    placed = getattr(p.model, "hf_device_map", None) is not None
    whole = {"model": p.model, "batch": p.batches[input_index]} \
        if step == 0 and finding.role == "producer" and not placed else {}

    def verify(d: Any) -> None:
        with materialized(p.model, call.module):
            fix_check.check(d, fix_check.Region(call.module, target, margs, mkw), p.run, **whole)

    return Located(first, p.run, ev, matrix, is_block=call.module in set(main_blocks(p.model)),
                   input_label=p.labels[input_index], notes=notes, region=(target, margs, mkw), verify_fix=verify)
