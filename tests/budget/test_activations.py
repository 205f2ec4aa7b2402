"""The saved-tensor inventory equals what autograd really saves, on small transformers models."""

from __future__ import annotations

import warnings

import pytest
import torch

from oomlab.budget.activations import autocast_copy_bytes, saved_activation_bytes
from oomlab.core.modeling import build_meta_model  # noqa: F401  (keeps transformers' import side effects in one place
from oomlab.core.models import model_from_config
from oomlab.core.setup import make_setup


def tiny_spec(h: int, i: int, a: int, kv: int, layers: int, vocab: int = 384):
    return model_from_config(
        {"model_type": "llama", "hidden_size": h, "intermediate_size": i, "num_hidden_layers": layers,
         "num_attention_heads": a, "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": 512,
         "rms_norm_eps": 1e-6, "tie_word_embeddings": False},
        f"tiny-{h}-{i}-{a}-{kv}-{layers}",
    )


def saved_bytes(setup) -> int:
    """Bytes of distinct non-parameter storages saved for backward by one forward pass."""
    from transformers import AutoModelForCausalLM

    config = setup.model.hf_config()
    config._attn_implementation = setup.attention.value
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    regime_half = {"fp16-mixed": torch.float16, "bf16-mixed": torch.bfloat16, "fp16": torch.float16,
                   "bf16": torch.bfloat16}.get(setup.precision.value)
    mixed = setup.precision.value.endswith("-mixed")
    if regime_half is not None and (not mixed or setup.method.value != "full"):
        model = model.to(regime_half)
    if setup.method.value == "lora":
        from peft import LoraConfig, get_peft_model

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = get_peft_model(model, LoraConfig(r=setup.lora_rank, lora_alpha=setup.lora_alpha,
                                                     target_modules=list(setup.lora_targets), lora_dropout=0.0))
    ids = torch.randint(0, setup.model.vocab_size, (setup.batch, setup.seq))
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if mixed:
            with torch.autocast("cpu", dtype=regime_half):
                model(input_ids=ids, labels=ids)
        else:
            model(input_ids=ids, labels=ids)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params and n > 4)  # drop the scalar loss


CASES = [
    # (precision, method, attention, targets, kv heads)
    ("fp32", "full", "sdpa", None, 4),
    ("fp32", "full", "sdpa", None, 2),  # grouped-query attention
    ("fp32", "full", "eager", None, 2),  # eager repeats k/v to every head
    ("fp16", "full", "sdpa", None, 2),
    ("bf16", "full", "eager", None, 4),
    ("fp16-mixed", "full", "sdpa", None, 2),
    ("bf16-mixed", "full", "eager", None, 2),
    ("fp32", "lora", "sdpa", "q_proj,k_proj,v_proj,o_proj", 2),
    ("fp16", "lora", "sdpa", "q_proj,k_proj,v_proj,o_proj", 2),
    ("fp16-mixed", "lora", "sdpa", "q_proj,k_proj,v_proj,o_proj", 2),
    ("fp16", "lora", "sdpa", "q_proj,v_proj,gate_proj,up_proj,down_proj", 4),
    ("fp32", "lora", "sdpa", "o_proj,down_proj", 2),
    ("fp16-mixed", "lora", "sdpa", "gate_proj,down_proj", 2),
]


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize(("precision", "method", "attention", "targets", "kv"), CASES)
def test_inventory_matches_autograd(precision, method, attention, targets, kv, layers) -> None:
    """The inventory's bytes equal the distinct storages autograd saves in one forward pass."""
    kwargs = dict(gpu="a100-80gb", precision=precision, method=method, attention=attention, batch=2, seq=24,
                  lora_rank=4, **({"lora_targets": targets} if targets else {}))
    setup = make_setup(model=tiny_spec(64, 176, 4, kv, layers), **kwargs)
    assert saved_bytes(setup) == saved_activation_bytes(setup) + autocast_copy_bytes(setup)
