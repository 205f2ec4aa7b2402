"""Tests for oomlab.pipeline: parameters, results JSON, and papermill runs of tiny notebooks."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from oomlab.core.errors import OomlabError, PipelineError
from oomlab.core.gpus import known_gpus
from oomlab.core.models import known_models
from oomlab.pipeline.ownership import manifest_of, write_manifest
from oomlab.pipeline.params import PARAMETERS, parse_params, read_user_setup, render_params_help, validate_params
from oomlab.pipeline.runner import PipelineResult, notebook_paths, run_pipeline
from oomlab.report.results import read_results, write_results

pytestmark = pytest.mark.heavy  # starts kernels: `pytest -m "not heavy"` leaves it out

ACCEPTED = ("attention, batch, checkpointing, device, dtype, gpu, gpus, host_ram, launch_dir, lora_rank, lora_targets, "
            "loss, message_format, method, model, non_pytorch_mib, offload_activations, optimizer, precision, "
            "reference, seq, strategy, trace, trainer, versions")
DEFAULTS = {
    "model": "llama-13b",
    "dtype": "float16",
    "gpu": "t4",
    "gpus": 4,
    "non_pytorch_mib": None,
    "device": "auto",
    "message_format": "auto",
    "precision": "fp16-mixed",
    "optimizer": "adamw",
    "batch": 1,
    "seq": 2048,
    "checkpointing": False,
    "attention": "sdpa",
    "lora_rank": 8,
    "strategy": "ddp",
    "method": "full",
    "lora_targets": "q_proj,k_proj,v_proj,o_proj",
    "launch_dir": None,
    "host_ram": "auto",
    "trace": True,
    "trainer": "sft",
    "reference": "default",
    "versions": None,
    "loss": "standard",
    "offload_activations": False,
}


# ------------------------------------------------------------------------------- tiny notebooks


def make_notebook(
    path: Path, title: str, body: list[str], parameters: str | None = None, results: bool = True
) -> Path:
    """Write a notebook: an H1 cell, a parameters cell, a results cell, then ``body`` cells.

    ``body`` items are code, or markdown when they start with ``"md:"``.
    """
    if parameters is None:
        parameters = 'model = "llama-13b"\ngpus = 1\nresults_path = ""\n'
    params_cell = nbformat.v4.new_code_cell(parameters)
    params_cell.metadata["tags"] = ["parameters"]
    results_cell = nbformat.v4.new_code_cell(
        "from oomlab.report.results import write_results\n"
        "write_results(results_path, {'model': model, 'gpus': gpus, 'title': " + repr(title) + "})"
    )
    cells = [
        nbformat.v4.new_markdown_cell(f"# {title}\n\nWhat does this tiny notebook answer?"),
        params_cell,
        *([results_cell] if results else []),
        *(nbformat.v4.new_markdown_cell(source[3:]) if source.startswith("md:")
          else nbformat.v4.new_code_cell(source) for source in body),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


FIGURE = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(2, 2))\nax.plot([1, 2, 3])\nplt.show()"
)


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, PipelineResult]:
    """Run the pipeline once on two tiny notebooks (plus one that must be skipped)."""
    root = tmp_path_factory.mktemp("good")
    notebooks, out = root / "notebooks", root / "outputs"
    notebooks.mkdir()
    make_notebook(notebooks / "01_first-look.ipynb", "First look", ["md:## A figure", FIGURE])
    make_notebook(notebooks / "02_second-look.ipynb", "Second look", ["print('hello')"],
                  parameters='gpus = 1\nresults_path = ""\nout_dir = ""\nmodel = "x"\n')
    make_notebook(notebooks / "explore.ipynb", "Explore", ["raise SystemError('never run')"])
    params = parse_params(["gpus=2", "model=llama-7b"])
    return notebooks, out, run_pipeline(params, out_dir=out, notebooks_dir=notebooks, progress=False)


# ----------------------------------------------------------------------------------- parameters


def test_defaults_when_nothing_given() -> None:
    """With no file and no pairs every parameter takes its default."""
    assert parse_params() == DEFAULTS


def test_parameters_are_the_documented_set() -> None:
    """PARAMETERS holds exactly the parameters of this issue, each with help text."""
    assert sorted(PARAMETERS) == ACCEPTED.split(", ")
    assert all(p.help for p in PARAMETERS.values())


def _help_rows() -> dict[str, list[str]]:
    """render_params_help's parameter lines, keyed by name, split into its columns (two spaces or more apart)."""
    lines = render_params_help().splitlines()[2:]
    return {line.split()[0]: re.split(r" {2,}", line.strip()) for line in lines}


def test_params_help_has_one_line_per_parameter() -> None:
    """The run epilog lists every parameter once, in registry order, after a title and a column header."""
    lines = render_params_help().splitlines()
    assert lines[0] == "parameters (-p KEY=VALUE, or KEY: VALUE lines in --params FILE.yaml):"
    assert lines[1].split() == ["KEY", "TYPE", "DEFAULT", "MEANING"]
    assert [line.split()[0] for line in lines[2:]] == list(PARAMETERS)


@pytest.mark.parametrize(
    ("name", "columns"),
    [
        ("gpus", ["gpus", "int >= 1", "4", "number of GPUs"]),
        ("non_pytorch_mib", ["non_pytorch_mib", "float >= 0 or none", "none",
                             "MiB held on the GPU outside PyTorch (None: measured/default)"]),  # nullable, bound 0
        ("checkpointing", ["checkpointing", "bool", "false", "activation checkpointing in the user's configuration"]),
        ("device", ["device", "str", "auto", "where to reproduce the failure; one of auto, simulated, cuda"]),
        ("host_ram", ["host_ram", "str", "auto",
                      "host RAM per node, with its unit; auto: assumed, the listed instance with these GPUs (in "
                      "specs/prices.json), else oomlab's fallback machine, an aws g4dn.12xlarge (4 x t4, "
                      "192.00 GiB)"]),  # from the table
    ],
)
def test_params_help_line_shows_type_default_and_choices(name: str, columns: list[str]) -> None:
    """Each line gives the name, the type with its bound, the default and the help with any choices."""
    assert _help_rows()[name] == columns


def test_params_help_defaults_parse_back() -> None:
    """Every default the help shows, passed back as -p KEY=DEFAULT, gives the registry's default."""
    for name, (_, _, shown, *_) in _help_rows().items():
        assert parse_params([f"{name}={shown}"])[name] == PARAMETERS[name].default, name


@pytest.mark.parametrize(
    ("pair", "key", "expected"),
    [
        ("gpus=2", "gpus", 2),
        ("gpus= 8 ", "gpus", 8),  # whitespace around the value is ignored
        ("non_pytorch_mib=512", "non_pytorch_mib", 512.0),
        ("non_pytorch_mib=0", "non_pytorch_mib", 0.0),  # boundary: >= 0 accepted
        ("non_pytorch_mib=none", "non_pytorch_mib", None),
        ("non_pytorch_mib=null", "non_pytorch_mib", None),
        ("non_pytorch_mib=NONE", "non_pytorch_mib", None),
        ("dtype=fp16", "dtype", "float16"),  # aliases become the canonical name
        ("dtype=bf16", "dtype", "bfloat16"),
        ("gpu=A100-80GB", "gpu", "a100-80gb"),
        ("model=Llama-7B", "model", "llama-7b"),
        ("device=simulated", "device", "simulated"),
        ("message_format=torch>=2.1", "message_format", "torch>=2.1"),  # '=' inside the value
        ("strategy=zero3", "strategy", "zero3"),
        ("method=lora", "method", "lora"),
        ("lora_targets= q_proj , v_proj ", "lora_targets", "q_proj,v_proj"),  # spaces around names dropped
        ("launch_dir=tests/fixtures/open-assistant/seed", "launch_dir",  # made absolute: notebooks run elsewhere
         str((Path(__file__).parents[1] / "fixtures" / "open-assistant" / "seed").resolve())),
    ],
)
def test_pair_is_converted_to_declared_type(pair: str, key: str, expected: object) -> None:
    """A key=value string becomes the parameter's declared type (or its canonical name)."""
    value = parse_params([pair])[key]
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (["modle=llama-7b"], f"unknown parameter 'modle'; accepted: {ACCEPTED}"),
        (["gpus4"], f"malformed parameter 'gpus4': expected key=value; accepted: {ACCEPTED}"),
        (["=4"], f"malformed parameter '=4': expected key=value; accepted: {ACCEPTED}"),
        (["gpus=four"], "parameter 'gpus' expects an integer, got 'four'"),
        (["gpus=2.5"], "parameter 'gpus' expects an integer, got '2.5'"),
        (["gpus=none"], "parameter 'gpus' expects an integer, got 'none'"),
        (["gpus=0"], "parameter 'gpus' must be >= 1, got 0"),  # boundary: 1 is the least
        (["non_pytorch_mib=lots"], "parameter 'non_pytorch_mib' expects a number or none, got 'lots'"),
        (["non_pytorch_mib=-0.5"], "parameter 'non_pytorch_mib' must be >= 0, got -0.5"),
        (["non_pytorch_mib=inf"], "parameter 'non_pytorch_mib' must be a finite number, got inf"),
        (["device=tpu"], "parameter 'device' must be one of auto, simulated, cuda; got 'tpu'"),
        (["message_format=torch3"],
         "parameter 'message_format' must be one of auto, torch<=2.0, torch>=2.1, old, new; got 'torch3'"),
        (["gpu=h9000"], f"parameter 'gpu': unknown GPU 'h9000'; known: {', '.join(known_gpus())}"),
        (["model=gpt-5"], "parameter 'model': unknown model 'gpt-5'; known: "
         f"{', '.join(known_models())} (or give a path to a config.json)"),
        (["strategy=zero4"], "parameter 'strategy' must be one of single, ddp, zero1, zero2, fsdp, fsdp-offload, "
         "fsdp2, fsdp2-offload, zero3, zero2-offload, zero3-offload; got 'zero4'"),
        (["launch_dir=/nonexistent"], "parameter 'launch_dir': launch_dir '/nonexistent' is not a folder of launch "
         "files"),
        (["lora_targets=,"], "parameter 'lora_targets': no LoRA target modules in ','; e.g. q_proj,k_proj,v_proj,"
         "o_proj"),
        (["method=qlora", "precision=fp32"], "the user's setup: method 'qlora' computes in half precision over a "
         "4-bit base; precision 'fp32' is not a QLoRA setup: use fp16-mixed (or bf16-mixed where the GPU has bf16)"),
    ],
)
def test_bad_pair_raises_naming_key_and_value(pairs: list[str], message: str) -> None:
    """A bad key or value raises an OomlabError whose message names it."""
    with pytest.raises(OomlabError) as info:
        parse_params(pairs)
    assert str(info.value) == message


def test_launch_dir_errors_name_the_file(tmp_path: Path) -> None:
    """A launch_dir whose DeepSpeed JSON is malformed is refused naming the folder, the file and the line."""
    (tmp_path / "ds.json").write_text('{\n  "zero_optimization": {"stage": 2,,}\n}\n')
    with pytest.raises(OomlabError, match=rf"launch_dir '{tmp_path}'.*ds\.json:2:"):
        read_user_setup(parse_params([f"launch_dir={tmp_path}"]))


def test_dtype_error_lists_known_dtypes() -> None:
    """An unknown dtype names the parameter and lists the dtypes oomlab knows."""
    with pytest.raises(OomlabError, match=r"^parameter 'dtype': unknown dtype 'int3'; known: .*float16"):
        parse_params(["dtype=int3"])


def test_model_accepts_config_path(tmp_path: Path) -> None:
    """A path to a config.json is a valid model."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}))
    assert parse_params([f"model={config}"])["model"] == str(config)


def test_yaml_file_then_pairs_override(tmp_path: Path) -> None:
    """Values come from the YAML file, typed, and key=value pairs override them."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text("gpu: a100-80gb\ngpus: 2\nnon_pytorch_mib: 300\ndevice: simulated\n")
    params = parse_params(["gpus=8"], params_file=params_file)
    assert params == {**DEFAULTS, "gpu": "a100-80gb", "gpus": 8, "non_pytorch_mib": 300.0,
                      "device": "simulated"}


def test_yaml_null_is_none(tmp_path: Path) -> None:
    """A YAML null sets a nullable parameter to None."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text("non_pytorch_mib: null\n")
    assert parse_params(params_file=params_file)["non_pytorch_mib"] is None


def test_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    """An empty params file overrides nothing."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text("")
    assert parse_params(params_file=params_file) == DEFAULTS


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus: true\n", "parameter 'gpus' expects an integer, got True"),  # bool is not an int here
        ("gpus: 2.0\n", "parameter 'gpus' expects an integer, got 2.0"),
        ("gpu: 4090\n", "parameter 'gpu': unknown GPU '4090'; known: a100-40gb"),  # a YAML number judged as its text
        ("modle: llama-7b\n", f"unknown parameter 'modle'; accepted: {ACCEPTED}"),
        ("1: 2\n", f"unknown parameter 1; accepted: {ACCEPTED}"),
    ],
)
def test_yaml_file_bad_values(tmp_path: Path, text: str, message: str) -> None:
    """A YAML value of the wrong type, or an unknown key, is refused with its name."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text(text)
    with pytest.raises(OomlabError) as info:
        parse_params(params_file=params_file)
    assert str(info.value).startswith(message)


def test_yaml_file_must_be_a_mapping(tmp_path: Path) -> None:
    """A params file holding a list is refused, listing the accepted parameters."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text("- gpus\n- 4\n")
    with pytest.raises(OomlabError) as info:
        parse_params(params_file=params_file)
    assert str(info.value) == (
        f"params file {str(params_file)!r} must be a mapping of parameter: value, got list; accepted: {ACCEPTED}"
    )


def test_yaml_file_invalid_yaml(tmp_path: Path) -> None:
    """A params file that is not YAML is refused, naming the file."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text("gpus: [4\n")
    with pytest.raises(OomlabError, match=r"^params file '.*params\.yaml' is not valid YAML: "):
        parse_params(params_file=params_file)


def test_missing_params_file(tmp_path: Path) -> None:
    """A params file that does not exist is refused, naming it."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(OomlabError) as info:
        parse_params(params_file=missing)
    assert str(info.value) == f"params file {str(missing)!r} does not exist"


def test_validate_params_accepts_typed_values() -> None:
    """Already-typed values (a dict from code) are validated the same way."""
    assert validate_params({"gpus": 2, "non_pytorch_mib": 1})["non_pytorch_mib"] == 1.0


def test_run_pipeline_rejects_bad_params_before_running(tmp_path: Path) -> None:
    """run_pipeline validates its params before any notebook runs."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    make_notebook(notebooks / "01_a.ipynb", "A", [])
    with pytest.raises(OomlabError, match=r"^unknown parameter 'gpu_count'"):
        run_pipeline({"gpu_count": 2}, out_dir=tmp_path / "out", notebooks_dir=notebooks, progress=False)
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class _Point:
    x: int
    where: Path
    shape: tuple[int, ...]


def test_write_results_round_trip(tmp_path: Path) -> None:
    """Dataclasses, tuples and paths are written as JSON and read back as plain values."""
    path = write_results(tmp_path / "sub" / "r.json", {"p": _Point(1, Path("/a/b"), (2, 3)), "n": None})
    assert path == tmp_path / "sub" / "r.json"
    assert read_results(path) == {"p": {"x": 1, "where": "/a/b", "shape": [2, 3]}, "n": None}


def test_write_results_leaves_no_temporary_file(tmp_path: Path) -> None:
    """The atomic write leaves only the results file in its folder."""
    write_results(tmp_path / "r.json", {"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_write_results_refuses_unknown_objects_and_keeps_old_file(tmp_path: Path) -> None:
    """An object JSON cannot store raises TypeError and the previous file survives."""
    path = write_results(tmp_path / "r.json", {"a": 1})
    with pytest.raises(TypeError, match="write_results cannot store object"):
        write_results(path, {"a": object()})
    assert read_results(path) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_read_results_missing_file(tmp_path: Path) -> None:
    """Reading results that were never written says which file is missing."""
    with pytest.raises(FileNotFoundError, match=r"^no results at '.*nope\.json'"):
        read_results(tmp_path / "nope.json")


# ------------------------------------------------------------------------------------- notebooks


def test_notebook_paths_numbered_in_order(tmp_path: Path) -> None:
    """Only NN_*.ipynb notebooks are listed, in number order."""
    for name in ("02_b.ipynb", "explore.ipynb", "01_a.ipynb", "10_c.ipynb", "1_x.ipynb", "03_d.txt"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in notebook_paths(tmp_path)] == ["01_a.ipynb", "02_b.ipynb", "10_c.ipynb"]


def test_run_pipeline_writes_executed_notebooks(good_run: tuple[Path, Path, PipelineResult]) -> None:
    """Each numbered notebook is executed into out_dir/notebooks under the same name; explore is not."""
    _, out, result = good_run
    executed = out / "notebooks"
    assert result.executed_paths == (executed / "01_first-look.ipynb", executed / "02_second-look.ipynb")
    assert all(p.is_file() for p in result.executed_paths)
    assert not (out / "notebooks" / "explore.ipynb").exists()


def test_run_pipeline_injects_declared_parameters(good_run: tuple[Path, Path, PipelineResult]) -> None:
    """Notebooks get the parameters their cell declares, the results path, and out_dir when declared (relative to
    the executed notebook: the run's folder is '..' from there)."""
    _, out, result = good_run
    assert result.results_paths == (out / "results" / "01_first-look.json", out / "results" / "02_second-look.json")
    assert read_results(result.results_paths[0]) == {"model": "llama-7b", "gpus": 2, "title": "First look"}
    injected = nbformat.read(result.executed_paths[1], as_version=4).cells[2]
    assert "injected-parameters" in injected.metadata.tags
    assert "out_dir = '..'" in injected.source.replace('"', "'")
    assert (result.executed_paths[1].parent / "..").resolve() == out
    assert "dtype" not in injected.source  # not declared by the notebook, so not injected


def test_run_pipeline_writes_report(good_run: tuple[Path, Path, PipelineResult]) -> None:
    """Without 04_report.ipynb the report is rendered from the first notebook."""
    _, out, result = good_run
    assert result.report_path == out / "report.html"
    html = result.report_path.read_text()
    assert "First look" in html
    assert "Second look" not in html
    assert result.seconds > 0


def test_run_pipeline_report_is_self_contained(good_run: tuple[Path, Path, PipelineResult]) -> None:
    """The pipeline's report embeds its figure, hides code, has a TOC, and loads nothing remote."""
    html = good_run[2].report_path.read_text()
    assert re.search(r'<img\b[^>]*\bsrc="data:image/png;base64,', html)
    assert "write_results(" not in html
    assert '<a href="#A-figure">A figure</a>' in html
    for pattern in (r"<script\b[^>]*\bsrc=", r"<link\b[^>]*href=\"?https?:", r"@import", r"unpkg|cdnjs|jsdelivr"):
        assert not re.search(pattern, html, re.IGNORECASE), pattern


def test_run_pipeline_prefers_report_notebook(tmp_path: Path) -> None:
    """When 04_report.ipynb exists, the report is rendered from it."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    make_notebook(notebooks / "01_a.ipynb", "Notebook A", [])
    make_notebook(notebooks / "04_report.ipynb", "The report", [])
    result = run_pipeline({}, out_dir=tmp_path / "out", notebooks_dir=notebooks, progress=False)
    assert "<title>The report</title>" in result.report_path.read_text()


def test_failing_notebook_raises_pipeline_error(tmp_path: Path) -> None:
    """A raising cell gives a PipelineError naming the notebook, the cell and the error."""
    notebooks, out = tmp_path / "notebooks", tmp_path / "out"
    notebooks.mkdir()
    make_notebook(notebooks / "01_ok.ipynb", "OK", [])
    make_notebook(notebooks / "02_broken.ipynb", "Broken", ["x = 1", "# divide\n1 / 0\n"])
    (out).mkdir()
    (out / "report.html").write_bytes(b"<html>previous report</html>")
    write_manifest(out, manifest_of(out, ["report.html"]))  # a previous run's: a run may replace it
    with pytest.raises(PipelineError) as info:
        run_pipeline({}, out_dir=out, notebooks_dir=notebooks, progress=False)
    kept = tmp_path / ".out.failed"
    executed = kept / "notebooks" / "02_broken.ipynb"
    assert str(info.value) == (
        "notebook 02_broken.ipynb failed at cell 4 ('# divide'): ZeroDivisionError: division by zero;"
        f" the executed notebook is kept at {executed}; {out} is left as it was (the failed run is in {kept},"
        " each kernel's own output under logs/)"
    )
    assert not isinstance(info.value, OomlabError)
    assert executed.is_file()
    assert (kept / "logs" / "02_broken.log").is_file()
    assert sorted(p.name for p in out.iterdir()) == [".oomlab-run.json", "report.html"]
    assert (out / "report.html").read_bytes() == b"<html>previous report</html>"


def test_cell_timeout_raises_pipeline_error(tmp_path: Path) -> None:
    """A cell running past cell_timeout is caught like an error, and marked in the kept notebook."""
    notebooks, out = tmp_path / "notebooks", tmp_path / "out"
    notebooks.mkdir()
    # the results cell imports oomlab (about 1 s, several under load): the timeout leaves it ten times that
    make_notebook(notebooks / "01_slow.ipynb", "Slow", ["import time\ntime.sleep(600)"])
    out.mkdir()
    (out / "report.html").write_bytes(b"old")
    write_manifest(out, manifest_of(out, ["report.html"]))
    with pytest.raises(PipelineError) as info:
        run_pipeline({}, out_dir=out, notebooks_dir=notebooks, progress=False, cell_timeout=12)
    kept = tmp_path / ".out.failed"
    executed = kept / "notebooks" / "01_slow.ipynb"
    assert str(info.value) == (
        "notebook 01_slow.ipynb failed at cell 3 ('import time'): CellTimeoutError: cell execution timed out"
        f" after 12 s; the executed notebook is kept at {executed}; {out} is left as it was (the failed run is in"
        f" {kept}, each kernel's own output under logs/)"
    )
    slow_cell = nbformat.read(executed, as_version=4).cells[-1]
    assert slow_cell.outputs[-1].ename == "CellTimeoutError"
    assert (out / "report.html").read_bytes() == b"old"


def test_notebook_without_results_fails(tmp_path: Path) -> None:
    """A notebook that does not write its results JSON fails the run, naming it."""
    notebooks, out = tmp_path / "notebooks", tmp_path / "out"
    notebooks.mkdir()
    make_notebook(notebooks / "01_quiet.ipynb", "Quiet", [], results=False)
    with pytest.raises(PipelineError, match=r"^notebook 01_quiet\.ipynb ran but wrote no results at "):
        run_pipeline({}, out_dir=out, notebooks_dir=notebooks, progress=False)


def test_no_numbered_notebooks(tmp_path: Path) -> None:
    """An empty notebooks folder is an error, not an empty report."""
    with pytest.raises(PipelineError, match=r"^no numbered notebooks \(NN_\*\.ipynb\) in "):
        run_pipeline({}, out_dir=tmp_path / "out", notebooks_dir=tmp_path, progress=False)


def test_report_that_would_fetch_fails_the_run(tmp_path: Path) -> None:
    """A report needing the network fails the run as a PipelineError and keeps the old report."""
    notebooks, out = tmp_path / "notebooks", tmp_path / "out"
    notebooks.mkdir()
    make_notebook(notebooks / "01_remote.ipynb", "Remote", ["md:![plot](https://example.com/p.png)"])
    out.mkdir()
    (out / "report.html").write_bytes(b"old")
    write_manifest(out, manifest_of(out, ["report.html"]))
    with pytest.raises(PipelineError, match=r"^rendering the report from .*01_remote\.ipynb failed: the report"):
        run_pipeline({}, out_dir=out, notebooks_dir=notebooks, progress=False)
    assert (out / "report.html").read_bytes() == b"old"


def test_dead_kernel_raises_pipeline_error(tmp_path: Path) -> None:
    """A kernel that dies mid-cell is reported like a failing cell."""
    notebooks, out = tmp_path / "notebooks", tmp_path / "out"
    notebooks.mkdir()
    make_notebook(notebooks / "01_dies.ipynb", "Dies", ["import os\nos._exit(1)"])
    with pytest.raises(PipelineError) as info:
        run_pipeline({}, out_dir=out, notebooks_dir=notebooks, progress=False, cell_timeout=30)
    assert str(info.value).startswith("notebook 01_dies.ipynb failed at cell 3 ('import os'): DeadKernelError")
    dying_cell = nbformat.read(tmp_path / ".out.failed" / "notebooks" / "01_dies.ipynb", as_version=4).cells[-1]
    assert dying_cell.outputs[-1].ename == "DeadKernelError"
