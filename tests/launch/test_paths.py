"""The launch-path table: cited from the installed launchers, and which launches a Module._apply traceback allows."""

from oomlab.core.setup import make_setup
from oomlab.launch.paths import PATH_ROWS, LoadPath, load_path_of, path_table, paths_the_traceback_allows


def test_every_row_cites_a_line_of_the_installed_source() -> None:
    """Each row's code line is found in the installed release (a renamed line fails this test)."""
    missing = [r.path.value for r in PATH_ROWS if "line not found" in r.citation]
    assert missing == []


def test_the_apply_traceback_allows_only_full_replica_moves() -> None:
    """Module._apply -> convert -> t.to: the Trainer, accelerate and DeepSpeed's engine .to(); not zero.Init, FSDP,
    device_map or 4-bit."""
    allowed = {r.path for r in paths_the_traceback_allows()}
    assert allowed == {LoadPath.TRAINER_TO, LoadPath.ACCELERATE_TO, LoadPath.DEEPSPEED_TO}
    headers, rows = path_table()
    assert len(rows) == len(PATH_ROWS) and len(headers) == len(rows[0])


def test_load_path_of_setups() -> None:
    """Strategy, method and zero.Init choose the row."""
    def setup(**kw):
        return make_setup(model="llama-13b", gpu="t4", gpus=4, **kw)
    assert load_path_of(setup(strategy="ddp")) is LoadPath.TRAINER_TO
    assert load_path_of(setup(strategy="ddp"), hf_trainer=False) is LoadPath.ACCELERATE_TO
    assert load_path_of(setup(strategy="zero3")) is LoadPath.ZERO_INIT
    assert load_path_of(setup(strategy="zero3"), zero3_init=False) is LoadPath.DEEPSPEED_TO
    assert load_path_of(setup(strategy="fsdp")) is LoadPath.FSDP_UNITS
    assert load_path_of(setup(strategy="fsdp2", method="qlora")) is LoadPath.QUANTIZED
