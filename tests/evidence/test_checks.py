"""Small-scale real runs on CPU: each mechanism's measured figure beside the analytic one."""

import pytest

from oomlab.core.units import MiB
from oomlab.evidence import checks as verify
from oomlab.instruments.gloo import WORLD_SIZE
from oomlab.remedies.verification import VERIFY_HEADERS, Check, CheckUnit, Verification, verify_rows

pytestmark = pytest.mark.heavy  # gloo processes: `pytest -m "not heavy"` leaves it out


@pytest.fixture(scope="module")
def fsdp_checks() -> list[Check]:
    return verify.check_fsdp(world_size=4, steps=2)


def test_fsdp_per_rank_states_are_a_quarter_of_ddp(fsdp_checks) -> None:
    """FSDP2 over 4 gloo ranks: each rank's weights, gradients and optimizer state equal the budget's, 1/4 of DDP's."""
    by = {(c.remedy, c.quantity.split(" ")[0]): c for c in fsdp_checks}
    for part in ("weights", "gradients", "optimizer"):
        assert by[("FSDP2 fully_shard", part)].measured == by[("FSDP2 fully_shard", part)].analytic
        assert by[("DDP (full replica)", part)].measured == by[("DDP (full replica)", part)].analytic
    ratio = next(c for c in fsdp_checks if c.unit is CheckUnit.RATIO)
    assert ratio.measured == pytest.approx(0.25, rel=0.01)


def test_fsdp_and_ddp_losses_agree(fsdp_checks) -> None:
    """fp32 FSDP2 and DDP losses agree step for step."""
    loss = next(c for c in fsdp_checks if c.unit is CheckUnit.LOSS)
    assert loss.measured < 1e-5


def test_lora_trainable_count_is_analytic() -> None:
    """peft's trainable count equals r·(in+out) per targeted projection."""
    (check,) = verify.check_lora()
    assert check.measured == check.analytic == 16384 and check.unit is CheckUnit.PARAMETERS


def test_checkpointing_saving_close_to_model() -> None:
    """Checkpointing's measured saving is within 15 % of the analytic one."""
    saving = verify.check_checkpointing()[-1]
    assert saving.ratio == pytest.approx(1.0, abs=0.15)


def test_device_map_within_max_memory() -> None:
    """accelerate places the real tiny model within max_memory; placed bytes are the real tensors'."""
    most, total = verify.check_device_map()
    assert most.measured <= most.analytic and total.measured == total.analytic


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_qlora_nf4_bytes_match_4127_bits() -> None:
    """bitsandbytes NF4 with double quantization on CPU stores about 4.127 bits per parameter, and LoRA trains."""
    (check,) = verify.check_qlora()
    assert check.measured is not None, check.note
    assert check.ratio == pytest.approx(1.0, abs=0.03)
    assert "finite True" in check.note


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_adamw_8bit_state_bytes() -> None:
    """8-bit AdamW runs on CPU here; its state is within 5 % of the budget's."""
    (check,) = verify.check_adamw_8bit()
    assert check.measured is not None, check.note
    assert check.ratio == pytest.approx(1.0, abs=0.05)


def test_flop_formula_against_flop_counter() -> None:
    """The plan's FLOPs per step vs FlopCounterMode: exact for full fine-tuning, within 5 % otherwise."""
    checks = verify.check_flops()
    assert checks[0].measured == checks[0].analytic
    assert all(c.ratio == pytest.approx(1.0, abs=0.05) for c in checks)


def test_verification_cache_round_trip(tmp_path, monkeypatch) -> None:
    """Cached results come back equal, marked as cached, with their measurement time; run=False never runs."""
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path))
    assert verify.verification(("lora",), run=False).checks == ()
    first = verify.verification(("lora",))
    second = verify.verification(("lora",))
    assert second.from_cache and not first.from_cache
    assert second.checks == first.checks and second.measured_at == first.measured_at


def test_verification_cache_honours_oomlab_cache_dir(tmp_path, monkeypatch) -> None:
    """The checks' cache lives where OOMLAB_CACHE_DIR says, like the trace cache (it once ignored the variable)."""
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path / "elsewhere"))
    verify.verification(("lora",))
    assert [p.name.startswith("verify-") for p in (tmp_path / "elsewhere").iterdir()] == [True]


@pytest.mark.parametrize(("unit", "measured", "analytic", "shown"), [
    (CheckUnit.BYTES, 3 * MiB, 3 * MiB + 1, ("3.00 MiB", "3.00 MiB")),  # as torch prints sizes
    (CheckUnit.PARAMETERS, 16384, 16384, ("16,384", "16,384")),  # counts with separators
    (CheckUnit.FLOPS, 1.5e9, 1.5e9, ("1,500,000,000", "1,500,000,000")),
    (CheckUnit.RATIO, 0.25, 0.25, ("0.25", "0.25")),  # dimensionless: three digits
    (CheckUnit.LOSS, 1.2345e-7, 0.0, ("1.23e-07", "0")),
    (CheckUnit.BYTES, None, 3 * MiB, ("-", "3.00 MiB")),  # did not run here
])
def test_rows_show_each_unit(unit: CheckUnit, measured: float | None, analytic: float, shown: tuple) -> None:
    """Each unit has its display; the row keeps the check's order (remedy, quantity, measured, analytic, ratio)."""
    (row,) = verify_rows(Verification((Check("r", "q", measured, analytic, unit),), "t", False, ()))
    assert row[2:4] == shown


def test_check_round_trips_its_unit() -> None:
    """The results JSON holds the unit's value; reading it back gives the member, and an unknown unit is refused."""
    check = Check("peft LoRA", "trainable parameters", 16384, 16384, CheckUnit.PARAMETERS, note="n", seconds=1.5)
    assert check.to_dict()["unit"] == "parameters" and Check.from_dict(check.to_dict()) == check
    with pytest.raises(ValueError, match="'GB' is not a valid CheckUnit"):
        Check.from_dict({**check.to_dict(), "unit": "GB"})


def test_records_live_in_verification_only() -> None:
    """checks runs the checks and exports only them: the records, their rows and the gloo world size are read from
    their own modules (oomlab.remedies.verification, oomlab.instruments.gloo), not re-exported for old import paths."""
    assert set(verify.__all__).isdisjoint({"Check", "CheckUnit", "Verification", "VERIFY_HEADERS", "verify_rows",
                                           "WORLD_SIZE"})
    assert not hasattr(verify, "VERIFY_HEADERS") and not hasattr(verify, "verify_rows")
    assert all(hasattr(verify, name) for name in verify.__all__)
    assert (VERIFY_HEADERS[0], WORLD_SIZE) == ("remedy", 4)
    assert set(verify.FAST) | {"fsdp"} == set(verify.CHECKS)
