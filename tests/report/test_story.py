"""The report's story: read from the results the notebooks' builders write, generic for any case, user text escaped."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
from bs4 import BeautifulSoup
from nbconvert.filters.markdown_mistune import markdown2html_mistune

from oomlab.budget.display import budget_variants, configured_variants
from oomlab.core import seed
from oomlab.core.gpus import load_gpu
from oomlab.core.paths import MODEL_SPECS_DIR
from oomlab.core.setup import make_setup
from oomlab.evidence import agreement
from oomlab.evidence.checks import verification
from oomlab.explanation.explain import explain
from oomlab.remedies.display import micro_batches
from oomlab.remedies.launch_writer import plan_launch_command, write_configs
from oomlab.remedies.plan import make_plan
from oomlab.report import story
from oomlab.report.results import budget_results, load_results, plan_results, reproduce_results, write_results
from oomlab.report.sanitize import live_markup
from oomlab.reproduction.outside import seed_outside_bytes
from oomlab.reproduction.replay import reproduce

EVIL = "<img src=x onerror=alert(1)>"


class Recorder(dict):
    """A dict that records every key read from it (``[]`` and ``.get``), nested dicts included."""

    missing: list[str]

    def __init__(self, data: dict[str, Any], path: str, missing: list[str]) -> None:
        super().__init__({k: wrap(v, f"{path}.{k}", missing) for k, v in data.items()})
        self.path, self.missing = path, missing

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            self.missing.append(f"{self.path}.{key}")
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self.missing.append(f"{self.path}.{key} (get)")
        return super().get(key, default)


def wrap(value: Any, path: str, missing: list[str]) -> Any:
    if isinstance(value, dict):
        return Recorder(value, path, missing)
    if isinstance(value, list):
        return [wrap(v, f"{path}[]", missing) for v in value]
    return value


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Any:
    """Results of notebooks 01–03 built by the builders, for llama-2-7b given as a path that holds markup."""
    root = tmp_path_factory.mktemp("case")
    folder = root / EVIL
    folder.mkdir()
    shutil.copy(MODEL_SPECS_DIR / "llama-2-7b.json", folder / "config.json")
    model = str(folder / "config.json")
    result = reproduce(model=model, gpu="a10g", device="simulated")
    fp32 = reproduce(model=model, gpu="a10g", dtype="float32", device="simulated")
    decoded = explain(result.message, model=model, gpu="a10g", dtype="float16") if result.message else None
    write_results(root / "results" / "01_reproduce_oom.json", reproduce_results(
        {"model": model, "dtype": "float16", "gpu": "a10g", "gpus": 1, "device": result.device}, result, fp32, None,
        None, decoded, "the reproduced message" if decoded else None, 1))
    variants = budget_variants(configured_variants(make_setup(model=model, gpu="a10g", gpus=1)))
    committed = agreement.load_committed()
    write_results(root / "results" / "02_memory_budget.json", budget_results(
        {"model": model, "gpu": "a10g", "gpus": 1}, load_gpu("a10g"), 1, seed_outside_bytes(), variants, committed,
        agreement.worst_row(committed), {}, []))
    plan = make_plan(model=model, gpu="a10g", gpus=1)
    written = write_configs(root / "configs", plan)
    rec = plan.recommended
    command = plan_launch_command(plan, rec, "PATH/TO/MODEL")
    write_results(root / "results" / "03_remediations.json", plan_results(
        {"model": model, "gpu": "a10g", "gpus": 1}, plan, command, root / "configs", written, plan.device_map, [],
        {"single_process": verification(("lora",), run=False)}))
    return root


STORY = ("title", "answer", "deciding_configuration", "knob_table_rows", "remedy_rows", "seed_table_rows",
         "reproduction", "honesty", "message", "decoded", "evidence_of_budget", "verification_rows", "recommended_fix",
         "config_files", "assumptions", "parameter_rows")


def test_story_reads_only_what_the_builders_write(out_dir) -> None:
    """Every key any story function reads exists in the results the builders wrote."""
    missing: list[str] = []
    results = {k: Recorder(v, k, missing) for k, v in load_results(out_dir).items()}
    for name in STORY:
        getattr(story, name)(results)
    story.plot_variants(results)
    assert missing == []


def test_user_text_is_escaped(out_dir) -> None:
    """A model path with markup reaches the report as text, not as a tag."""
    r = load_results(out_dir)
    text = story.title(r) + story.answer(r) + story.reproduction(r) + story.message(r) + story.decoded(r)
    text += "".join(story.assumptions(r)) + story.recommended_fix(r) + story.deciding_configuration(r)
    assert EVIL not in text
    html = markdown2html_mistune(story.title(r))
    assert EVIL in BeautifulSoup(html, "html.parser").get_text()  # shown as the user's characters
    assert live_markup(markdown2html_mistune(text)) == []


def test_answer_for_another_case_mentions_nothing_of_the_seed(out_dir) -> None:
    """One GPU: no pooling sentence, no seed figures."""
    r = load_results(out_dir)
    text = story.answer(r)
    assert "do not pool" not in text and "llama-13b" not in text and "T4" not in text
    assert story.seed_table_rows(r) == []


def test_results_are_json(out_dir) -> None:
    """What the builders wrote reads back as plain JSON."""
    for path in (out_dir / "results").glob("*.json"):
        assert isinstance(json.loads(path.read_text()), dict)


def test_missing_results_name_the_notebook(tmp_path) -> None:
    """Running the report before the analyses says which notebook to run."""
    with pytest.raises(FileNotFoundError, match="run notebook 01_reproduce_oom first"):
        load_results(tmp_path)


# ------------------------------------------------------------------------------------ wording and presentation


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("llama-13b", "llama-13b"),  # a shipped spec keeps its name
        ("/tmp/pytest-of-root/pytest-7/case0/my-llama/config.json", "my-llama"),  # the folder names the model
        ("/tmp/x/tiny.json", "tiny"),  # a JSON file not called config.json: its stem
    ],
)
def test_model_name_of_a_path(model: str, name: str) -> None:
    """A config.json path is shown by the model it describes, not by its (temporary) path."""
    assert story.model_name(model) == name


def test_model_name_reads_name_or_path(tmp_path) -> None:
    """A config written by save_pretrained names its model in _name_or_path."""
    folder = tmp_path / "snapshots" / "0123abcd"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"_name_or_path": "meta-llama/Llama-2-7b-hf"}))
    assert story.model_name(str(folder / "config.json")) == "meta-llama/Llama-2-7b-hf"
    assert story.model_name(str(folder)) == "meta-llama/Llama-2-7b-hf"


def test_title_names_a_custom_model(out_dir) -> None:
    """The case's model is a long temporary path; the title shows its folder's name."""
    r = load_results(out_dir)
    assert story.title(r) == "## Can \\<img src=x onerror=alert(1)\\> train on 1 × NVIDIA A10G?"
    assert str(out_dir) not in story.title(r) + story.answer(r) + story.reproduction(r)


@pytest.mark.parametrize(("max_batch", "text"), [(1, "micro-batch 1 only"), (2, "micro-batch up to 2"),
                                                 (8, "micro-batch up to 8")])
def test_micro_batches_wording(max_batch: int, text: str) -> None:
    """Never "micro-batch up to 1"."""
    assert micro_batches(max_batch) == text


def test_each_assumption_is_stated_once(out_dir) -> None:
    """No item repeats, and the memory outside PyTorch is one item (loading and training together)."""
    r = load_results(out_dir)
    items = story.assumptions(r)
    assert len(items) == len(set(items))
    outside = [item for item in items if "outside PyTorch" in item and "CUDA context" in item]
    assert len(outside) == 1, outside
    assert not any(item.startswith("outside PyTorch: ") for item in items)  # the budget's note is not repeated
    assert outside[0].count("while the model is moved") == 1 and "in training" in outside[0]


def test_shell_lines_break_only_before_options() -> None:
    """The command is continued with backslashes before an option; joined again, it is the same command."""
    command = ("accelerate launch --config_file accelerate_ddp.yaml --num_processes 4 --mixed_precision fp16 train.py "
               "--model huggyllama/llama-13b --method qlora --seq 2048 --batch 4 --checkpointing")
    text = story.shell_lines(command, width=40)
    lines = text.split(" \\\n")
    assert len(lines) > 2 and all(line.strip().startswith(("accelerate", "--")) for line in lines)
    assert " ".join(line.strip() for line in lines) == command


def test_remedy_bars_mark_the_recommended(out_dir) -> None:
    """The figure's bars are the table's rows, the recommended fix marked once."""
    r = load_results(out_dir)
    bars = story.remedy_bars(r)
    rows = story.remedy_rows(r)
    assert len(bars) >= len(rows) and bars[0].label.startswith("as configured")
    recommended = r["plan"]["recommended"]
    assert sum(b.chosen for b in bars) == (1 if recommended else 0)
    if recommended:
        chosen = next(b for b in bars if b.chosen)
        assert chosen.label.endswith(recommended["name"])
        assert chosen.per_gpu_peak_bytes == recommended["per_gpu_peak_bytes"]


def test_story_re_exports_no_headers() -> None:
    """The story imports the tables' headers and the seed rule under their own names and re-exports none of them."""
    assert not any(hasattr(story, name) for name in ("VERIFY_HEADERS", "CHECK_HEADERS", "KNOB_HEADERS",
                                                      "is_seed_figures"))
    assert story.is_seed_case is seed.is_seed_case


def test_the_accuracy_statement_cites_the_setup_class_on_real_gpus() -> None:
    """The report's accuracy claim is the published real-GPU evidence for the user's method (the margin's source),
    not the trace agreement on fake tensors (issue 22)."""
    from oomlab.core.setup import make_setup
    from oomlab.remedies.margin import margin_for

    m = margin_for(make_setup(model="llama-2-7b", gpus=1, method="lora"))
    text = story.accuracy({"plan": {"decision": {"verdict": {"margin": m.to_dict()}}}})
    assert "For lora runs" in text and m.worst_row in text and f"{m.fraction:.0%} margin" in text
    assert "MemTracker" not in text and "±" not in text


def test_a_fix_no_launch_file_runs_says_so() -> None:
    """A recommended remedy with no launch command (pure half precision: train.py trains fp32 weights) is told to be
    made in the user's own launch, not printed as an empty command."""
    r = {"plan": {"recommended": {"name": "one GPU · full fine-tuning · bf16 · adamw", "per_gpu_peak_bytes": 2**30,
                                  "host_ram_bytes": 2**30}, "outcome": "a remedy fits", "decision": None,
                  "launch_command": None, "config_dir": "configs"}}
    text = story.recommended_fix(r)
    assert "writes no launch file for this remedy" in text and "<pre>" not in text
