"""The knob table: typed knob values, rows that carry the changed setup and route, and text made for display only."""

from oomlab.core.choices import Method, Optimizer, Precision, Route, Strategy
from oomlab.core.setup import make_setup
from oomlab.remedies.display import knob_change_text
from oomlab.remedies.knobs import KNOB_VALUES, KnobChange, knob_table

HOST = 64 * 2**30


def test_knob_values_are_members_not_names() -> None:
    """Every knob value is the setup field's own type (a member, a bool, an int); device_map is the Route member,
    never a pseudo-strategy name."""
    kinds = {"strategy": (Strategy, Route), "method": Method, "precision": Precision, "optimizer": Optimizer,
             "checkpointing": bool, "seq": int}
    for knob, values in KNOB_VALUES.items():
        assert all(isinstance(v, kinds[knob]) for v in values), knob
    assert Route.DEVICE_MAP in KNOB_VALUES["strategy"]
    assert not any(isinstance(v, str) for values in KNOB_VALUES.values() for v in values)


def test_rows_carry_setup_and_route_and_show_the_names() -> None:
    """Each evaluated row holds the setup it budgets and its route; its text is the names users type."""
    base = make_setup(model="llama-13b", gpu="t4", gpus=4)
    rows = knob_table(base, HOST)
    by_text = {knob_change_text(r): r for r in rows}
    dm = by_text["strategy → device-map"]
    assert dm.route is Route.DEVICE_MAP and dm.setup.strategy is Strategy.SINGLE
    z3 = by_text["strategy → zero3-offload"]
    assert z3.route is Route.PROCESS_PER_GPU and z3.setup.strategy is Strategy.ZERO3_OFFLOAD
    ckpt = by_text["checkpointing → true"]
    assert ckpt.setup.checkpointing is True and ckpt.setup.with_(checkpointing=False) == base
    assert by_text["precision → fp16"].setup.precision is Precision.FP16
    for r in rows:
        assert (r.setup is None) == r.reason.startswith("dropped:")
        if r.setup is not None:
            assert r.route in (Route.PROCESS_PER_GPU, Route.DEVICE_MAP)


def test_one_gpu_has_no_multi_gpu_layouts() -> None:
    """On one GPU the sharded strategies and device_map are the single run: not offered."""
    rows = knob_table(make_setup(model="llama-2-7b", gpu="a10g", gpus=1), HOST)
    strategies = {r.setup.strategy for r in rows if r.setup is not None and r.changes[0][0] == "strategy"}
    assert strategies <= {Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD, Strategy.FSDP_OFFLOAD,
                          Strategy.FSDP2_OFFLOAD}
    assert all(r.route is not Route.DEVICE_MAP for r in rows)


def test_json_keeps_the_text_and_reads_back_without_a_setup() -> None:
    """to_dict writes the text only; from_dict gives the same row (text and figures), with no setup to act on."""
    rows = knob_table(make_setup(model="llama-13b", gpu="t4", gpus=4), HOST)
    for r in rows[:6]:
        back = KnobChange.from_dict(r.to_dict())
        assert back == r and back.setup is None and back.route is None
        assert "setup" not in r.to_dict() and all(isinstance(v, str) for _, v in r.to_dict()["changes"])
