"""oomlab.explanation.explain and `python -m oomlab explain`: what a CUDA OOM message supports, the seed's above all."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomlab.cli import main
from oomlab.core import paths
from oomlab.core.errors import NotAnOomMessageError, OomlabError
from oomlab.core.seed import seed_report_text
from oomlab.core.units import MiB, format_size
from oomlab.explanation.anomalies import AnomalyCode
from oomlab.explanation.display import render_explanation
from oomlab.explanation.explain import explain
from oomlab.explanation.phase import PhaseCode
from oomlab.explanation.printed import printed_size
from oomlab.explanation.request import request_range
from oomlab.explanation.torch_versions import load_module_lines, match_torch_versions
from oomlab.reproduction.allocator import get_allocation_size, round_size
from oomlab.reproduction.outside import seed_outside_bytes
from oomlab.reproduction.walk import TensorKind

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "real_oom_messages.json").read_text())
IDS = [f"{i}-{c['source'].split('github.com/')[1]}" for i, c in enumerate(FIXTURES)]
SEED_REPORT = paths.SEED_REPORT


@pytest.fixture(scope="module")
def seed():
    return explain(seed_report_text(), model="llama-13b")


# ---------------------------------------------------------------------------------------- the seed


def test_seed_json_figures(seed) -> None:
    """--json keys of the old format, in bytes with their intervals; GPU 0; a T4's capacity."""
    data = seed.to_dict()
    assert data["format"] == "torch<=2.0" and data["device_index"] == 0
    assert data["tried_bytes"] == 142606336 and data["tried_interval"] == [142601094, 142611578]
    assert data["total_interval"] == [15832323195, 15843060613]
    assert data["allocated_interval"] == data["reserved_interval"] == [15198815519, 15209552936]
    assert data["free_interval"] == [42787144, 42797629]
    assert data["reserved_derived"] is False and data["missing"] == [] and data["anomalies"] == []
    assert data["gpu_matches"] == ["t4"]


def test_seed_request_is_one_tensor_of_134_to_136_mib(seed) -> None:
    """136.00 MiB is a segment: the tensor lies in (134 MiB, 136 MiB]."""
    assert seed.to_dict()["request_range"] == [[134 * MiB + 1, 136 * MiB]]


def test_seed_is_not_fragmentation(seed) -> None:
    """Reserved − allocated is at most 10.24 MiB, less than the request: the hint cannot help."""
    assert seed.fragmentation == (0, 10737417) and seed.hint_can_help is False
    assert "fragmentation is not the cause, and the message's hint (max_split_size_mb) cannot help" in seed.verdict


def test_seed_outside_memory_is_a_cuda_context(seed) -> None:
    """total − free − reserved: 553–574 MiB, holding the 561 MiB the reproduction derived; not flagged."""
    low, high = seed.outside
    assert format_size(low) == "553.11 MiB" and format_size(high) == "573.59 MiB"
    assert low <= seed_outside_bytes() <= high
    assert "the size of a CUDA context" in seed.verdict


def test_seed_candidates_are_the_mlp_projections_in_two_bytes(seed) -> None:
    """13824 × 5120 (gate/up) and 5120 × 13824 (down) in float16/bfloat16; gate/up in float16 ranked first."""
    top = seed.candidates[0]
    assert (top.shape, top.dtype, top.count, top.tensor_bytes) == ((13824, 5120), "float16", 80, 141557760)
    assert top.kind is TensorKind.PARAMETER and "80 such parameters" in seed.verdict
    assert top.roles == ("model.layers.N.mlp.gate_proj.weight", "model.layers.N.mlp.up_proj.weight")
    assert {(c.shape, c.dtype) for c in seed.candidates} == {
        ((13824, 5120), "float16"), ((13824, 5120), "bfloat16"), ((5120, 13824), "float16"),
        ((5120, 13824), "bfloat16")}
    assert any("no native bfloat16" in ev for ev in seed.candidates[1].evidence)
    assert "In float32 the same tensor would ask for 270.00 MiB." in seed.verdict


def test_seed_walk_position(seed) -> None:
    """The _apply replay: just before layer 23's gate_proj of 40 layers, 58.1 % moved; 24.24 GiB does not fit."""
    w = seed.walk
    assert (w.matched, w.dtype, w.tensor, w.layer, w.num_layers) == (
        True, "float16", "model.layers.23.mlp.gate_proj.weight", 23, 40)
    assert 0.58 < w.moved_fraction < 0.59 and w.also_matching == 0
    assert format_size(w.model_bytes) == "24.24 GiB" and w.fits is False
    assert "just before model.layers.23.mlp.gate_proj.weight (layer 23 of 40, 0-based)" in seed.verdict
    assert "after 58.1% of the parameters moved" in seed.verdict
    assert "24.24 GiB of tensors" in seed.verdict and "cannot fit this GPU in float16" in seed.verdict


def test_seed_phase_and_torch_version(seed) -> None:
    """Module.to → _apply → convert: moving, not training; 797/820/1143/1145 match torch 2.0.0 and 2.0.1 only."""
    assert seed.phase.code is PhaseCode.MOVE
    assert seed.torch_versions == ("2.0.0", "2.0.1")
    assert {("apply_recurse", 797), ("param_applied", 820), ("convert", 1143), ("to_return", 1145)} <= set(
        seed.version_observations)
    assert "match torch 2.0.0 and 2.0.1 only" in seed.verdict


def test_seed_cli_json() -> None:
    """`python -m oomlab explain --file … --model llama-13b --json` prints the same fields."""
    proc = subprocess.run([sys.executable, "-m", "oomlab", "explain", "--file", str(SEED_REPORT), "--model",
                           "llama-13b", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    for key in ("format", "device_index", "tried_bytes", "total_bytes", "free_bytes", "allocated_bytes",
                "reserved_bytes", "request_range", "fragmentation_bytes", "outside_pytorch_bytes", "anomalies",
                "candidates", "walk", "torch_versions", "verdict", "tried_interval", "reserved_interval"):
        assert key in data, key
    assert data["walk"]["tensor"] == "model.layers.23.mlp.gate_proj.weight"
    assert data["torch_versions"] == ["2.0.0", "2.0.1"]


# ------------------------------------------------------------------------------------ the request


@pytest.mark.parametrize(
    ("printed", "ranges"),
    [
        ("2.00 MiB", [(1, MiB)]),  # the small pool: anything up to 1 MiB
        ("20.00 MiB", [(MiB + 1, 10 * MiB - 512), (18 * MiB + 1, 20 * MiB)]),  # kLargeBuffer, or a 20 MiB tensor
        ("10.00 MiB", [(10 * MiB - 511, 10 * MiB)]),  # only a request rounding to exactly kMinLargeAlloc
        ("12.00 MiB", [(10 * MiB + 1, 12 * MiB)]),
        ("136.00 MiB", [(134 * MiB + 1, 136 * MiB)]),
        # no segment prints as 12.50 MiB (torch < 1.5 printed the request): the printed interval itself,
        # 12.5 MiB ± 0.005 MiB = 13,107,200 ± 5,242.88, rounded inwards to whole bytes
        ("12.50 MiB", [(13_101_958, 13_112_442)]),
    ],
)
def test_request_range(printed: str, ranges: list) -> None:
    """The request sizes whose segment prints as the "Tried to allocate"."""
    number, unit = printed.split()
    assert [tuple(r) for r in request_range(printed_size(number, unit))] == ranges


@given(st.integers(1, 64 * 1024 * MiB))
def test_request_range_holds_the_request(nbytes: int) -> None:
    """For any request, the range read back from its printed segment holds it."""
    number, unit = format_size(get_allocation_size(round_size(nbytes))).split()
    assert any(lo <= nbytes <= hi for lo, hi in request_range(printed_size(number, unit)))


def test_small_segment_verdict() -> None:
    """A 2.00 MiB failure is many small tensors, not one big one."""
    result = explain(FIXTURES[1]["text"])
    assert "many small tensors (the small pool), not one big one" in result.verdict


# ----------------------------------------------------------------------------------- real messages


@pytest.mark.parametrize("case", FIXTURES, ids=IDS)
def test_real_message_explained(case: dict) -> None:
    """Each verbatim message: expected anomalies, hint verdict, versions, phase, this process and verdict phrases."""
    result = explain(case["text"], gpu=case.get("gpu"))
    expected = case["expected"]
    codes = [a.code.value for a in result.anomalies]
    for code in expected.get("anomalies", []):
        assert code in codes
    for code in expected.get("absent_anomalies", []):
        assert code not in codes
    if "hint_can_help" in expected:
        assert result.hint_can_help is expected["hint_can_help"]
    assert list(result.torch_versions) == expected.get("torch_versions", [])
    assert (result.phase.code.value if result.phase else None) == expected.get("phase")
    if "this_process" in expected:
        acc = result.processes
        got = None if acc.in_use is None else [acc.pid, acc.in_use.text, acc.basis.value]
        assert got == expected["this_process"]
    assert [p.pid for p in result.processes.candidates] == expected.get("this_process_candidates", [])
    assert list(result.processes.ambiguous) == expected.get("ambiguous", [])
    for phrase in expected.get("verdict_includes", []):
        assert phrase in result.verdict
    for phrase in expected.get("verdict_excludes", []):
        assert phrase not in result.verdict
    assert result.verdict and json.dumps(result.to_dict())


def test_fragmentation_case() -> None:
    """12.53 GiB reserved, 1.06 GiB allocated, 10.84 GiB asked: the cache could hold it; the hint can help."""
    result = explain(next(c["text"] for c in FIXTURES if "35901" in c["source"]))
    assert result.hint_can_help is True
    assert "the cache is fragmented" in result.verdict and "would have fitted" in result.verdict


def test_outside_split_in_new_format() -> None:
    """'this process has U in use': outside splits into own non-PyTorch memory and other processes."""
    result = explain(next(c["text"] for c in FIXTURES if "111363" in c["source"]))
    data = result.to_dict()
    own, others = data["non_pytorch_this_process_interval"], data["other_processes_interval"]
    assert format_size(own[0]).endswith("GiB") and others[0] == 0
    assert "outside_large" in [a["code"] for a in data["anomalies"]]


def test_request_above_total_and_overflow() -> None:
    """A 16 EiB request: larger than the GPU, and flagged as an overflowing size computation."""
    result = explain(next(c["text"] for c in FIXTURES if "33143" in c["source"]))
    text = next(a.text for a in result.anomalies if a.code is AnomalyCode.REQUEST_ABOVE_TOTAL)
    assert "overflowing or negative size" in text


def _fixture(part: str) -> str:
    return next(c["text"] for c in FIXTURES if part in c["source"])


def test_unreadable_request_is_named_not_cut_off() -> None:
    """'Tried to allocate banana MiB' before readable figures: the verdict names the figure as unreadable and never
    says 'cut off'."""
    result = explain("CUDA out of memory. Tried to allocate banana MiB (GPU 0; 14.75 GiB total capacity; 14.16 GiB "
                     "already allocated; 40.81 MiB free; 14.16 GiB reserved in total by PyTorch)")
    assert ("The 'Tried to allocate' figure reads 'banana MiB', which is unreadable: not a size as torch prints it "
            "(a number with two decimals and bytes, KiB, MiB or GiB)") in result.verdict
    assert "cut off" not in result.verdict
    assert AnomalyCode.UNREADABLE in [a.code for a in result.anomalies]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # exited 0 before, while a bare "CUDA out of memory." exited 2: one rule now
        ("CUDA out of memory. Tried to allocate banana MiB (GPU x; total capacity;",
         "an out-of-memory message with no readable figure: where sizes should stand it has tried 'banana MiB'; "
         "expected sizes as torch prints them ('136.00 MiB', '14.75 GiB') after 'Tried to allocate'"),
        ("CUDA out of memory. Tried to allocate banana MiB", "with no readable figure: where sizes should stand it "
         "has tried 'banana MiB'"),
        ("DefaultCPUAllocator: not enough memory: you tried to allocate many bytes.", "it has tried 'many bytes'"),
        ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allo",
         "an out-of-memory message cut off before its first figure ('CUDA out of memory. Tried to allo'); expected"),
        ("CUDA out of memory. Tried to allocate 136.0", "cut off before its first figure"),  # cut inside the number
        ("CUDA out of memory.", "a bare 'CUDA out of memory.' with no figures"),  # the same rule, said by the parser
    ],
    ids=["garbled", "banana-alone", "cpu-garbled", "cut-words", "cut-number", "bare"],
)
def test_message_without_a_readable_figure_is_refused(text: str, message: str) -> None:
    """A message from which no figure can be read -- bare, cut before its first figure or garbled -- is refused with
    NotAnOomMessageError (the CLI's exit 2) naming what stands there and what was expected."""
    with pytest.raises(NotAnOomMessageError) as info:
        explain(text)
    assert message in str(info.value)


def test_one_readable_figure_is_enough() -> None:
    """A message cut after its request still has a figure: explained, said to be cut off."""
    result = explain("CUDA out of memory. Tried to allocate 20.00 MiB")
    assert result.message.tried.text == "20.00 MiB" and "cut off" in result.verdict


def test_unreadable_figure_leaves_the_others_read() -> None:
    """An unreadable allocated figure: named, and the request, free and reserved still explained."""
    result = explain("CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; lots already "
                     "allocated; 40.81 MiB free; 14.16 GiB reserved in total by PyTorch)")
    assert "The allocated figure reads 'lots', which is unreadable" in result.verdict
    assert "Only 40.81 MiB was free" in result.verdict and result.gpu_matches == ("t4",)


@pytest.mark.parametrize(
    ("backend", "malloc", "context", "absent"),
    [
        ("CUDA", "cudaMalloc", "a CUDA context", ("hipMalloc", "HIP runtime")),
        ("HIP", "hipMalloc", "a HIP runtime context", ("cudaMalloc", "CUDA context")),
    ],
)
def test_verdict_speaks_the_backends_runtime(backend: str, malloc: str, context: str, absent: tuple) -> None:
    """The seed's figures as a CUDA and as a ROCm message: the segment is asked of that runtime's malloc."""
    text = seed_report_text().replace("CUDA out of memory", f"{backend} out of memory")
    verdict = explain(text).verdict
    assert f"is the segment asked of {malloc}" in verdict and f"the size of {context}" in verdict
    for word in absent:
        assert word not in verdict


@pytest.mark.parametrize(
    ("source", "head", "can_tell"),
    [
        ("ComfyUI/issues/7372", "An MPS (Apple silicon GPU, Metal) out-of-memory message of PyTorch's MPS heap "
         "allocator", "What oomlab can tell from an MPS message"),
        ("mxfold2/issues/20", "A CPU out-of-memory message of PyTorch's DefaultCPUAllocator: host RAM ran out",
         "What oomlab can tell from a CPU message"),
        ("torch-xpu-ops/issues/3011", "An XPU (Intel GPU) out-of-memory message of PyTorch's XPU caching allocator",
         "What oomlab can tell from an XPU message"),
        ("TheRock/issues/1054", "A HIP (ROCm) out-of-memory message of PyTorch's caching allocator, hipified",
         "What oomlab can tell from a ROCm message"),
    ],
)
def test_other_backends_say_which_and_what_oomlab_can_tell(source: str, head: str, can_tell: str) -> None:
    """MPS, CPU, XPU and ROCm messages: the verdict opens with the backend and says what oomlab can and cannot tell."""
    verdict = explain(_fixture(source)).verdict
    assert verdict.startswith(head) and can_tell in verdict and "What it cannot:" in verdict
    assert "paste the error's last lines" not in verdict


# 136.00 MiB is the CUDA segment of llama-13b's 13824 × 5120 float16 projections: read as CUDA's, it would name them
_MPS_136 = ("MPS backend out of memory (MPS allocated: 14.16 GiB, other allocations: 1.00 GiB, max allowed: 15.00 GiB)"
            ". Tried to allocate 136.00 MiB on private pool.")
_CPU_136 = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 142606336 bytes. Error code 12 (Cannot " \
           "allocate memory)"


@pytest.mark.parametrize("text", [_fixture("ComfyUI/issues/7372"), _fixture("mxfold2/issues/20"), _MPS_136, _CPU_136])
def test_mps_and_cpu_make_no_cuda_readings(text: str) -> None:
    """With --model, an MPS or CPU message gets no segment candidates, no _apply walk and no GPU match."""
    result = explain(text, model="llama-13b")
    assert (result.candidates, result.walk, result.gpu_matches) == ((), None, ())
    assert "Give --model" not in result.verdict


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        (_fixture("mxfold2/issues/20"), 132426121216),
        (_CPU_136, 142606336),  # a multiple of 2 MiB: as a CUDA segment it would stand for (134 MiB, 136 MiB]
    ],
)
def test_cpu_request_is_exact(text: str, nbytes: int) -> None:
    """The CPU allocator's request is the tensor's exact byte count: a one-value request range."""
    assert explain(text).request_range == ((nbytes, nbytes),)


def test_gpu_given_for_another_backend_is_flagged() -> None:
    """--gpu t4 with an MPS message: a backend_mismatch anomaly, and no NVIDIA capacity comparison."""
    codes = [a.code.value for a in explain(_fixture("ComfyUI/issues/7372"), gpu="t4").anomalies]
    assert "backend_mismatch" in codes and "gpu_mismatch" not in codes


def test_several_processes_name_the_ambiguous_figures() -> None:
    """Four processes, none 'this process': the JSON and the verdict say which figures are ambiguous."""
    result = explain(_fixture("cosmos-predict2"))
    data = result.to_dict()
    assert (data["this_process"], data["ambiguous_figures"]) == (None, ["in_use", "non_pytorch", "other_processes"])
    assert data["non_pytorch_this_process_interval"] is None and data["other_processes_interval"] is None
    assert "so its memory in use, its memory outside PyTorch and the other processes' share are ambiguous" in (
        result.verdict)


def test_one_listed_process_is_this_one() -> None:
    """One 'Process N' line and no 'this process' line: its memory is this process's, split around PyTorch's."""
    data = explain(_fixture("dots.ocr/issues/196")).to_dict()
    assert data["this_process"] == {"pid": 2684311, "basis": "only-one-listed", "in_use_bytes": 15579993866,
                                    "in_use_interval": [15574625158, 15585362575], "in_use_printed": "14.51 GiB"}
    own = data["non_pytorch_this_process_interval"]
    assert format_size(own[0]) == "346.48 MiB" and format_size(own[1]) == "366.96 MiB"


@pytest.mark.parametrize("case", FIXTURES, ids=IDS)
def test_every_verdict_ends_with_the_next_step(case: dict) -> None:
    """The verdict's last paragraph is the next command, the same one the JSON carries."""
    result = explain(case["text"])
    last = result.verdict.split("\n\n")[-1]
    assert last.startswith(f"Next step: {result.to_dict()['next_step']} — ")


# ------------------------------------------------------------------------------------------ phases


@pytest.mark.parametrize(
    ("trace", "phase"),
    [
        ('  File "train.py", line 40, in <module>\n    loss.backward()\n'
         '  File "/x/torch/_tensor.py", line 487, in backward\n    torch.autograd.backward(\n', PhaseCode.BACKWARD),
        ('  File "train.py", line 41, in <module>\n    optimizer.step()\n'
         '  File "/x/torch/optim/adamw.py", line 184, in step\n    adamw(\n', PhaseCode.OPTIMIZER),
        ('  File "run.py", line 9, in <module>\n    out = model(x)\n'
         '  File "/x/torch/nn/modules/module.py", line 1501, in _call_impl\n    return forward_call(*args)\n'
         '  File "/x/transformers/models/llama/modeling_llama.py", line 80, in forward\n    h = self.up(x)\n',
         PhaseCode.FORWARD),
        ('  File "/x/accelerate/utils/modeling.py", line 300, in set_module_tensor_to_device\n'
         '    new_value = value.to(device)\n', PhaseCode.LOAD),
    ],
)
def test_phase_from_frames(trace: str, phase: PhaseCode) -> None:
    """Backward, optimizer step, forward and weight loading are told apart by their frames."""
    result = explain(trace + FIXTURES[0]["text"])
    assert result.phase.code is phase and result.walk is None


# ---------------------------------------------------------------------------------- version table


def test_version_table_rows() -> None:
    """Releases 1.13.0–2.14.1 verified from their wheels; 2.15.0 listed unverified, without guessed lines."""
    rows = {r.version: r for r in load_module_lines()}
    assert list(rows)[0] == "1.13.0" and "2.14.1" in rows
    for row in rows.values():
        lines = (row.apply_recurse, row.param_applied, row.convert_return, row.convert_return_memory_format,
                 row.to_return)
        if row.verified:
            assert all(isinstance(n, int) for n in lines) and "sha256" in row.source
        else:
            assert all(n is None for n in lines) and "not verified" in row.source
    assert not rows["2.15.0"].verified
    assert (rows["2.0.1"].apply_recurse, rows["2.0.1"].param_applied, rows["2.0.1"].convert_return,
            rows["2.0.1"].to_return) == (797, 820, 1143, 1145)


def _installed_module_lines() -> tuple[int, int, int, int]:
    import torch.nn.modules.module as module_py

    tree = ast.parse(Path(module_py.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Module")
    funcs = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef) and not f.decorator_list}
    apply_, to = funcs["_apply"], funcs["to"]
    recurse = next(n.lineno for n in ast.walk(apply_) if isinstance(n, ast.Expr)
                   and ast.unparse(n) == "module._apply(fn)")
    param = next(n.lineno for n in ast.walk(apply_) if isinstance(n, ast.Assign)
                 and ast.unparse(n) == "param_applied = fn(param)")
    convert = next(n for n in ast.walk(to) if isinstance(n, ast.FunctionDef) and n.name == "convert")
    plain = next(n.lineno for n in ast.walk(convert) if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)
                 and not any(k.arg == "memory_format" for k in n.value.keywords))
    ret = next(n.lineno for n in to.body if isinstance(n, ast.Return))
    return recurse, param, plain, ret


def test_table_matches_the_installed_torch() -> None:
    """Measured: the installed torch's module.py lines equal its release's row in the table."""
    import torch

    version = torch.__version__.split("+")[0]
    row = next(r for r in load_module_lines() if r.version == version)
    assert _installed_module_lines() == (row.apply_recurse, row.param_applied, row.convert_return, row.to_return)


def test_each_row_matches_itself_only_with_identical_rows() -> None:
    """Every verified row's own four lines select exactly the releases with the same four lines."""
    rows = [r for r in load_module_lines() if r.verified]
    for row in rows:
        obs = (("apply_recurse", row.apply_recurse), ("param_applied", row.param_applied),
               ("convert", row.convert_return), ("to_return", row.to_return))
        same = tuple(r.version for r in rows if (r.apply_recurse, r.param_applied, r.convert_return, r.to_return)
                     == (row.apply_recurse, row.param_applied, row.convert_return, row.to_return))
        assert match_torch_versions(obs) == same


def test_no_line_numbers_no_versions() -> None:
    """A bare message names no torch release."""
    assert explain(FIXTURES[0]["text"]).torch_versions == ()


# ------------------------------------------------------------------------------------------- CLI


def test_cli_text_output(capsys) -> None:
    """The human output: figures with byte intervals, then the verdict."""
    assert main(["explain", FIXTURES[0]["text"]]) == 0
    out = capsys.readouterr().out
    assert "tried to allocate      50.00 MiB  [52,423,558 – 52,434,042 bytes]" in out
    assert "Give --model to name the tensors" in out


def test_cli_reads_stdin() -> None:
    """'-' reads the message from standard input."""
    proc = subprocess.run([sys.executable, "-m", "oomlab", "explain", "-", "--json"], input=FIXTURES[2]["text"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["format"] == "torch>=2.1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["explain", "hello world"], "python -m oomlab explain: error: not a CUDA out-of-memory message: no 'CUDA out "
                                     "of memory. Tried to allocate …' in the input (11 characters)"),
        (["explain", "--model", "llama-14b", "x"], "unknown model 'llama-14b'; known: falcon-7b, gemma-2-27b"),
        (["explain", "--gpu", "h9000", "x"], "unknown GPU 'h9000'; known: a100-40gb"),
        (["explain", "--dtype", "float8", "x"], "unknown dtype 'float8'"),
        (["explain", "--file", "/nonexistent/oom.txt"], "--file '/nonexistent/oom.txt': file not found"),
        (["explain", "x", "--file", "y"], "give the message as TEXT or --file, not both"),
        # the bare message: the first words of the error and nothing else
        (["explain", "CUDA out of memory."], "python -m oomlab explain: error: a bare 'CUDA out of memory.' with no "
                                             "figures: the input has the error's first words but not 'Tried to "
                                             "allocate …'"),
    ],
)
def test_cli_bad_input_exits_2(args: list[str], message: str, capsys) -> None:
    """Not an OOM message, unknown names, unreadable files: exit 2 with the reason."""
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_render_without_model() -> None:
    """render_explanation works on a cut message with no figures beyond the request."""
    out = render_explanation(explain("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert "format                 unknown" in out and "The message is cut off" in out


# -------------------------------------------------------------------------------------------- fuzz

_SEEDS = [c["text"] for c in FIXTURES] + [seed_report_text()[-3000:]]
_NOISE = st.text(alphabet=st.characters(codec="utf-8"), max_size=60) | st.sampled_from(
    ["CUDA out of memory.", " Tried to allocate ", "(GPU ", "; ", " GiB", " MiB", "0 bytes", "999999999999.99",
     "-1", "\n", "│ ❱ 797 │", 'File "x/torch/nn/modules/module.py", line 1143, in convert\n', " is free. ",
     "Of the allocated memory ", " reserved in total by PyTorch)", "Process 1 has ", ".", "total capacty of "])


@st.composite
def fuzz_inputs(draw: st.DrawFn) -> str | bytes:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.text(max_size=400))
    if kind == 1:
        return draw(st.binary(max_size=400))
    text = draw(st.sampled_from(_SEEDS))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.integers(0, 4))
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 200)))
        if op == 0:
            text = text[:i] + text[j:]  # delete
        elif op == 1:
            text = text[:j] + text[i:j] + text[j:]  # duplicate
        elif op == 2:
            text = text[:i] + draw(_NOISE) + text[i:]  # insert
        elif op == 3:
            text = text[:i]  # truncate
        else:
            text = text[:i] + text[i:j][::-1] + text[j:]  # scramble
    if kind == 5:
        text = text * draw(st.integers(1, 3_000))  # up to megabytes
    return text


@pytest.mark.heavy
@settings(max_examples=2_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(fuzz_inputs())
def test_fuzz_never_raises_anything_else(text: str | bytes) -> None:
    """2,000 generated inputs (derandomized: the same every run): a parse, or NotAnOomMessageError — never another
    exception."""
    try:
        result = explain(text)
    except NotAnOomMessageError:
        return
    json.dumps(result.to_dict())
    render_explanation(result)


def test_anomaly_codes_are_members_and_the_json_writes_their_values() -> None:
    """An anomaly's code is an AnomalyCode member (the verdict filters members, not spellings); the JSON keeps the
    stable string."""
    result = explain(_fixture("ComfyUI/issues/7372"), gpu="t4")
    assert result.anomalies and all(isinstance(a.code, AnomalyCode) for a in result.anomalies)
    assert [a["code"] for a in result.to_dict()["anomalies"]] == [a.code.value for a in result.anomalies]


# ------------------------------------------------------------------- the run told (issue 22)


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--strategy", "zero9"], "argument --strategy: invalid choice: 'zero9' (choose from 'single', 'ddp', 'zero1', "
         "'zero2', 'fsdp', 'fsdp-offload', 'fsdp2', 'fsdp2-offload', 'zero3', 'zero2-offload', 'zero3-offload')"),
        (["--method", "dora"], "argument --method: invalid choice: 'dora' (choose from 'full', 'lora', 'qlora')"),
        (["--gpus", "0"], "argument --gpus: invalid value '0'; must be an integer >= 1"),
    ],
)
def test_cli_run_options_refused(argv: list, error: str, capsys) -> None:
    """A bad --strategy, --method or count exits 2 naming the value and the valid ones, before any work."""
    with pytest.raises(SystemExit) as info:
        main(["explain", FIXTURES[0]["text"], *argv])
    assert info.value.code == 2 and error in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"strategy": "zero9"}, "unknown strategy 'zero9'; known: ddp, fsdp, fsdp-offload, fsdp2, fsdp2-offload, "
         "single, zero1, zero2, zero2-offload, zero3, zero3-offload"),
        ({"batch": 0}, "invalid batch 0; expected a whole number of sequences >= 1, or None when unknown"),
        ({"seq": 2.5}, "invalid seq 2.5; expected a whole number of tokens >= 1, or None when unknown"),
        ({"nodes": True}, "invalid nodes True; expected a whole number of nodes >= 1, or None when unknown"),
    ],
)
def test_run_told_refused(options: dict, error: str) -> None:
    """explain() refuses a bad run description naming it and what is accepted."""
    with pytest.raises(OomlabError) as info:
        explain(FIXTURES[0]["text"], **options)
    assert str(info.value) == error


def test_cli_run_options_reach_the_aggregates(capsys) -> None:
    """--gpus 8 --strategy zero2 on llama-2-7b's 3.14 GiB step: the JSON's first aggregate is the fp32 gradient
    partition, and the context is the one told."""
    text = ('  File "train.py", line 41, in <module>\n    optimizer.step()\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.14 GiB. GPU 0 has a total capacity of "
            "79.35 GiB of which 2.05 GiB is free. Of the allocated memory 73.40 GiB is allocated by PyTorch, and "
            "2.46 GiB is reserved by PyTorch but unallocated.")
    assert main(["explain", text, "--model", "llama-2-7b", "--gpus", "4", "--nodes", "2", "--strategy", "zero2",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["aggregates"][0]["what"] == "ZeRO's fp32 gradient partition over 8 GPUs"
    assert data["context"]["world_size"] == 8 and data["context"]["strategy"] == "zero2"
