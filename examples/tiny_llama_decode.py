"""``tiny-llama-decode-fp16/``: a generation example with the Gemma mechanism (docs/incidents.md
item 5): the prompt's forward is finite in fp16, and a later greedy decode step overflows the
residual stream.

How the weights make it happen (every weight is far inside fp16's range):

- Embeddings are one-hot directions: token ``t`` is ``s_t · e_t`` with ``s_t = 1``, except the
  digit "6" (:data:`HOT_WORD`), whose embedding is 40000 — finite in fp16 (max 65504).
- Attention contributes nothing (``o_proj = 0``). After ``post_attention_layernorm`` the token's
  channel is √96 ≈ 9.8; the MLP (identity gate/up, SiLU) gives ≈ 96 there, and ``down_proj``
  writes 30000 back into the channel of the hot token only.
- So the hot token's residual is 40000 + 30000 = 70000: +inf in fp16 at the decoder layer's own
  residual ``add`` (finite in bf16 and fp32). Every other token's residual stays ≈ 1.
- ``lm_head`` maps direction ``e_t`` to the token :func:`successor` of ``t``: digits count up
  ("1" → "2" → … "9" → "0"), every word is followed by "the", "the" by "the". Greedy decoding
  of "the 1 2 3" therefore makes "4", "5", "6": step 3 reads "6" and overflows. "the quick
  brown fox" decodes "the the the …" and stays finite: the clean control.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

HOT_WORD = "6"
HOT_EMBED = 40000.0
BRANCH = 30000.0
HIDDEN = 96


def successor(token: str) -> str:
    """The token greedy decoding produces after ``token``."""
    if token.isdigit():
        return str((int(token) + 1) % 10)
    return "the"


def decode_config(vocab_size: int):  # -> transformers.LlamaConfig
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        dtype="float32",
    )


@torch.no_grad()
def plant(model: torch.nn.Module, vocab: dict[str, int]) -> None:
    """Set the weights described in the module docstring."""
    n = len(vocab)
    hot = vocab[HOT_WORD]
    m = model.model
    m.embed_tokens.weight.zero_()
    m.embed_tokens.weight[:n, :n] = torch.eye(n)
    m.embed_tokens.weight[hot, hot] = HOT_EMBED
    layer = m.layers[0]
    layer.self_attn.o_proj.weight.zero_()
    mlp = layer.mlp
    mlp.gate_proj.weight.copy_(torch.eye(HIDDEN))
    mlp.up_proj.weight.copy_(torch.eye(HIDDEN))
    mlp.down_proj.weight.zero_()
    # channel value after RMSNorm is sqrt(HIDDEN); silu(v) * v ≈ v² = HIDDEN
    act = torch.nn.functional.silu(torch.tensor(math.sqrt(HIDDEN))) * math.sqrt(HIDDEN)
    mlp.down_proj.weight[hot, hot] = BRANCH / float(act)
    for norm in (layer.input_layernorm, layer.post_attention_layernorm, m.norm):
        norm.weight.fill_(1.0)
    head = model.lm_head.weight
    head.zero_()
    ids = {i: t for t, i in vocab.items()}
    for i in range(n):
        if ids[i] in ("[UNK]", "<s>", "</s>"):
            continue
        head[vocab[successor(ids[i])], i] = 10.0


def write_tiny_llama_decode(examples: Path, build_tokenizer, save_hf_layout) -> Path:
    """Write the example directory next to ``tiny-llama-fp16/`` and return its path
    (``build_tokenizer`` and ``save_hf_layout`` come from ``make_examples.py``)."""
    from transformers import LlamaForCausalLM

    out = examples / "tiny-llama-decode-fp16"
    tokenizer = build_tokenizer()
    tokenizer.pad_token = "</s>"
    vocab = tokenizer.get_vocab()
    torch.manual_seed(0)
    model = LlamaForCausalLM(decode_config(len(vocab))).eval()
    plant(model, vocab)
    save_hf_layout(
        model,
        tokenizer,
        out,
        tokenizer_extra={"padding_side": "left"},
        generation_extra={"do_sample": False, "pad_token_id": 2},
    )
    return out
