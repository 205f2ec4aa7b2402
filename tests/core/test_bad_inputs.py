"""Absurd user input to the core loaders (issue 20): a config.json, a GPU name, a price table, a size -- each refused
with an OomlabError naming the value and what is accepted, in milliseconds, never a traceback or unbounded work."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from oomlab.core.errors import InvalidValueError, OomlabError, UnknownNameError
from oomlab.core.gpus import known_gpus, load_gpu
from oomlab.core.models import load_model
from oomlab.core.paths import GPU_SPECS_DIR
from oomlab.core.prices import load_prices, resolve_host_ram
from oomlab.core.units import parse_memory_size
from oomlab.core.user_input import shown
from tests.cli_support import HANG_S

LLAMA_7B = dict(load_model("llama-7b").config)
MIXTRAL = dict(load_model("mixtral-8x7b").config)
PHI_2 = dict(load_model("phi-2").config)


def write_config(tmp_path: Path, raw: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    return path


# ------------------------------------------------------------------------------------------------ config.json

@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # a minute of per-layer work before the bound
        ({"num_hidden_layers": 1_000_000}, "field 'num_hidden_layers' is 1000000 (beyond any model); accepted: a "
         "positive integer up to 1,024"),
        ({"num_hidden_layers": 1024}, None),  # the bound itself is accepted
        # exited 0 with a budget of 10**36 GiB
        ({"hidden_size": 2**70}, "field 'hidden_size' is 1180591620717411303424 (beyond any model); accepted: a "
         "positive integer up to 131,072"),
        ({"vocab_size": 2**23 + 1}, "field 'vocab_size' is 8388609 (beyond any model); accepted: a positive "
         "integer up to 8,388,608"),
        ({"num_attention_heads": 2**13}, "field 'num_attention_heads' is 8192 (beyond any model); accepted: a "
         "positive integer up to 4,096"),
        ({"intermediate_size": 2**20}, "field 'intermediate_size' is 1048576 (beyond any model); accepted: a "
         "positive integer up to 524,288 (or null, to let the config class derive it)"),
        ({"max_position_embeddings": 10**12}, "field 'max_position_embeddings' is 1000000000000 (beyond any model)"),
        ({"num_hidden_layers": True}, "field 'num_hidden_layers' is true (a boolean); accepted: a positive integer"),
        ({"vocab_size": "32000"}, "field 'vocab_size' is \"32000\" (a string); accepted: a positive integer"),
        ({"vocab_size": 32000.5}, "field 'vocab_size' is 32000.5 (a fractional number)"),
        ({"hidden_size": [1] * 10_000}, "field 'hidden_size' is [1, 1, 1,"),  # echoed clipped
    ],
    ids=["layers-1e6", "layers-at-bound", "hidden-2**70", "vocab", "heads", "intermediate", "positions", "bool",
         "str", "float", "long-list"],
)
def test_config_counts_bounded(tmp_path: Path, overrides: dict, message: str | None) -> None:
    """Every count a config.json gives is a positive integer within a bound named in the message."""
    path = write_config(tmp_path, {**LLAMA_7B, **overrides})
    start = time.perf_counter()
    if message is None:
        assert load_model(str(path)).num_hidden_layers == overrides["num_hidden_layers"]
        return
    with pytest.raises(InvalidValueError) as err:
        load_model(str(path))
    assert message in str(err.value)
    assert len(str(err.value)) < 600
    assert time.perf_counter() - start < HANG_S  # a hang guard (a minute per layer before), not a speed target


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        # ", ".join over integers: a TypeError traceback before
        ({"model_type": "foo", "architectures": [1, 2]}, "is model_type 'foo' (1, 2): unknown to transformers"),
        ({"model_type": "foo", "auto_map": {"AutoConfig": 1}}, "custom code (auto_map: 1, which needs "
         "trust_remote_code)"),
        # Hugging Face writes tokenizer entries as lists
        ({"model_type": "foo", "auto_map": {"AutoTokenizer": ["tok.T", None]}}, "custom code (auto_map: "
         "[\"tok.T\", null], which needs"),
        ({"model_type": "foo", "architectures": "FooForCausalLM"}, "(FooForCausalLM): unknown to transformers"),
        ({**MIXTRAL, "num_experts_per_tok": 9}, "num_experts_per_tok 9 exceeds the 8 experts; accepted: 1 to 8"),
        ({**PHI_2, "partial_rotary_factor": 5}, "field 'partial_rotary_factor' is 5; accepted: a fraction of the "
         "head dimension, above 0 and at most 1"),
        ('{"model_type": "llama", "rope_theta": Infinity}', "Infinity is not a number JSON allows"),
        ('{"model_type": "llama", "rope_theta": 1e400}', "1e400 is out of range for a number"),
        ('{"model_type": "llama",\n "hidden_size": }', "is not valid JSON: line 2 column 17: Expecting value"),
    ],
    ids=["architectures-ints", "auto-map-int", "auto-map-list", "architectures-str", "top-k", "rotary",
         "infinity", "overflow", "malformed"],
)
def test_config_shapes_refused(tmp_path: Path, raw: object, message: str) -> None:
    """A config.json whose lists, maps or numbers are of the wrong kind is refused naming them (no traceback)."""
    with pytest.raises(InvalidValueError) as err:
        load_model(str(write_config(tmp_path, raw)))
    assert message in str(err.value)


def test_config_not_utf8(tmp_path: Path) -> None:
    """A config.json in another encoding is refused naming the first bad byte."""
    path = tmp_path / "config.json"
    path.write_bytes(b'\xff\xfe{"model_type": "llama"}')
    with pytest.raises(InvalidValueError, match=r"is not UTF-8 text \(byte 0xff at offset 0\)"):
        load_model(str(path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_config_fifo_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO named config.json is refused at once (before: 'not a .json file', or a read that blocks)."""
    path = tmp_path / "config.json"
    os.mkfifo(path)
    start = time.perf_counter()
    with pytest.raises(InvalidValueError, match=r"is a FIFO \(named pipe\); give a regular file"):
        load_model(str(path))
    assert time.perf_counter() - start < HANG_S  # a hang guard (a blocking read never returns), not a speed target


def test_config_huge_name_clipped() -> None:
    """A model name of a million characters gives a short message."""
    with pytest.raises(OomlabError) as err:
        load_model("x" * 1_000_000)
    assert "1,000,002 characters" in str(err.value) and len(str(err.value)) < 1000


# ------------------------------------------------------------------------------------------------ GPU names

GPU_REFUSAL = ("is not a GPU name: a GPU is named by one of oomlab's specs, never by a path; known: {known} (to add a "
               "GPU, write its spec as lib/oomlab/specs/gpus/<name>.json with the fields of t4.json, and pass <name>)")


@pytest.mark.parametrize(
    "name",
    [
        str(GPU_SPECS_DIR / "t4"),  # an absolute path: GPU_SPECS_DIR / "/…/t4.json" loaded it before
        "../gpus/t4",  # relative to the specs folder: loaded t4 before
        "../models/llama-13b",  # a model spec read as a GPU: a KeyError traceback before
        "..",
        "t4/",
        "x" * 500,  # clipped in the message
    ],
    ids=["absolute", "dotdot-gpu", "dotdot-model", "dotdot", "slash", "long"],
)
def test_gpu_is_a_name_never_a_path(name: str) -> None:
    """Only a shipped spec's name loads a GPU; the refusal lists the known names and says how to add one."""
    with pytest.raises(InvalidValueError) as err:
        load_gpu(name)
    assert str(err.value) == f"GPU {shown(name)} " + GPU_REFUSAL.format(known=", ".join(known_gpus()))


def test_gpu_name_case_and_spaces() -> None:
    """A known name in capitals or with spaces around it is still that GPU."""
    assert load_gpu(" T4 ").name == "t4"


def test_gpu_unknown_name() -> None:
    """A name-shaped unknown GPU keeps the plain refusal."""
    with pytest.raises(UnknownNameError, match=r"^unknown GPU 'h9000'; known: a100-40gb, "):
        load_gpu("h9000")


# ------------------------------------------------------------------------------------------------ price tables

ROW = {"provider": "mine", "instance": "box", "gpu": "a100-80gb", "gpus_per_instance": 8, "usd_per_hour": 8.0}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # "$inf per million tokens" before
        ('{"instances": [{"provider": "x", "instance": "y", "gpu": "t4", "gpus_per_instance": 1, '
         '"usd_per_hour": Infinity}]}', "Infinity is not a number JSON allows"),
        ('{"instances": [{"provider": "x", "instance": "y", "gpu": "t4", "gpus_per_instance": 1, '
         '"usd_per_hour": NaN}]}', "NaN is not a number JSON allows"),
        ('{"instances": [{"provider": "x", "instance": "y", "gpu": "t4", "gpus_per_instance": 1, '
         '"usd_per_hour": 1e999}]}', "1e999 is out of range for a number"),
        (json.dumps({"instances": [{**ROW, "host_ram_bytes": 1e300}]}),
         "instance 0's host_ram_bytes 1e+300 (", ),
        (json.dumps({"instances": [{**ROW, "usd_per_hour": 1e12}]}),
         "instance 0 has usd_per_hour 1000000000000.0; must be a finite number of dollars > 0 and at most 10,000"),
        (json.dumps({"instances": [{**ROW, "usd_per_hour": 0}]}), "instance 0 has usd_per_hour 0; must be"),
        (json.dumps({"instances": [{**ROW, "gpus_per_instance": 10**6}]}),
         "instance 0 has gpus_per_instance 1000000; must be an integer from 1 to 64"),
        # silently read as "not stated" before
        (json.dumps({"instances": [{**ROW, "host_ram_bytes": -5}]}), "instance 0's host_ram_bytes -5 ("),
        (json.dumps({"instances": [{**ROW, "host_ram_bytes": "lots"}]}),
         "instance 0 has host_ram_bytes 'lots'; must be a whole number of bytes (or null when unknown)"),
        (json.dumps({"instances": [{**ROW, "host_ram_reliable": "no"}]}),
         "instance 0 has host_ram_reliable 'no'; must be true or false"),
        (json.dumps({"instances": [{**ROW, "provider": ["x"] * 1000}]}), "instance 0 has provider ['x', 'x',"),
        (json.dumps({"instances": [{**ROW, "instance": "y" * 1000}]}), "must be a string of at most 500 characters"),
    ],
    ids=["usd-infinity", "usd-nan", "usd-overflow", "host-huge", "usd-huge", "usd-zero", "gpus-huge",
         "host-negative", "host-string", "reliable-string", "provider-list", "instance-long"],
)
def test_price_table_values_checked(tmp_path: Path, content: str, message: str) -> None:
    """Every number of a price table is finite and in range, every name a short string (messages clipped)."""
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(InvalidValueError) as err:
        load_prices(path)
    assert message in str(err.value)
    assert len(str(err.value)) < 600


def test_price_table_folder_and_encoding(tmp_path: Path) -> None:
    """A folder or a file in another encoding is refused naming it (a traceback before)."""
    with pytest.raises(InvalidValueError, match=r"price table '.*' is a folder; give a regular file"):
        load_prices(tmp_path)
    path = tmp_path / "prices.json"
    path.write_bytes(b'{"instances": [], "note": "\xe9"}')
    with pytest.raises(InvalidValueError, match=r"is not UTF-8 text \(byte 0xe9 at offset 27\); save it as UTF-8"):
        load_prices(path)


def test_price_table_good_host_ram(tmp_path: Path) -> None:
    """A well-formed row with its host RAM is read as before."""
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"instances": [{**ROW, "host_ram_bytes": 2**40}]}))
    assert load_prices(path).instances[0].host_ram_bytes == 2**40


# ------------------------------------------------------------------------------------------------ sizes

@pytest.mark.parametrize(
    ("text", "message"),
    [
        # OverflowError traceback before
        ("9" * 400 + "GiB", "a number of at most 30 digits (before and after the point) is accepted"),
        ("1." + "0" * 400 + "GiB", "a number of at most 30 digits"),
        ("2000TiB", "invalid host RAM '2000TiB' (2048000.00 GiB): must be at most 1048576.00 GiB (1 PiB)"),
        ("1048577GiB", "must be at most 1048576.00 GiB"),  # one GiB over the bound
    ],
    ids=["400-nines", "400-decimals", "2000TiB", "bound+1"],
)
def test_memory_size_bounded(text: str, message: str) -> None:
    """A host RAM beyond 1 PiB, or written with hundreds of digits, is refused, the value clipped."""
    with pytest.raises(InvalidValueError) as err:
        parse_memory_size(text)
    assert message in str(err.value) and len(str(err.value)) < 400


def test_memory_size_at_bound() -> None:
    """1 PiB itself is accepted."""
    assert parse_memory_size("1048576GiB") == 2**50


def test_host_ram_integer_bounded() -> None:
    """An integer host RAM (the API's) is held to the same bounds."""
    with pytest.raises(InvalidValueError, match=r"must be at most 1048576.00 GiB"):
        resolve_host_ram(2**60, "t4", 1)
