"""What the reports say about fixes, without importing torch (the terminal view reads it for a
weights-only report too): the causes with a mechanical fix (``MECHANICAL``), why the others have
none (``no_mechanical_fix``), and why a fix with a change was not verified (``UNVERIFIED``). The
changes themselves and their re-runs are ``fix_check.py``."""

from __future__ import annotations

#: the causes ``fix_check`` has a mechanical change for
MECHANICAL = ("overflow", "division_by_zero", "scale_underflow", "masked_softmax", "compile_divergence")

NO_FIX = {
    "nonfinite_input": "the input data is bad: nothing in the model to change",
    "nonfinite_weights": "the checkpoint holds NaN/Inf: restore or re-export it",
    "bad_scale": "a quantization scale in the checkpoint is bad: re-export it",
    "bad_zero_point": "the zero points follow another convention than the checkpoint declares: re-export it "
    "with the right checkpoint_format",
    "domain_error": "the argument is outside the op's domain: the fix is upstream (a clamp changes the meaning)",
    "uninitialised_read": "the model reads memory it never wrote: the fix is in its code (write or mask it)",
    "not_reproducible": "the fault did not reproduce: there is nothing to re-run",
    "unknown": "no rule explains the fault, so no change can be derived",
}


def no_mechanical_fix(cause: str) -> str | None:
    """Why a cause has no fix that can be applied mechanically, or None when it has one."""
    if cause in MECHANICAL:
        return None
    return NO_FIX.get(cause, f"no mechanical fix is known for {cause}")


#: why a diagnosis with a fix has no ``fix_verified`` (``Diagnosis.fix_unverified``), as the reports say it
UNVERIFIED = {
    "no_change": "no change to try: the fix has no mechanical form for this fault at this precision",
    "control_finite": "not verified: an unchanged copy re-run on the failing input is finite at the failing "
    "region too, so a re-run cannot show that the change helps",
    "not_applicable": "not verified: none of the changes could be applied to a copy",
    "not_rerun": "not verified: the failing region could not be re-run",
}
