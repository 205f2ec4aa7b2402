"""Launch files: malformed JSON/YAML named with file and line; key lines."""

from pathlib import Path

import pytest

from oomlab.core.errors import LaunchFileError
from oomlab.launch.files import read_file, read_json, read_yaml


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    """A JSON syntax error says file:line:column."""
    bad = tmp_path / "ds.json"
    bad.write_text('{\n  "fp16": {"enabled": true},\n  "zero_optimization": {"stage": 2,}\n}\n')
    with pytest.raises(LaunchFileError, match=r"ds\.json:3:\d+: malformed JSON"):
        read_json(bad)


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    """A YAML syntax error says file:line:column."""
    bad = tmp_path / "accelerate.yaml"
    bad.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n   bad: [\n")
    with pytest.raises(LaunchFileError, match=r"accelerate\.yaml:4:\d+: malformed YAML"):
        read_yaml(bad)


def test_missing_and_non_mapping_files(tmp_path: Path) -> None:
    """A missing file and a list instead of a mapping are refused by name."""
    with pytest.raises(LaunchFileError, match="does not exist"):
        read_json(tmp_path / "nope.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(LaunchFileError, match="expected a JSON mapping of keys, got list"):
        read_json(tmp_path / "list.json")
    with pytest.raises(LaunchFileError, match="unknown kind '.txt'; known: .json, .yaml, .yml"):
        read_file(tmp_path / "x.txt")


def test_key_lines_of_nested_keys(tmp_path: Path) -> None:
    """Each dotted key has its own line, nested keys of the same name apart."""
    f = tmp_path / "ds.json"
    f.write_text('{\n "fp16": {\n  "enabled": "auto"\n },\n "bf16": {\n  "enabled": true\n }\n}\n')
    lf = read_json(f)
    assert (lf.lines["fp16.enabled"], lf.lines["bf16.enabled"]) == (3, 6)
    assert str(lf.origin("bf16.enabled")).endswith("ds.json:6 bf16.enabled")
