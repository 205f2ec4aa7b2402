"""Notebooks 02 and 03 (and so the report, 04) start from the user's setup, the one notebook 01 reads: the same
``notebook_launch`` call (the runner's record; by hand, the same parameters), budgeted and planned as it is
(defaults, a LoRA/FSDP2 run given by ``-p``, the Open-Assistant twin's launch files)."""

import ast
from pathlib import Path

import nbformat
import pytest

from oomlab.budget import display as br
from oomlab.core.gpus import load_gpu
from oomlab.core.paths import NOTEBOOKS_DIR
from oomlab.evidence import agreement
from oomlab.launch.user import PARAM_FIELDS
from oomlab.pipeline.params import PARAMETERS, SETUP_PATH_PARAM, notebook_launch
from oomlab.remedies.plan import plan_for
from oomlab.report import story
from oomlab.report.results import budget_results, setup_case

SETUP_NOTEBOOKS = ("01_reproduce_oom", "02_memory_budget", "03_remediations")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "open-assistant" / "seed"
CASES = {"defaults": {}, "lora-fsdp2": {"method": "lora", "strategy": "fsdp2"}, "launch-dir": {"launch_dir": FIXTURE},
         "a10g-lora": {"model": "llama-2-7b", "gpu": "a10g", "gpus": 1, "method": "lora"}}
DEFAULTS = {name: p.default for name, p in PARAMETERS.items()}


def _cells(stem: str) -> list[str]:
    nb = nbformat.read(next(NOTEBOOKS_DIR.glob(f"{stem}.ipynb")), as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _declared(stem: str) -> set[str]:
    return {node.targets[0].id for node in ast.parse(_cells(stem)[0]).body}


def _launch_call(stem: str) -> ast.Call:
    """The notebook's ``notebook_launch(...)`` call, as written in its cells."""
    for source in _cells(stem)[1:]:
        source = "\n".join(line for line in source.splitlines() if not line.startswith("%"))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "notebook_launch":
                return node
    raise AssertionError(f"{stem} does not call notebook_launch")


def _notebook_launch(stem: str, changes: dict):
    """What the notebook's own call returns, opened by hand (no setup record) with ``changes`` as its parameters
    (only the names it declares)."""
    injected = {name: DEFAULTS[name] for name in _declared(stem) if name in DEFAULTS}
    injected |= {name: str(v) if isinstance(v, Path) else v for name, v in changes.items() if name in injected}
    code = compile(ast.Expression(_launch_call(stem)), stem, "eval")
    return eval(code, {"notebook_launch": notebook_launch, **injected, SETUP_PATH_PARAM: ""})  # noqa: S307


def test_every_setup_notebook_declares_what_notebook_launch_reads() -> None:
    """A ``-p`` the runner passes to notebook 01 reaches 02 and 03 too (it injects only declared names), and the
    setup record's path reaches all three."""
    wanted = {"model", "dtype", "gpu", "launch_dir", SETUP_PATH_PARAM, *PARAM_FIELDS}
    for stem in SETUP_NOTEBOOKS:
        assert wanted <= _declared(stem), (stem, wanted - _declared(stem))


def test_the_same_call_in_every_setup_notebook() -> None:
    first = ast.dump(_launch_call(SETUP_NOTEBOOKS[0]))
    assert all(ast.dump(_launch_call(stem)) == first for stem in SETUP_NOTEBOOKS[1:])


@pytest.mark.parametrize("name", CASES)
def test_notebooks_02_03_start_from_notebook_01s_setup(name) -> None:
    """The setup 02 and 03 build equals 01's, field for field and origin for origin, and is what they budget (the
    first variant) and plan (the configured row, the knob table's baseline)."""
    launches = [_notebook_launch(stem, CASES[name]) for stem in SETUP_NOTEBOOKS]
    setup = launches[0].setup
    assert all(x.setup == setup and x.to_dict() == launches[0].to_dict() for x in launches[1:])
    label, configured = br.budget_variants(br.configured_variants(setup))[0]
    assert label.startswith("as configured") and configured.setup == setup
    if name == "launch-dir":  # the files' setup, not the parameters'
        assert (setup.strategy.value, setup.batch, setup.checkpointing) == ("zero2", 4, True)
    if name == "lora-fsdp2":
        assert (setup.strategy.value, setup.method.value) == ("fsdp2", "lora") and "LoRA" in label


@pytest.mark.parametrize("name", ["lora-fsdp2", "launch-dir"])
def test_the_plan_starts_from_the_users_setup(name) -> None:
    setup = _notebook_launch(SETUP_NOTEBOOKS[0], CASES[name]).setup
    plan = plan_for(setup, host_ram="64GiB")
    assert plan.configured.setup == setup
    assert plan.knobs and all(k.changes for k in plan.knobs)


def test_a_lora_report_says_lora_as_configured(tmp_path) -> None:
    """The results and the report of a LoRA run: its "as configured" rows are LoRA, the budget's and the plan's."""
    setup = _notebook_launch(SETUP_NOTEBOOKS[0], CASES["a10g-lora"]).setup
    variants = br.budget_variants(br.configured_variants(setup))
    committed = agreement.load_committed()
    bud = budget_results(setup_case(setup), load_gpu(setup.gpu.name), setup.gpus, 0, variants, committed,
                         agreement.worst_row(committed), {}, [])
    plan = plan_for(setup, host_ram="64GiB")
    assert bud["case"]["method"] == "lora" and bud["configured"]["method"] == "lora"
    assert "LoRA" in bud["variants"][0]["label"] and bud["variants"][0]["label"].startswith("as configured")
    r = {"budget": bud, "plan": {"configured": plan.configured.to_dict(),
                                 "remedies": [x.to_dict() for x in plan.remedies], "recommended": None}}
    first = story.remedy_bars(r)[0].label
    assert first.startswith("as configured") and "LoRA" in first, first
    assert "Full" not in first and "full fine" not in first


@pytest.mark.parametrize(("name", "replica"), [("defaults", True), ("lora-fsdp2", False)])
def test_the_answer_blames_the_move_only_for_a_launch_that_moves_a_replica(name, replica) -> None:
    """llama-13b's fp16 replica does not fit a T4; "as configured, no" only when the user's launch moves one."""
    from oomlab.report.results import reproduce_results
    from oomlab.reproduction.replay import reproduce

    launch = _notebook_launch(SETUP_NOTEBOOKS[0], CASES[name])
    setup = launch.setup
    result = reproduce(model=setup.model.name, dtype="float16", gpu=setup.gpu.name, device="simulated")
    assert result.raised
    rep = reproduce_results({"model": setup.model.name, "dtype": "float16", "gpu": setup.gpu.name}, result, result,
                            None, None, None, None, setup.gpus, None, launch.to_dict())
    variants = br.budget_variants(br.configured_variants(setup))
    committed = agreement.load_committed()
    bud = budget_results(setup_case(setup), setup.gpu, setup.gpus, 0, variants, committed,
                         agreement.worst_row(committed), {}, [])
    text = story.answer({"reproduce": rep, "budget": bud, "plan": {}})
    assert ("**As configured, no.**" in text) == replica, text
    assert ("does not move one" in text) == (not replica)
