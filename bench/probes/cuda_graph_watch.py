"""Probe (GPU truth, call 4): bench/overhead.py's CUDA-graph variants hit a device-side assert
(an out-of-bounds gather) on the first GPU run. Reproduce step by step on a 2-layer Llama, with a
synchronisation after each step, to see which one corrupts memory."""

import sys
import traceback

import torch

import nan_hunter

sys.path.insert(0, "bench")
from overhead import _capture_graph  # noqa: E402


def main():
    from transformers import LlamaConfig, LlamaForCausalLM

    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 22  # 22: bench/overhead.py's ~1.1B model
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=4096,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16).eval()
    ids = torch.randint(0, 32000, (4, 512), device="cuda")
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def check(what):
        try:
            torch.cuda.synchronize()
            print("ok:", what, flush=True)
        except Exception as e:  # noqa: BLE001
            print("FAILED after:", what, type(e).__name__, str(e).splitlines()[0], flush=True)
            raise SystemExit(1) from None

    with torch.no_grad():
        ref = model(**inputs).logits.clone()
        check("plain forward")
        g0, out0 = _capture_graph(model, inputs, lambda: __import__("contextlib").nullcontext())
        g0.replay()
        check("plain graph replay")
        w = nan_hunter.watch(model, level="ops")
        try:
            _capture_graph(model, inputs, lambda w=w: w)
            print("ops-level capture did not raise", flush=True)
        except Exception as e:  # noqa: BLE001
            print("ops-level capture raised:", type(e).__name__, str(e).splitlines()[0][:200], flush=True)
        check("after the refused ops-level capture")
        y = model(**inputs).logits
        check(f"eager forward after the refused capture; equal {torch.equal(y, ref)}")
        g0.replay()
        check("plain graph replay after the refused capture")
        for level in ("blocks", "modules"):
            w = nan_hunter.watch(model, level=level)
            g, out = _capture_graph(model, inputs, lambda w=w: w)
            check(f"capture under watch {level}")
            for _ in range(3):
                g.replay()
            check(f"3 replays under watch {level}")
            print(level, "graph out equal to eager:", torch.equal(out.logits, ref), flush=True)
            r = w.report()
            check(f"report of the graph watch {level}: {r.first_nonfinite}")
            y = model(**inputs).logits
            check(f"eager forward after the graph watch {level}; equal {torch.equal(y, ref)}")
            with nan_hunter.watch(model, level=level):
                model(**inputs)
            check(f"fresh eager watch {level} after the graph")
            g.replay()
            check(f"replay after the watch is gone ({level})")
            y = model(**inputs).logits
            check(f"eager forward after that replay; equal {torch.equal(y, ref)}")


try:
    main()
except SystemExit:
    raise
except Exception:
    traceback.print_exc(file=sys.stdout)
