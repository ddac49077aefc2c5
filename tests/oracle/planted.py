"""Tiny real transformers models (Llama, Qwen2, GPT-2, T5: hidden 64, 2 layers, the 79-word
vocabulary of ``examples/tiny-llama-decode-fp16``) and the faults the oracle matrix plants in them.
Built from configs with fixed seeds, dropout off, eager attention: two builds are bitwise equal.

Faults (each planted in place, the way a bad update or a bad checkpoint would leave the weights):

- ``qk_overflow``: the trigger word's embedding is ``A·(e_j − e_j')`` and every other token has 0
  in channels j, j' (GPT-2's position table too), so after the first norm only the trigger's row
  has ±√32 there; layer 0's query projection gets ``+c`` / ``−c`` on those input channels, with
  ``c = finfo(compute dtype).max / 4`` (finite). The trigger's query row is ≈ 11.3·c: +inf/−inf
  at that projection's matmul, in the compute dtype only; every other row is untouched.
- ``qk_overflow_neg``: the same with the signs swapped: only −inf, which reaches the projection's
  output (the contract names a −inf op when nothing later in that call made NaN/+inf).
- ``autocast_cast``: the same channels get 1e6, finite in the fp32 weights; under fp16 autocast
  the weight's cast to fp16 is the first op to make ±inf.
- ``nan_norm``: a NaN in one element of layer 1's second norm weight (role ``weights``).
- ``bwd_div0``: layer 1's MLP activation is :class:`SqrtGate` (``x · sqrt(mean(x²))``) and its
  input projection is zeroed: the forward is 0, the backward divides 0 by ``2·sqrt(0)``.
- ``adam_eps``: Adam's eps set to a value that rounds to 0 in the parameters' dtype: the
  embedding rows no batch used have ``exp_avg = exp_avg_sq = 0``, so the update is 0/0.
"""

from __future__ import annotations

import functools
import inspect
import json
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

FAMILIES = ("llama", "qwen2", "gpt2", "t5")
ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "examples" / "tiny-llama-decode-fp16"
VOCAB = 79
PAD, BOS, EOS = 2, 1, 2
TRIGGER = 55  # "overflow"
J, J2 = 5, 6  # the two embedding channels the trigger lives in
A = 4.0
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class SqrtGate(nn.Module):
    """x · sqrt(mean(x²)): finite forward at x = 0, but d/dx sqrt at 0 is infinite (0/0 = NaN)."""

    def forward(self, x):
        return x * torch.sqrt((x * x).mean(-1, keepdim=True))


def build(family: str, seed: int = 0) -> nn.Module:
    """A fresh tiny model of ``family`` in fp32, training mode, no dropout, eager attention."""
    cfg, model_cls = config(family)
    torch.manual_seed(seed)
    model = model_cls(cfg)
    model.config._attn_implementation = "eager"
    return model.train()


def config(family: str):
    """(the tiny config of ``family``, its model class)."""
    import transformers as tf

    common = dict(
        vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False
    )
    if family in ("llama", "qwen2"):
        cfg_cls, model_cls = (
            (tf.LlamaConfig, tf.LlamaForCausalLM)
            if family == "llama"
            else (tf.Qwen2Config, tf.Qwen2ForCausalLM)
        )
        cfg = cfg_cls(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2 if family == "qwen2" else 4,
            max_position_embeddings=64,
            attention_dropout=0.0,
            **common,
        )
    elif family == "gpt2":
        cfg_cls, model_cls = tf.GPT2Config, tf.GPT2LMHeadModel
        cfg = cfg_cls(
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    elif family == "t5":
        cfg_cls, model_cls = tf.T5Config, tf.T5ForConditionalGeneration
        cfg = cfg_cls(
            d_model=64,
            d_kv=16,
            d_ff=96,
            num_layers=2,
            num_heads=4,
            dropout_rate=0.0,
            decoder_start_token_id=PAD,
            **common,
        )
    else:
        raise ValueError(family)
    cfg._attn_implementation = "eager"
    return cfg, model_cls


# --- where things are -------------------------------------------------------------------------


def embeddings(model: nn.Module) -> list[torch.Tensor]:
    """The token embedding table, and GPT-2's position table."""
    out = [model.get_input_embeddings().weight]
    if hasattr(model, "transformer"):
        out.append(model.transformer.wpe.weight)
    return out


def query_name(model: nn.Module) -> str:
    """Dotted name of layer 0's query projection."""
    if hasattr(model, "transformer"):
        return "transformer.h.0.attn.c_attn"
    if hasattr(model, "encoder"):
        return "encoder.block.0.layer.0.SelfAttention.q"
    return "model.layers.0.self_attn.q_proj"


def norm_name(model: nn.Module) -> str:
    """Dotted name of layer 1's second norm."""
    if hasattr(model, "transformer"):
        return "transformer.h.1.ln_2"
    if hasattr(model, "encoder"):
        return "encoder.block.1.layer.1.layer_norm"
    return "model.layers.1.post_attention_layernorm"


def mlp_names(model: nn.Module) -> tuple[str, str]:
    """(layer 1's MLP input projection, the attribute path of its activation)."""
    if hasattr(model, "transformer"):
        return "transformer.h.1.mlp.c_fc", "transformer.h.1.mlp.act"
    if hasattr(model, "encoder"):
        return "encoder.block.1.layer.1.DenseReluDense.wi", "encoder.block.1.layer.1.DenseReluDense.act"
    return "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.act_fn"


def first_param_name(model: nn.Module) -> str:
    return next(n for n, _ in model.named_parameters())


# --- plants -------------------------------------------------------------------------------------


@torch.no_grad()
def plant_qk_overflow(
    model: nn.Module, compute: torch.dtype, sign: float = 1.0, value: float | None = None
) -> float:
    """The ``qk_overflow`` plant (module docstring); ``sign=-1``: the query row is −11.3·c, so
    only −inf (``qk_overflow_neg``); ``value``: ``c`` itself (``autocast_cast``: 1e6, which fits
    the fp32 weights but not the fp16 copy autocast makes of them). Returns ``c``."""
    emb = embeddings(model)
    tok = emb[0]
    tok[:, J] = 0
    tok[:, J2] = 0
    tok[TRIGGER] = 0
    tok[TRIGGER, J] = A
    tok[TRIGGER, J2] = -A
    for pos in emb[1:]:
        pos[:, J] = 0
        pos[:, J2] = 0
    c = torch.finfo(compute).max / 4 if value is None else value
    q = model.get_submodule(query_name(model)).weight
    if hasattr(model, "transformer"):  # Conv1D: weight [in, 3·hidden], the query is the first third
        h = q.shape[0]
        q[J, :h] = sign * c
        q[J2, :h] = -sign * c
    else:
        q[:, J] = sign * c
        q[:, J2] = -sign * c
    return c


@torch.no_grad()
def plant_nan_norm(model: nn.Module) -> str:
    w = model.get_submodule(norm_name(model)).weight
    w[3] = float("nan")
    return norm_name(model) + ".weight"


def install_sqrt_gate(model: nn.Module) -> None:
    """Layer 1's activation becomes a SqrtGate (harmless until its input is zero)."""
    _, act = mlp_names(model)
    parent, _, attr = act.rpartition(".")
    setattr(model.get_submodule(parent), attr, SqrtGate())


@torch.no_grad()
def plant_bwd_div0(model: nn.Module) -> None:
    """Zero the SqrtGate's input projection: forward 0, backward 0/0."""
    lin = model.get_submodule(mlp_names(model)[0])
    lin.weight.zero_()
    if getattr(lin, "bias", None) is not None:
        lin.bias.zero_()


def eps_rounding_to_zero(dtype: torch.dtype) -> float:
    """An Adam eps that is 0 once cast to ``dtype`` (fp16: 1e-8, the real incident; fp32/bf16: 1e-50)."""
    return 1e-8 if dtype == torch.float16 else 1e-50


def plant_adam_eps(opt: torch.optim.Optimizer, dtype: torch.dtype) -> None:
    for g in opt.param_groups:
        g["eps"] = eps_rounding_to_zero(dtype)


@torch.no_grad()
def plant_lead_to_trigger(model: nn.Module, lead: list[int], other: list[int]) -> None:
    """Greedy decoding of ``lead`` makes the trigger word next, of ``other`` (and of [UNK]) not:
    the LM head is zero except the trigger's row, ``h(lead) − h(other)`` (final hidden states of
    the prompts' last tokens), so the trigger's logit is positive after ``lead`` only and every
    other logit is 0 (argmax: [UNK], id 0)."""
    base = model.base_model
    was = model.training
    model.eval()
    h_lead = base(input_ids=torch.tensor([lead])).last_hidden_state[0, -1].float()
    h_other = base(input_ids=torch.tensor([other])).last_hidden_state[0, -1].float()
    model.train(was)
    head = model.get_output_embeddings().weight
    head.zero_()
    head[TRIGGER] = (h_lead - h_other).to(head.dtype)


# --- data ---------------------------------------------------------------------------------------


def batches(
    family: str,
    steps: int,
    fault_step: int,
    trigger: bool,
    batch: int = 2,
    length: int = 11,
    target_len: int = 7,
    at: tuple[int, int] = (1, 4),
    seed: int = 1,
) -> list[dict[str, torch.Tensor]]:
    """``steps`` training batches of random words (never the trigger); with ``trigger``, batch
    ``fault_step`` holds the trigger at row/token ``at``. Labels: the inputs (causal LMs), or a
    ``target_len`` target (T5). Lengths avoid every model dim, so the oracle can tell token dims."""
    g = torch.Generator().manual_seed(seed)
    words = torch.tensor([i for i in range(13, VOCAB) if i != TRIGGER])
    out = []
    for s in range(steps):
        ids = words[torch.randint(len(words), (batch, length), generator=g)]
        ids[:, 0] = BOS
        if trigger and s == fault_step:
            ids[at] = TRIGGER
        b = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if family == "t5":
            b["labels"] = words[torch.randint(len(words), (batch, target_len), generator=g)]
        else:
            b["labels"] = ids.clone()
        out.append(b)
    return out


@functools.cache
def tokenizer(family: str):
    """The tokenizer ``scan`` loads from this family's checkpoint directory: the example's files
    beside the family's ``config.json`` (transformers picks the tokenizer class from the model
    type: Qwen2's pre-tokenizes differently, so the same text can give other ids)."""
    from transformers import AutoTokenizer

    d = Path(tempfile.mkdtemp(prefix=f"oracle-tok-{family}-"))
    config(family)[0].save_pretrained(d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / f, d / f)
    tok = AutoTokenizer.from_pretrained(str(d))
    shutil.rmtree(d, ignore_errors=True)
    return tok


def tokenize(texts: list[str], batch: bool, family: str) -> list[dict[str, torch.Tensor]]:
    """The prompts as the CLI tokenizes them: one input each, or one left-padded batch."""
    tok = tokenizer(family)
    # only what the model's forward takes (transformers 4.x tokenizers add token_type_ids, which
    # Llama's generate() refuses)
    takes = inspect.signature(config(family)[1].forward).parameters
    if batch:
        tok.padding_side = "left"
        encs = [tok(texts, return_tensors="pt", padding=True)]
    else:
        encs = [tok(t, return_tensors="pt") for t in texts]
    return [{k: v for k, v in e.items() if k in takes} for e in encs]


def token_ids(text: str, family: str) -> list[int]:
    return tokenize([text], False, family)[0]["input_ids"][0].tolist()


def save_hf_dir(model: nn.Module, out: Path) -> Path:
    """``model`` as a Hugging Face directory with the example's tokenizer (what ``scan`` loads)."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / f, out / f)
    gen = out / "generation_config.json"
    cfg = json.loads(gen.read_text()) if gen.exists() else {}
    cfg.update(do_sample=False, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    gen.write_text(json.dumps(cfg))
    return out
