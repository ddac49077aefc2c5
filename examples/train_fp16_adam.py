"""A training run that goes NaN: a tiny transformers Llama trained in fp16 with Adam (eps 1e-8,
which rounds to 0 in fp16), under ``nan_hunter.watch`` with a capsule.

    python examples/train_fp16_adam.py [CAPSULE_DIR]      # default: examples/capsules/adam-eps-fp16

prints what the watch found, and writes the capsule of the failing step, which
``nanhunter scan CAPSULE_DIR/step-0`` replays in another process (examples/capsules/ ships one).
"""

from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path

import torch

import nan_hunter


def build() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).half()


def main(out: Path) -> int:
    warnings.simplefilter("ignore")
    model = build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # eps=1e-8: 0 in fp16
    g = torch.Generator().manual_seed(0)
    if out.exists():
        shutil.rmtree(out)
    with nan_hunter.watch(model, backward=True, optimizer=opt, capsule_dir=str(out)) as w:
        for step in range(3):
            ids = torch.randint(0, 64, (2, 16), generator=g)  # tokens 64..127 never occur: zero gradients
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"step {step}: loss {loss.item():.4f}")
    rep = w.report()
    f = rep.first_nonfinite
    print(f"first non-finite: step {f.step}, phase {f.phase}, param {f.param}, op {f.op}")
    print(f"cause: {rep.diagnosis.cause}: {rep.diagnosis.summary}")
    print(f"fix: {rep.diagnosis.fix}")
    print(f"capsule: {rep.run['capsule']}")
    return 0


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else here / "capsules" / "adam-eps-fp16"))
