"""DeepSpeed settings that move memory and that oomlab does not budget (sequence parallelism, DeepCompile and its
activation offloading, ZeRO++, half master weights) are refused where a JSON turns them on, naming the key, what it
does and what oomlab models; turned off, they are read as absent."""

import pytest

from oomlab.budget.deepspeed_config import MODELLED, read_deepspeed_config
from oomlab.core.errors import InvalidValueError, OomlabError

BASE = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}


def _read(extra: dict, zero: dict | None = None):
    config = {**BASE, **extra, "zero_optimization": {**BASE["zero_optimization"], **(zero or {})}}
    return read_deepspeed_config(config, model="llama-2-7b", gpu="a100-80gb", gpus=8, source="ds.json")


@pytest.mark.parametrize(("extra", "zero", "key", "what"), [
    ({"sequence_parallel_size": 4}, None, "sequence_parallel_size 4", "Ulysses sequence (context) parallelism"),
    ({"compile": {"deepcompile": True}}, None, "compile.deepcompile True", "DeepCompile: torch.compile"),
    ({"compile": {"offload_activation": "true"}}, None, "compile.offload_activation 'true'",
     "activation offloading to the host"),
    ({}, {"zero_quantized_weights": True}, "zero_optimization.zero_quantized_weights True", "ZeRO++ int8 weight"),
    ({}, {"zero_hpz_partition_size": 8}, "zero_optimization.zero_hpz_partition_size 8", "ZeRO++ hpZ"),
    ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}, None,
     "bf16.bf16_master_weights_and_grads True", "bf16 master weights and gradients: no fp32 master partition"),
])
def test_unmodelled_settings_are_refused(extra, zero, key, what) -> None:
    """The refusal names the file, the key and its value, what the setting does, and what oomlab budgets."""
    with pytest.raises(InvalidValueError) as err:
        _read(extra, zero)
    message = str(err.value)
    assert isinstance(err.value, OomlabError)
    assert message.startswith(f"ds.json: {key} is not budgeted: {what}")
    assert MODELLED in message and message.endswith("remove the key to budget the run without it")


@pytest.mark.parametrize(("extra", "zero"), [
    ({"sequence_parallel_size": 1}, None),  # one rank per sequence: no sequence parallelism
    ({"compile": {"deepcompile": False, "offload_activation": False}}, None),
    ({}, {"zero_quantized_weights": False, "zero_hpz_partition_size": 1}),
])
def test_settings_turned_off_are_read(extra, zero) -> None:
    """The same keys at their defaults budget the run as if absent."""
    assert _read(extra, zero).setup == _read({}).setup
