"""The loading facts (issue 24): each keyed to its transformers release, and the lines they cite in the installed
releases still say what the facts claim (a stale citation fails here)."""

import importlib.util
from pathlib import Path

import pytest

from oomlab.core.choices import Precision
from oomlab.core.models import load_model
from oomlab.core.versions import Fact, applies, parse_versions, versions_from
from oomlab.launch.load_peak import default_load_dtype


def _lines(package: str, file: str) -> list[str]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} not installed")
    return (Path(next(iter(spec.submodule_search_locations))) / file).read_text().splitlines()


def test_the_loading_facts_change_at_transformers_5() -> None:
    for fact in (Fact.LOAD_DTYPE_AUTO, Fact.LOAD_STREAMS):
        assert fact.package == "transformers" and fact.since == (5, 0, 0)
        assert not applies(fact, versions_from({"transformers": "4.57.1"}))
        assert applies(fact, versions_from({"transformers": "5.0.0"}))
        assert applies(fact, versions_from({"torchtune": "0.6.1"}))  # torchtune: its own loader, the checkpoint's dtype


def test_the_cited_lines_of_the_installed_releases() -> None:
    """transformers 5.24 modeling_utils.py:4186-4187 defaults dtype to 'auto' and :4180 drops low_cpu_mem_usage;
    bitsandbytes 0.50.2 Params4bit.to quantizes on a device move (nn/modules.py:424-428), _quantize copies the
    weight to the device in its dtype first (:381-382)."""
    if versions_from(None).release("transformers") != (5, 24, 0):
        pytest.skip("the citations are of transformers 5.24")
    tf = _lines("transformers", "modeling_utils.py")
    assert tf[4185].strip() == "if dtype is None:" and tf[4186].strip() == 'dtype = "auto"'
    assert '"low_cpu_mem_usage"' in tf[4179] and "Not used anymore" in tf[4178]
    assert "4186-4187" in Fact.LOAD_DTYPE_AUTO.source and "4179-4181" in Fact.LOAD_STREAMS.source
    if versions_from(None).release("bitsandbytes") != (0, 50, 2):
        pytest.skip("the citations are of bitsandbytes 0.50.2")
    bnb = _lines("bitsandbytes", "nn/modules.py")
    assert bnb[423].strip().startswith("def to(") and bnb[427].strip() == "return self._quantize(device)"
    assert bnb[380].strip() == "def _quantize(self, device):" and ".to(device)" in bnb[381]


def test_default_load_dtype_by_release() -> None:
    spec = load_model("qwen2.5-7b")  # config.json torch_dtype bfloat16
    old, new = parse_versions("transformers==4.46.0"), parse_versions("transformers==5.1.0")
    assert default_load_dtype(spec, Precision.BF16_MIXED, old, quantized=False).value == "float32"
    assert default_load_dtype(spec, Precision.BF16_MIXED, old, quantized=True).value == "float16"
    assert default_load_dtype(spec, Precision.FP16_MIXED, new, quantized=False).value == "bfloat16"
    bare = load_model("llama-2-7b")  # the shipped config names no torch_dtype: the precision's, assumed
    assert default_load_dtype(bare, Precision.FP16_MIXED, new, quantized=False).value == "float16"
    assert default_load_dtype(bare, Precision.FP16_MIXED, old, quantized=False).value == "float32"
