"""A tiny fp16 Llama for continuous batching (transformers' ``generate_batch``), built in memory.

- Token ids ``3..12`` count up (``t → t+1``, ``12 → 3``); every other token is followed by
  :data:`WORD` (``13``), and ``13`` by itself: greedy decoding is known in advance.
- :data:`HOT` (``6``) has a one-hot embedding of 40000 (finite in fp16); layer 0's MLP writes
  30000 more into its channel, so layer 0's residual ``add`` is +inf for that token only —
  a prompt holding ``6``, or counting up to it, overflows; every other token stays ≈ 1.
- Layer 1 has real attention (small random q/k/v/o): the +inf residual becomes NaN keys and
  values there (RMSNorm of +inf), and packed attention spreads them to every request whose
  query shares the forward (masked score = NaN + −inf = NaN): the poisoning this test model
  exists for.
- ``shared_fault=True`` makes ``lm_head`` hold +inf in a row every request reads: a fault in a
  weight shared by all requests.
"""

from __future__ import annotations

import math

import torch

VOCAB = 32
HIDDEN = 32
HOT = 6
WORD = 13
HOT_EMBED = 40000.0
BRANCH = 30000.0


def successor(t: int) -> int:
    """The token greedy decoding produces after ``t``."""
    if 3 <= t <= 12:
        return 3 if t == 12 else t + 1
    return WORD


def serving_llama(attn: str = "sdpa", shared_fault: bool = False):  # -> LlamaForCausalLM
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        m = model.model
        m.embed_tokens.weight.copy_(torch.eye(VOCAB, HIDDEN))
        m.embed_tokens.weight[HOT, HOT] = HOT_EMBED
        l0, l1 = m.layers
        l0.self_attn.o_proj.weight.zero_()
        l0.mlp.gate_proj.weight.copy_(torch.eye(HIDDEN))
        l0.mlp.up_proj.weight.copy_(torch.eye(HIDDEN))
        l0.mlp.down_proj.weight.zero_()
        # after RMSNorm a one-hot channel is √HIDDEN; silu(v)·v is the MLP's value there
        act = torch.nn.functional.silu(torch.tensor(math.sqrt(HIDDEN))) * math.sqrt(HIDDEN)
        l0.mlp.down_proj.weight[HOT, HOT] = BRANCH / float(act)
        for lin in (l1.self_attn.q_proj, l1.self_attn.k_proj, l1.self_attn.v_proj):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.3)
        l1.self_attn.o_proj.weight.copy_(torch.randn(HIDDEN, HIDDEN, generator=g) * 0.002)
        l1.mlp.down_proj.weight.zero_()
        for norm in (
            l0.input_layernorm,
            l0.post_attention_layernorm,
            l1.input_layernorm,
            l1.post_attention_layernorm,
            m.norm,
        ):
            norm.weight.fill_(1.0)
        head = model.lm_head.weight
        head.zero_()
        for t in range(3, VOCAB):
            head[successor(t), t] = 10.0
        if shared_fault:
            head[WORD, :] = float("inf")  # every request's logits read this row
    return model.half().eval()


def cb_config(
    **kw,
):  # -> ContinuousBatchingConfig, sized for this CPU (the default sizes the cache from memory)
    from transformers import ContinuousBatchingConfig

    opts = dict(
        page_size=16,
        num_blocks=32,
        max_batch_tokens=128,
        max_requests_per_batch=16,
        use_cuda_graph=False,
        use_async_batching=False,
    )
    opts.update(kw)
    return ContinuousBatchingConfig(**opts)


def greedy(max_new_tokens: int = 6):  # -> GenerationConfig
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=2, pad_token_id=0)
