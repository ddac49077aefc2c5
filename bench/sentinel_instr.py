"""Instruction counts of the sentinel level (issue 45's targets) through the shared callgrind harness.

``/work/shared/tools/instr_ratio.py`` (``--tool``, or ``$NANHUNTER_INSTR_RATIO``) measures only
its own three workloads at the ``blocks`` level. This script loads it, registers the workloads
below, and runs its ``main`` with the same options (``--workloads``, ``--repeats``, ``--k``,
``--json``, ``--keep-dumps``...); the children it starts run this file again, so they see the same
workloads. Every workload is fp32 on the CPU, one thread, random weights from a config (seed 0):

* ``train_llama``: a LlamaForCausalLM (hidden 256, 4 layers, 8 heads, intermediate 688, vocab
  4096; 5.3 M parameters), batch 4 × 64 random ids; a step = forward with ``labels``, backward,
  ``AdamW(lr=1e-4).step()``, ``zero_grad``. Variants: ``plain``; ``sentinel`` = ONE
  ``nan_hunter.watch(model, backward=True, optimizer=opt)`` (the default level) entered around the
  warm-up and the regions; ``skip`` = the same with ``on_fault="skip"``; ``sampled`` = the same with
  ``sample_every=1`` (every step a sampled step: the cost of one).
* ``trainer``: the same model under a real ``transformers.Trainer`` (``max_steps`` S, batch 4 ×
  64, no saving/logging/eval); an iteration is one ``trainer.train()`` of S steps, for the cases S =
  2 and S = 4 (their difference is the marginal cost of a step, without the Trainer's set-up).
  Variants: ``plain``, ``callback`` = ``NanHunterCallback()`` (default level, ``on_fault="stop"``),
  ``callback_skip`` = ``NanHunterCallback(on_fault="skip")``.
* ``llama110m``: a ~110 M-parameter LlamaForCausalLM (hidden 768, 12 layers, 12 heads,
  intermediate 2048, vocab 32000, tied embeddings); an iteration is one greedy ``generate()`` of T
  new tokens from a 5-token prompt, for T = 2 and T = 4 (the difference: two decode forwards).
  Variants: ``plain``, ``sentinel`` = a fresh ``nan_hunter.watch(model)`` per generate.
* ``minilm_train_sentinel``: the harness's ``minilm_train`` (all-MiniLM-L6-v2, 8 × 128, AdamW)
  with ``plain`` and ``sentinel`` as in ``train_llama``.
* ``tiny_decode``: the harness's ``decode`` (tiny Llama, greedy ``generate()`` of T = 16 and 32
  tokens) with ``plain`` and ``sentinel`` = a fresh ``nan_hunter.watch(model)`` per generate (the
  default level; the harness's own ``watch`` variant is ``blocks``).
* ``tiny_decode_long``: the same over T = 32 and 96 tokens ((X(T96) - X(T32)) / 64: one decode
  forward over 64, less moved by a one-off heap event; T96's watch folds twice, T32's never: the
  folds, one every 32 forwards, are in the difference), with a third variant ``sampled`` = a fresh
  ``nan_hunter.watch(model, sample_every=1)``: every step a sampled step, so its difference is the
  cost of one. At the default (one sampled step in ``SAMPLE_EVERY`` = 100) the average is
  ``sentinel + (sampled - sentinel) / 100``.
* ``cb_decode``: transformers' continuous batching (``model.generate_batch``, the real
  ``ContinuousBatchingManager``; as bench/serving_overhead.py: the 5.3 M Llama above with sdpa,
  8 requests × 16 prompt tokens, 8 new tokens, paged cache 64 × 32, no CUDA graphs, sync batching).
  The manager runs its loop in a thread that polls, so its instruction count varies between runs
  (measured: nonsense ratios); instead the packed forwards it ran are kept (keywords copied, the
  paged cache as it left it) and replayed in this thread: an iteration is the first F of them, F = 4
  and F = 8 (a prefill forward, then decode forwards of 8 rows: the difference is four packed decode
  forwards). Variants: ``plain``, ``sentinel`` = a fresh ``nan_hunter.watch(model)`` around them
  (the watch sees packed batches and does its per-forward logits check). The manager's own
  scheduling and sampling are not in ``plain``: the ratio is over the forwards alone, an upper
  bound for the whole loop.

    python bench/sentinel_instr.py --workloads train_llama --variants plain,sentinel,skip --repeats 1 \\
        --json out.json

The figure per iteration and the ratio to plain are the harness's; for ``trainer``, ``llama110m``
and ``cb_decode`` take (X(large) - X(small)) between the two cases from ``--json`` (the marginal
step / decode forward), as the harness's own decode workload does.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def _llama(hidden=256, layers=4, heads=8, inter=688, vocab=4096, tied=False, attn="sdpa"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg)


def _held(make):
    """A session entered once around the warm-up and every region (one watch for the run)."""
    held: list = []

    def session():
        if not held:
            held.append(make())
        return held[0]

    return session


def build_train_llama(ir, wanted):
    import torch

    import nan_hunter

    model = _llama().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, 4096, (4, 64), generator=torch.Generator().manual_seed(0))

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    vs = [
        ir.Variant("plain", step, describe="forward with labels, backward, AdamW step, zero_grad"),
        ir.Variant(
            "sentinel",
            step,
            _held(lambda: nan_hunter.watch(model, backward=True, optimizer=opt)),
            "one nan_hunter.watch(model, backward=True, optimizer=opt) (default level) for the run",
        ),
        ir.Variant(
            "skip",
            step,
            _held(lambda: nan_hunter.watch(model, backward=True, optimizer=opt, on_fault="skip")),
            "the same with on_fault='skip'",
        ),
        ir.Variant(
            "sampled",
            step,
            _held(lambda: nan_hunter.watch(model, backward=True, optimizer=opt, sample_every=1)),
            "the same with sample_every=1: every step a sampled step (the cost of one)",
        ),
    ]
    info = {
        "model": "LlamaForCausalLM(hidden 256, 4 layers, 8 heads, intermediate 688, vocab 4096), train",
        "params": sum(p.numel() for p in model.parameters()),
        "batch": list(ids.shape),
        "iteration": "one step: forward(labels), backward, AdamW(lr=1e-4), zero_grad",
    }
    return {"4x64": [v for v in vs if v.name in wanted]}, info, None


def build_trainer(ir, wanted):
    import torch
    from transformers import Trainer, TrainingArguments

    from nan_hunter.integrations.transformers import NanHunterCallback

    model = _llama().train()
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": (x := torch.randint(3, 4096, (64,), generator=g)), "labels": x} for _ in range(64)]
    out_dir = os.environ.get("SENTINEL_INSTR_TMP", "/tmp/sentinel_instr_trainer")

    def make(S, callbacks):
        args = TrainingArguments(
            output_dir=out_dir,
            max_steps=S,
            per_device_train_batch_size=4,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            eval_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
            dataloader_num_workers=0,
            seed=0,
        )
        tr = Trainer(model=model, args=args, train_dataset=rows, callbacks=callbacks)
        return lambda: torch.tensor(tr.train().training_loss)

    cases = {}
    for S in (2, 4):
        vs = [
            ir.Variant("plain", make(S, []), describe=f"Trainer(max_steps={S}).train()"),
            ir.Variant(
                "callback",
                make(S, [NanHunterCallback()]),
                describe=f"Trainer(max_steps={S}, callbacks=[NanHunterCallback()]).train()",
            ),
            ir.Variant(
                "callback_skip",
                make(S, [NanHunterCallback(on_fault="skip")]),
                describe="the same with NanHunterCallback(on_fault='skip')",
            ),
        ]
        cases[f"S{S}"] = [v for v in vs if v.name in wanted]
    info = {
        "model": "LlamaForCausalLM(hidden 256, 4 layers, vocab 4096), transformers.Trainer, batch 4 x 64",
        "params": sum(p.numel() for p in model.parameters()),
        "iteration": "one trainer.train() of S steps (AdamW, linear schedule)",
    }
    return cases, info, None


def build_llama110m(ir, wanted):
    import torch

    model = _llama(hidden=768, layers=12, heads=12, inter=2048, vocab=32000, tied=True).eval()
    ids = torch.randint(3, 32000, (1, 5), generator=torch.Generator().manual_seed(0))
    cases = _generate_cases(ir, wanted, model, ids, (2, 4))
    info = {
        "model": "LlamaForCausalLM(hidden 768, 12 layers, 12 heads, intermediate 2048, vocab 32000, tied)",
        "params": sum(p.numel() for p in model.parameters()),
        "prompt": list(ids.shape),
        "iteration": "one greedy generate() of T new tokens",
    }
    return cases, info, (lambda out: out)


def _generate_cases(ir, wanted, model, ids, lengths):
    """Per T in ``lengths``: greedy ``generate()`` of exactly T new tokens, ``plain`` and ``sentinel``
    (a fresh ``nan_hunter.watch(model)`` per generate), the variants in ``wanted``."""
    import torch

    import nan_hunter

    cases = {}
    for T in lengths:

        def gen(T=T):
            with torch.no_grad():
                return model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=T,
                    min_new_tokens=T,
                    do_sample=False,
                    num_beams=1,
                    pad_token_id=0,
                )

        def watched(gen=gen):
            with nan_hunter.watch(model):
                return gen()

        def sampled(gen=gen):
            with nan_hunter.watch(model, sample_every=1):
                return gen()

        vs = [
            ir.Variant("plain", gen, describe="model.generate(...)"),
            ir.Variant("sentinel", watched, describe="a fresh nan_hunter.watch(model) per generate"),
            ir.Variant(
                "sampled",
                sampled,
                describe="a fresh nan_hunter.watch(model, sample_every=1) per generate: every step sampled",
            ),
        ]
        cases[f"T{T}"] = [v for v in vs if v.name in wanted]
    return cases


def build_tiny_decode(ir, wanted, lengths=(16, 32)):
    """The harness's ``decode`` workload (tiny Llama: hidden 64, 2 layers, vocab 256, tied; greedy
    ``generate()`` of T = 16 and T = 32 new tokens from a 5-token prompt) at the default level:
    ``plain`` and ``sentinel`` = a fresh ``nan_hunter.watch(model)`` per generate. (X(T32) -
    X(T16)) / 16 is one decode forward: the fixed cost per forward of issue 45."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 256, (1, 5), generator=torch.Generator().manual_seed(0))
    cases = _generate_cases(ir, wanted, model, ids, lengths)
    info = {
        "model": "LlamaForCausalLM(hidden 64, 2 layers, 4 heads, intermediate 128, vocab 256, tied), seed 0",
        "params": sum(p.numel() for p in model.parameters()),
        "prompt": list(ids.shape),
        "iteration": "one greedy generate() of T new tokens (T forwards: 1 prefill + T-1 decode)",
    }
    return cases, info, (lambda out: out)


def build_tiny_decode_long(ir, wanted):
    """``tiny_decode`` over T = 32 and T = 96 new tokens: (X(T96) - X(T32)) / 64 is one decode
    forward averaged over 64 (a one-off allocator event of the heap moves it 4x less than over 16),
    the sentinel's folds (one every 32 forwards) included; ``sampled`` is a sampled step's cost."""
    cases, info, head = build_tiny_decode(ir, wanted, lengths=(32, 96))
    info["iteration"] += "; T = 32 and 96"
    return cases, info, head


def build_cb_decode(ir, wanted):
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    import nan_hunter

    model = _llama().eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 4096, (16,), generator=g).tolist() for _ in range(8)]
    cbc = ContinuousBatchingConfig(
        page_size=32,
        num_blocks=64,
        max_batch_tokens=256,
        max_requests_per_batch=8,
        use_cuda_graph=False,
        use_async_batching=False,
    )
    # the manager decodes in its own thread, which polls: its instruction count varies from run to
    # run, so the packed forwards it ran are kept (their keywords copied: the manager reuses static
    # buffers) and replayed in this thread
    kept: list = []

    def copied(v):
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, list):
            return [copied(x) for x in v]
        if isinstance(v, dict):
            return {k: copied(x) for k, x in v.items()}
        return v

    def keep(module, args, kwargs):
        kept.append({k: (v if k == "cache" else copied(v)) for k, v in kwargs.items()})

    h = model.register_forward_pre_hook(keep, with_kwargs=True)
    with torch.no_grad():
        model.generate_batch(
            prompts,
            generation_config=GenerationConfig(
                max_new_tokens=8, do_sample=False, eos_token_id=-1, pad_token_id=0
            ),
            continuous_batching_config=cbc,
            progress_bar=False,
        )
    h.remove()
    cases = {}
    for n in (4, 8):

        def replay(fs=kept[:n]):
            with torch.no_grad():
                return torch.stack([model(**kw).logits.reshape(-1)[:64] for kw in fs])

        def watched(replay=replay):
            with nan_hunter.watch(model):
                return replay()

        vs = [
            ir.Variant(
                "plain", replay, describe=f"the first {n} packed forwards of generate_batch, replayed"
            ),
            ir.Variant("sentinel", watched, describe="the same inside a fresh nan_hunter.watch(model)"),
        ]
        cases[f"F{n}"] = [v for v in vs if v.name in wanted]
    info = {
        "model": "LlamaForCausalLM(hidden 256, 4 layers, vocab 4096, sdpa); the packed forwards of one "
        "generate_batch (8 x 16 prompts, 8 new tokens: a prefill, then decode forwards of 8 rows)",
        "params": sum(p.numel() for p in model.parameters()),
        "forwards_kept": len(kept),
        "iteration": "F packed forwards replayed in order (the paged cache as the manager left it)",
    }
    return cases, info, (lambda out: out)


def build_minilm_train_sentinel(ir, wanted):
    """The harness's ``minilm_train`` (all-MiniLM-L6-v2, 8 x 128, AdamW) at the sentinel level."""
    import torch

    import nan_hunter

    model, batch = ir._minilm()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = model(**batch).last_hidden_state.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    vs = [
        ir.Variant("plain", step, describe="forward, loss, backward, AdamW step, zero_grad"),
        ir.Variant(
            "sentinel",
            step,
            _held(lambda: nan_hunter.watch(model, backward=True, optimizer=opt)),
            "one nan_hunter.watch(model, backward=True, optimizer=opt) (default level) for the run",
        ),
    ]
    info = {
        "model": "all-MiniLM-L6-v2, train (dropout 0.1)",
        "batch": [8, 128],
        "params": sum(p.numel() for p in model.parameters()),
        "iteration": "one step: forward, last_hidden_state.pow(2).mean(), backward, AdamW(lr=1e-4), zero_grad",
    }
    return {"8x128": [v for v in vs if v.name in wanted]}, info, None


BUILDERS = {
    "minilm_train_sentinel": (build_minilm_train_sentinel, 1, 1, False),
    "train_llama": (build_train_llama, 1, 1, False),
    "trainer": (build_trainer, 1, 1, False),
    "llama110m": (build_llama110m, 1, 1, False),
    "cb_decode": (build_cb_decode, 1, 1, False),
    "tiny_decode": (build_tiny_decode, 1, 1, False),
    "tiny_decode_long": (build_tiny_decode_long, 1, 1, False),
}


def load_tool():
    path = os.environ.get("NANHUNTER_INSTR_RATIO", "/work/shared/tools/instr_ratio.py")
    if "--tool" in sys.argv:
        i = sys.argv.index("--tool")
        path = sys.argv[i + 1]
        del sys.argv[i : i + 2]
        os.environ["NANHUNTER_INSTR_RATIO"] = path  # the children load the same harness
    if not Path(path).is_file():
        raise SystemExit(f"sentinel_instr: no harness at {path} (--tool PATH)")
    spec = importlib.util.spec_from_file_location("instr_ratio", path)
    ir = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ir)
    return ir


def main() -> int:
    ir = load_tool()
    for name, (builder, k, warm, pair) in BUILDERS.items():
        ir.WORKLOADS[name] = (lambda wanted, b=builder: b(ir, wanted), k, warm, pair)
    ir.__file__ = str(HERE)  # the harness starts its children from its own __file__: this script
    return ir.main()


if __name__ == "__main__":
    sys.exit(main())
