"""``scan --generate N`` on the shipped decode example (docs/contract.md, "Generation"): the
prompt's forward is finite in fp16, decode step 3 overflows the residual. The headline case and
the refused counts run the real CLI (``cli``); the others run the command in-process (``cli_main``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llama-decode-fp16"
FAILING, CLEAN = "the 1 2 3", "the quick brown fox"


def test_unbatched_names_step_position_module_op(cli_main):
    res = cli_main("scan", EXAMPLE, "--prompt", FAILING, "--generate", "16", "--dtype", "fp16")
    assert res.code == 1, res.stderr
    r = res.report
    f = r["first_nonfinite"]
    # <s> the 1 2 3 | step 0 makes "4", step 1 reads "4" and makes "5", step 2 "6", step 3 reads "6"
    assert (f["step"], f["position"], f["input_index"]) == (3, 7, 0)
    assert (f["module"], f["op"], f["kind"], f["role"]) == (
        "model.layers.0",
        "aten.add.Tensor",
        "posinf",
        "producer",
    )
    g = r["run"]["generate"]
    assert g["max_new_tokens"] == 16 and g["steps"] == 4 and g["first_bad_step"] == 3
    assert g["new_tokens"] == [[7, 8, 9]]  # "4 5 6"
    assert g["fault_token"] == {"id": 9, "text": "6"}
    assert r["diagnosis"]["cause"] == "overflow" and "residual" in r["diagnosis"]["summary"]
    assert r["replay"]["fp16"]["finite"] is False and r["replay"]["bf16"]["finite"] is True
    # the terminal says when: the step, the token it read, where, and the text before
    assert "step 3, token 9 '6', at position 7, after: '4 5 6'" in res.stdout


def test_bf16_and_clean_prompt_exit_0(cli_main):
    res = cli_main("scan", EXAMPLE, "--prompt", FAILING, "--generate", "16", "--dtype", "bf16")
    assert res.code == 0, res.stderr
    g = res.report["run"]["generate"]
    assert g["first_bad_step"] is None and g["steps"] == 16 and len(g["new_tokens"][0]) == 16
    res = cli_main("scan", EXAMPLE, "--prompt", CLEAN, "--generate", "16", "--dtype", "fp16")
    assert res.code == 0 and res.report["first_nonfinite"] is None


def test_prompt_forward_alone_is_finite(cli_main):
    """Without --generate the scan sees only the prompt's forward, which is finite: the case
    users bring, and why --generate exists."""
    res = cli_main("scan", EXAMPLE, "--prompt", FAILING, "--dtype", "fp16")
    assert res.code == 0, res.stderr


def test_batched_left_padded_agrees_with_unbatched(cli_main):
    prompts = ["--prompt", "fox", "--prompt", FAILING]
    one = cli_main("scan", EXAMPLE, *prompts, "--generate", "16", "--dtype", "fp16")
    many = cli_main("scan", EXAMPLE, *prompts, "--generate", "16", "--dtype", "fp16", "--batch")
    assert one.code == many.code == 1, (one.stderr, many.stderr)
    assert one.report["run"]["failed_inputs"] == many.report["run"]["failed_inputs"] == [1]
    f = many.report["first_nonfinite"]
    # "fox" is 2 tokens, the failing prompt 5: row 1 has no padding; its own position is still 7
    assert (f["input_index"], f["step"], f["position"]) == (1, 3, 7)
    assert not any(
        "mask" in n and "fault" in n.lower() and "not a fault" not in n for n in many.report["notes"]
    )


def test_data_set_prompt_sensitivity(cli_main, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"text": "the quick brown fox"}\n{"text": "7 8"}\n{"text": "the 1 2 3"}\n')
    res = cli_main("scan", EXAMPLE, "--data", data, "--generate", "16", "--dtype", "fp16")
    assert res.code == 1, res.stderr
    g = res.report["run"]["generate"]
    assert res.report["run"]["failed_inputs"] == [1, 2]
    assert [(r["index"], r["failed"], r["step"]) for r in g["per_input"]] == [
        (0, False, None),
        (1, True, 8),
        (2, True, 3),
    ]
    # "7 8" needs only "<s> 7"; "the 1 2 3" needs "<s> the 1"
    assert g["shortest_failing_prefix"] == {"1": 2, "2": 3}
    assert res.report["first_nonfinite"]["input_index"] == 1
    assert "decoding per input" in res.stdout and "fails at step 8" in res.stdout


def test_model_without_generate_is_refused(cli_main, tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "arch.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 4)\n")
    save_file(torch.nn.Linear(4, 4).state_dict(), str(tmp_path / "w.safetensors"))
    save_file({"input": torch.ones(1, 4)}, str(tmp_path / "in.safetensors"))
    res = cli_main(
        "scan",
        tmp_path / "w.safetensors",
        "--arch",
        f"{tmp_path / 'arch.py'}:build",
        "--inputs",
        tmp_path / "in.safetensors",
        "--generate",
        "4",
        json_report=False,
    )
    assert res.code == 2 and "no generate()" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("bad", ["0", "-3"])
def test_bad_generate_count(cli_main, bad):
    res = cli_main("scan", EXAMPLE, "--prompt", FAILING, "--generate", bad, json_report=False)
    assert res.code == 2 and "--generate" in res.stderr


def test_check_and_bisect_accept_generate(cli_main):
    res = cli_main("check", EXAMPLE, "--prompt", FAILING, "--generate", "8", "--dtypes", "fp16,bf16")
    assert res.code == 1, res.stderr
    rules = {r["rule"]: r["status"] for r in res.report["check"]["results"]}
    assert rules["forward.fp16.nonfinite"] == "fail" and rules["forward.bf16.nonfinite"] == "pass"
    res = cli_main("bisect", EXAMPLE, "--prompt", FAILING, "--generate", "8", "--dtype", "fp16")
    assert res.code == 0, res.stderr
    b = res.report["bisect"]
    assert "model.layers.0" in b["keep_modules"] and b["finite_after"] is True and b["max_rel_err"] is None


def test_watch_around_generate_keeps_the_failing_step(tmp_path):
    """The Python API: a watch around a long generate() reports the step and position of the
    first fault, re-running that step from its own inputs (cache as it was), and leaves the
    user's cache and RNG as they were."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import nan_hunter

    tok = AutoTokenizer.from_pretrained(str(EXAMPLE))
    from nan_hunter.model.placement import dtype_keyword

    model = AutoModelForCausalLM.from_pretrained(str(EXAMPLE), **{dtype_keyword(): torch.float16}).eval()
    enc = tok(FAILING, return_tensors="pt")
    enc.pop("token_type_ids", None)  # transformers 4.5x's tokenizer returns them, its Llama refuses them
    with nan_hunter.watch(model) as w, torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=24, do_sample=False, pad_token_id=2, return_dict_in_generate=True
        )
    assert out.sequences.shape[1] == enc["input_ids"].shape[1] + 24  # 20 steps ran after the fault
    cache_len = out.past_key_values.get_seq_length()
    rng = torch.get_rng_state()
    r = w.report()
    f = r.first_nonfinite
    assert (f.step, f.module, f.op, f.kind) == (3, "model.layers.0", "aten.add.Tensor", "posinf")
    assert f.position == 7
    assert out.past_key_values.get_seq_length() == cache_len
    assert torch.equal(torch.get_rng_state(), rng)


class _DoneEvent:
    """A CUDA event that has always completed (the device path's flags, on a CPU)."""

    def record(self):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass


def test_generate_on_the_device_row_path(cli_main, monkeypatch):
    """--generate with the device-row sink (as on a GPU; here the Triton kernels interpreted on the
    CPU): decoding stops at the failing step from the device flags. Found on the first GPU run:
    the stopping criterion read ``scores``, which transformers 5 passes as None."""
    import os

    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreted device path (on a GPU, tests/integration/test_incidents.py's CUDA run)")
    from nan_hunter.capture import recorder, sink

    monkeypatch.setattr(sink, "select_backend", lambda device_type: "triton")
    monkeypatch.setattr(recorder.Recorder, "_rows_on_host", lambda self: False)
    monkeypatch.setattr(torch.cuda, "Event", _DoneEvent)
    res = cli_main("scan", EXAMPLE, "--prompt", FAILING, "--generate", "16", "--dtype", "fp16")
    assert res.code == 1, res.stderr
    f, g = res.report["first_nonfinite"], res.report["run"]["generate"]
    assert (f["step"], f["module"], f["kind"]) == (3, "model.layers.0", "posinf")
    assert g["steps"] == 4 and g["first_bad_step"] == 3
