"""``check --message``: the user's OOM message set against the budget of the launch as read (issue 22)."""

from pathlib import Path

import pytest

from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import Phase
from oomlab.core.units import format_size
from oomlab.launch.check import check
from oomlab.launch.inputs import check_inputs
from oomlab.launch.message import read_message
from oomlab.launch.resolve import read_launch

BACKWARD = ('  File "/usr/lib/python3.10/site-packages/torch/autograd/__init__.py", line 200, in backward\n'
            '    Variable._execution_engine.run_backward(\n')
OPTIMIZER = ('  File "/usr/lib/python3.10/site-packages/torch/optim/adamw.py", line 184, in step\n'
             '    adamw(\n')


def _message(frames: str, allocated: int, total: int, tried: int = 512 * 2**20) -> str:
    return (f"Traceback (most recent call last):\n  File \"train.py\", line 88, in <module>\n    trainer.train()\n"
            f"{frames}torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {format_size(tried)} "
            f"(GPU 0; {format_size(total)} total capacity; {format_size(allocated)} already allocated; 20.00 MiB "
            f"free; {format_size(allocated + 2**28)} reserved in total by PyTorch)\n")


def _launch(command: str, model: str = "llama-3.2-1b", gpu: str = "a100-80gb"):
    return read_launch(check_inputs(launch=command, model=model, gpu=gpu))


def test_a_message_on_the_way_to_the_predicted_peak_is_consistent() -> None:
    launch = _launch("python train.py --bf16 --per_device_train_batch_size 1 --max_seq_length 2048")
    peak = sum(estimate_setup(launch.setup).phases[Phase.BACKWARD].values())
    reading, _ = read_message(launch, _message(BACKWARD, peak // 2, launch.setup.gpu.total_memory_bytes))
    assert reading.phase is Phase.BACKWARD and not reading.differs
    assert "consistent with the launch as read" in reading.sentence


def test_a_phase_the_setup_cannot_reach_means_the_run_differed() -> None:
    """The message died in the AdamW step; the setup as read would already fail earlier: the run differed."""
    launch = _launch("python train.py --bf16 --per_device_train_batch_size 8", model="qwen2.5-0.5b", gpu="a10g")
    reading, _ = read_message(launch, _message(OPTIMIZER, 21 * 2**30, launch.setup.gpu.total_memory_bytes))
    assert reading.phase is Phase.OPTIMIZER and reading.differs
    assert "would already fail in the forward phase" in reading.sentence and "differed" in reading.sentence


def test_an_open_sequence_length_is_inferred_from_the_figures() -> None:
    """No length in the launch (assumed 2048): a message needing the budget of 8192 tokens names the length that
    explains it; a length the command states is never inferred."""
    open_seq = _launch("python train.py --bf16 --per_device_train_batch_size 1")
    assert open_seq.fields["seq"].origin.kind.value == "assumed"
    need = sum(estimate_setup(open_seq.setup.with_(seq=8192)).phases[Phase.BACKWARD].values())
    text = _message(BACKWARD, need - 2**30, open_seq.setup.gpu.total_memory_bytes, tried=2**30)
    reading, _ = read_message(open_seq, text)
    assert reading.differs and dict(reading.inferred) == {"seq": 8192}
    assert "seq 8192 or more (assumed 2048)" in reading.sentence
    stated = _launch("python train.py --bf16 --per_device_train_batch_size 1 --max_seq_length 2048")
    assert read_message(stated, text)[0].inferred == ()


def test_check_reads_the_message_file(tmp_path: Path) -> None:
    """``check(message=FILE)`` reads the file within the user-input bounds and carries the reading into its JSON;
    a missing file is refused naming it."""
    launch = "python train.py --bf16 --per_device_train_batch_size 8"
    path = tmp_path / "oom.txt"
    path.write_text(_message(OPTIMIZER, 21 * 2**30, 23_836_033_024))
    result = check(launch=launch, model="qwen2.5-0.5b", gpu="a10g", message=str(path))
    assert result.message is not None and result.to_dict()["message"]["differs"] is True
    with pytest.raises(Exception, match="nope.txt"):
        check(launch=launch, model="qwen2.5-0.5b", gpu="a10g", message=str(tmp_path / "nope.txt"))
