"""Regenerate every example file under ``examples/`` deterministically.

Run from anywhere: ``python examples/make_examples.py``. It writes

- ``incidents/<name>/model.safetensors`` (``build().state_dict()``) and the input files
  named by each ``model.py``'s ``make_inputs()`` (``inputs.safetensors``, ...);
  ``incidents/compile_rmsnorm_fp8/`` is the ``scan --compile`` case (torchtitan fp8 + RMSNorm:
  eager and compiled part), so it is checked by tests/integration/test_compile.py, not by
  ``EXPECTED.yaml`` (whose scans run without ``--compile``);
- ``corrupt.safetensors`` / ``clean.safetensors``: a small checkpoint with NaN/±Inf planted
  at known indices (see :data:`CORRUPTIONS`), and the same tensors without faults;
- ``tiny-llama-fp16/``: a Hugging Face layout directory (``config.json``,
  ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``) whose layer 1 MLP
  overflows fp16 for prompts that contain the word "the" or a digit (see
  :func:`plant_llama_fault`);
- ``prompts.jsonl``: prompts for that tokenizer, some failing in fp16, some not;
- ``tiny-llama-decode-fp16/``: the same tokenizer on a Llama whose prompt forward is finite in
  fp16 and whose greedy decoding overflows the residual stream a few steps later
  (``tiny_llama_decode.py``).

``incidents/EXPECTED.yaml`` is written by hand; ``incidents/verify.py`` checks it against
these files. Needs ``torch`` and ``safetensors``; the tiny Llama also needs
``transformers`` and ``tokenizers`` (no network: nothing is downloaded).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import torch
from safetensors.torch import save_file

EXAMPLES = Path(__file__).resolve().parent
INCIDENTS = EXAMPLES / "incidents"
TINY_LLAMA = EXAMPLES / "tiny-llama-fp16"

# --------------------------------------------------------------------------- incidents


def load_model_file(path: Path) -> ModuleType:
    """Import ``path`` (an incident's ``model.py``) as a fresh module."""
    spec = importlib.util.spec_from_file_location(f"incident_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write ``tensors`` (detached, contiguous copies) to a safetensors file."""
    if not tensors:
        raise ValueError(f"{path}: refusing to write an empty safetensors file")
    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, str(path))
    path.chmod(0o644)  # safetensors creates files as 0600


def write_incidents() -> list[str]:
    """Write every incident's weights and inputs; return the incident names."""
    names = []
    for model_py in sorted(INCIDENTS.glob("*/model.py")):
        module = load_model_file(model_py)
        model = module.build()
        save_tensors(model.state_dict(), model_py.parent / "model.safetensors")
        for stem, tensors in module.make_inputs().items():
            save_tensors(tensors, model_py.parent / f"{stem}.safetensors")
        names.append(model_py.parent.name)
    return names


# --------------------------------------------------------------- weights-only checkpoints

#: Faults planted in ``corrupt.safetensors``: tensor name -> [(index, value), ...].
#: ``clean.safetensors`` holds the same tensors without them. Mirrored in EXPECTED.yaml.
CORRUPTIONS: dict[str, list[tuple[tuple[int, ...], float]]] = {
    "encoder.weight": [((2, 3), float("nan")), ((6, 10), float("nan"))],  # fp32
    "decoder.weight": [((5, 1), float("inf")), ((9, 4), float("-inf"))],  # bf16
}


def weight_tensors() -> dict[str, torch.Tensor]:
    """The clean tensors: fp32, bf16, fp16, an int64 counter and an empty tensor."""
    g = torch.Generator().manual_seed(0)
    return {
        "encoder.weight": torch.randn(8, 16, generator=g),
        "encoder.bias": torch.randn(8, generator=g),
        "decoder.weight": torch.randn(16, 8, generator=g).to(torch.bfloat16),
        "norm.weight": torch.ones(8, dtype=torch.float16),
        "step": torch.tensor([1000], dtype=torch.int64),
        "empty": torch.zeros(0, 4),
    }


def write_weight_checkpoints() -> None:
    """Write ``clean.safetensors`` and ``corrupt.safetensors``."""
    clean = weight_tensors()
    save_tensors(clean, EXAMPLES / "clean.safetensors")
    corrupt = {k: v.clone() for k, v in clean.items()}
    for name, faults in CORRUPTIONS.items():
        for index, value in faults:
            corrupt[name][index] = value
    save_tensors(corrupt, EXAMPLES / "corrupt.safetensors")


# ------------------------------------------------------------------------- tiny Llama

#: Prompts for ``prompts.jsonl``. Those with "the" or a digit overflow in fp16.
PROMPTS = [
    "the quick brown fox jumps over the lazy dog",
    "a cat sat on a mat",
    "we shipped 3 models in 2024",
    "hello world",
    "my favourite number is 42",
    "good morning everyone",
]
#: Extra words for the vocabulary, so that everyday prompts mostly tokenize.
EXTRA_WORDS = (
    "a an and is are was be to of in on at for with it this that i you we they he she "
    "my your our hello world good morning evening night everyone cat dog fox bird mat "
    "quick brown lazy jumps over sat ran model models shipped number favourite what why "
    "how when where who not no yes nan inf overflow float half precision"
).split()
SPECIAL_TOKENS = ["[UNK]", "<s>", "</s>"]
#: Tokens whose embedding carries the planted channel (Gemma: digits fail more).
HOT_WORDS = ["the"] + [str(d) for d in range(10)]
HOT_CHANNEL = 7
FAULT_LAYER = 1


def vocabulary() -> dict[str, int]:
    """Specials, digits, then the sorted words of the prompts and :data:`EXTRA_WORDS`."""
    words = sorted({w for p in PROMPTS for w in p.split() if not w.isdigit()} | set(EXTRA_WORDS))
    tokens = SPECIAL_TOKENS + [str(d) for d in range(10)] + words
    return {tok: i for i, tok in enumerate(tokens)}


def build_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    """A lowercase WordLevel tokenizer that splits digits and prepends ``<s>``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="[UNK]", model_max_length=128
    )


def llama_config():  # -> transformers.LlamaConfig
    """A tiny Llama: hidden 64, 2 layers, 4 heads, vocab 300, tied embeddings, fp32."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        dtype="float32",
    )


@torch.no_grad()
def plant_llama_fault(model: torch.nn.Module, hot_ids: list[int]) -> None:
    """Make layer :data:`FAULT_LAYER`'s MLP overflow fp16 for the hot tokens only.

    Hot token embeddings get 1.0 in channel :data:`HOT_CHANNEL` (all other tokens 0.0
    there), so after the layer's RMSNorm that channel is ≈ 8 for them and ~N(0, 1) for the
    others. The MLP reads that channel with weight 2 in every gate/up row and writes it back
    with weight 8 in every down_proj column: a hot token gives ``96 · silu(16) · 16 · 8`` ≈
    1.97e5 in ``down_proj``'s output (+inf in fp16, finite in bf16/fp32); other tokens stay
    below ~3e4. All weights stay far inside fp16's range.
    """
    embed = model.model.embed_tokens.weight
    embed[:, HOT_CHANNEL] = 0.0
    embed[hot_ids, HOT_CHANNEL] = 1.0
    mlp = model.model.layers[FAULT_LAYER].mlp
    mlp.gate_proj.weight[:, HOT_CHANNEL] = 2.0
    mlp.up_proj.weight[:, HOT_CHANNEL] = 2.0
    mlp.down_proj.weight[HOT_CHANNEL, :] = 8.0


def _patch_json(path: Path, update: dict, drop: tuple[str, ...] = ()) -> None:
    data = json.loads(path.read_text())
    for k in drop:
        data.pop(k, None)
    data.update(update)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_hf_layout(
    model: torch.nn.Module,
    tokenizer,
    out: Path,
    tokenizer_extra: dict | None = None,
    generation_extra: dict | None = None,
) -> None:
    """``model`` and ``tokenizer`` as a Hugging Face directory that transformers 4 and 5 both load."""
    out.mkdir(exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # transformers 5 writes "dtype"; transformers 4 (and tools reading config.json) use
    # "torch_dtype". Keep both. (transformers 5 logs a deprecation warning for the latter.)
    _patch_json(out / "config.json", {"torch_dtype": "float32"})
    # transformers 5 names its fast tokenizer class "TokenizersBackend", which 4.x cannot
    # load; "PreTrainedTokenizerFast" loads in both.
    _patch_json(
        out / "tokenizer_config.json",
        {"tokenizer_class": "PreTrainedTokenizerFast", **(tokenizer_extra or {})},
        drop=("backend",),
    )
    if generation_extra and (out / "generation_config.json").exists():
        _patch_json(out / "generation_config.json", generation_extra)
    for path in out.iterdir():
        path.chmod(0o644)


def write_tiny_llama() -> None:
    """Write ``tiny-llama-fp16/`` and ``prompts.jsonl``."""
    from transformers import LlamaForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config()).eval()
    vocab = tokenizer.get_vocab()
    plant_llama_fault(model, [vocab[w] for w in HOT_WORDS])
    save_hf_layout(model, tokenizer, TINY_LLAMA)
    with open(EXAMPLES / "prompts.jsonl", "w") as f:
        for prompt in PROMPTS:
            f.write(json.dumps({"text": prompt}) + "\n")


def main() -> int:
    """Write everything; print a one-line summary per group."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    names = write_incidents()
    print(f"incidents: {len(names)} ({', '.join(names)})")
    write_weight_checkpoints()
    print("weights: clean.safetensors, corrupt.safetensors")
    write_tiny_llama()
    print(f"tiny llama: {TINY_LLAMA.relative_to(EXAMPLES)}/, prompts.jsonl")
    from tiny_llama_decode import write_tiny_llama_decode

    decode = write_tiny_llama_decode(EXAMPLES, build_tokenizer, save_hf_layout)
    print(f"tiny llama (decode): {decode.relative_to(EXAMPLES)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
