"""The trainers' budget against real TRL steps: tiny LLaMA models trained by TRL's own ``DPOTrainer`` on CPU.

Each row builds the tiny model of :func:`oomlab.budget.step.tiny_setup`, saves it (TRL builds its reference from the
policy's path, ``create_model_from_path``), and runs ``DPOTrainer.train()`` for two steps with ``use_cpu=True`` on
pairs of token ids whose prompt, chosen and rejected lengths fill the setup's ``seq`` exactly; the CPU allocator's
events (``torch.profiler`` with ``profile_memory=True``, replayed by
:func:`oomlab.instruments.measured.allocator_peak`) plus the bytes already
resident (the policy's and the reference's parameters and buffers) give the allocated peak, beside
:func:`oomlab.budget.trainers.trainer_estimate`'s for the same setup. No ``torch.cuda`` anywhere.

TRL is not a dependency of oomlab: ``pip install trl==1.16.0`` (and ``datasets``) to measure again; ``python -m
oomlab.evidence trainers`` rewrites ``docs/trainers-small-scale.md``.
"""

from __future__ import annotations

import contextlib
import gc
import platform
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oomlab.budget.step import library_versions, step_dtypes, tiny_setup
from oomlab.budget.trainers import TRL_VERSION, trainer_estimate
from oomlab.core.choices import Method, Precision, Reference
from oomlab.core.errors import InvalidValueError
from oomlab.core.files import write_text_atomic
from oomlab.core.paths import REPO_ROOT
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import format_size
from oomlab.instruments.measured import allocator_peak

TRAINERS_DOC = REPO_ROOT / "docs" / "trainers-small-scale.md"
PROMPT_TOKENS = 32  # of each example's seq: the prompt; the rest is the completion (its EOS included)


@dataclass(frozen=True)
class TrainerCase:
    """One tiny TRL run: a label and :func:`oomlab.budget.step.tiny_setup` keywords (trainer among them)."""

    label: str
    knobs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def setup(self) -> TrainingSetup:
        return tiny_setup(**{"optimizer": "adamw-fused", "precision": "fp32", **self.knobs})


TRAINER_CASES: tuple[TrainerCase, ...] = (
    TrainerCase("DPO full fp32, reference resident", {"trainer": "dpo"}),
    TrainerCase("DPO full fp32, precompute_ref_log_probs", {"trainer": "dpo", "reference": "none"}),
    TrainerCase("DPO LoRA fp32 (adapter-disabled reference)", {"trainer": "dpo", "method": "lora"}),
    TrainerCase("DPO full fp32, batch 4", {"trainer": "dpo", "batch": 4}),
    TrainerCase("DPO full bf16-mixed (TRL's default), reference resident",
                {"trainer": "dpo", "precision": "bf16-mixed"}),
    TrainerCase("DPO LoRA bf16-mixed (TRL's default)", {"trainer": "dpo", "method": "lora", "precision": "bf16-mixed"}),
)


@dataclass(frozen=True)
class TrainerRow:
    """One case: the analytic allocated peak beside TRL's measured one."""

    case: TrainerCase
    analytic_bytes: int
    measured_bytes: int
    resident_bytes: int  # the policy's and the reference's parameters and buffers before training
    seconds: float

    @property
    def ratio(self) -> float:
        return self.analytic_bytes / self.measured_bytes

    @property
    def fallback_tiles(self) -> float:
        """The measured excess in units of one fp32 ``N × min(V, 32768)`` tile (see :func:`fallback_tile_bytes`)."""
        return (self.measured_bytes - self.analytic_bytes) / fallback_tile_bytes(self.case.setup)


def fallback_tile_bytes(setup: TrainingSetup) -> int:
    """One fp32 temporary of the torch fallback TRL runs for its Triton kernel on CPU (``_forward_tile``,
    chunked_logprob.py :211-254: ``tile.float()``, ``exp(z - max)``, ``e * z``, ``e * e``, the masks ...): every
    scored position (``seq - 1`` per sequence on CPU) by the vocabulary's columns.  A GPU runs the Triton kernel,
    which folds the tile in place: the budget does not count them."""
    from oomlab.budget.trainers import VOCAB_TILE, sequences

    return sequences(setup) * (setup.seq - 1) * min(setup.model.vocab_size, VOCAB_TILE) * 4


def analytic_bytes(setup: TrainingSetup) -> int:
    """The trainer budget's allocated peak (what ``max_memory_allocated`` would say)."""
    return trainer_estimate(setup).allocated_peak_bytes


def _tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over ``w0 .. w{V-3}``, ``<pad>`` and ``</s>``: built in memory, nothing downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size - 2)}
    vocab.update({"<pad>": vocab_size - 2, "</s>": vocab_size - 1})
    core = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="w0")


def _pairs(setup: TrainingSetup, examples: int) -> Any:
    """``examples`` preference pairs whose prompt + completion (+ EOS) is exactly ``seq`` tokens."""
    from datasets import Dataset

    completion = setup.seq - PROMPT_TOKENS - 1  # the trainer appends EOS
    words = setup.model.vocab_size - 2

    def text(start: int, n: int) -> str:
        return " ".join(f"w{(start + i) % words}" for i in range(n))

    return Dataset.from_list([{"prompt": text(7 * k, PROMPT_TOKENS), "chosen": " " + text(11 * k + 1, completion),
                               "rejected": " " + text(13 * k + 2, completion)} for k in range(examples)])


@contextlib.contextmanager
def _random_fingerprints() -> Iterator[None]:
    """``datasets``' cache fingerprints drawn at random instead of hashed: its dill hasher fails on pyarrow's
    ``MonthDayNano`` type on this Python (a cache key only: nothing measured depends on it)."""
    import uuid
    from unittest import mock

    from datasets import fingerprint

    with mock.patch.object(fingerprint.Hasher, "hash", classmethod(lambda cls, value: uuid.uuid4().hex)):
        yield


def measure_trl(setup: TrainingSetup, steps: int = 2) -> tuple[int, int, float]:
    """Run TRL's DPOTrainer on ``setup``'s tiny model for ``steps`` steps on CPU: (allocated peak, resident bytes,
    seconds)."""
    try:
        import trl
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise InvalidValueError(f"measuring a TRL step needs trl: pip install trl=={TRL_VERSION} datasets") from err
    import torch
    from torch.profiler import ProfilerActivity, profile

    from oomlab.instruments.measured import real_model

    if setup.precision not in (Precision.FP32, Precision.BF16_MIXED):
        raise InvalidValueError(f"the TRL cases run in fp32 or bf16-mixed (TRL's default), not {setup.precision.value}")
    start = time.perf_counter()
    base = real_model(setup.with_(method=Method.FULL, trainer="sft", reference="default"))
    with tempfile.TemporaryDirectory(prefix="oomlab-trl-") as folder:
        base.save_pretrained(folder)
        del base
        peft_config = None
        if setup.method is Method.LORA:
            from peft import LoraConfig

            peft_config = LoraConfig(r=setup.lora_rank, lora_alpha=setup.lora_alpha, lora_dropout=0.0,
                                     target_modules=list(setup.lora_targets), task_type="CAUSAL_LM")
        args = trl.DPOConfig(
            output_dir=folder, use_cpu=True, per_device_train_batch_size=setup.batch, max_steps=steps,
            learning_rate=1e-4, optim="adamw_torch_fused", report_to="none", save_strategy="no", logging_steps=1000,
            max_length=setup.seq, precompute_ref_log_probs=setup.reference is Reference.NONE,
            gradient_checkpointing=setup.checkpointing, dataloader_num_workers=0, seed=0,
            bf16=setup.precision is Precision.BF16_MIXED,  # TRL's configs default to bf16=True (base_config.py :108)
            model_init_kwargs={"dtype": getattr(torch, step_dtypes(setup).storage),
                               "attn_implementation": setup.attention.value})
        with _random_fingerprints():
            trainer = trl.DPOTrainer(model=folder, args=args, train_dataset=_pairs(setup, setup.batch * steps),
                                     processing_class=_tokenizer(setup.model.vocab_size), peft_config=peft_config)
        models = [m for m in (trainer.model, trainer.ref_model) if m is not None]
        resident = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                        for m in models for t in (*m.parameters(), *m.buffers())}.values())
        gc.collect()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            trainer.train()
        peak = resident + allocator_peak(prof)
    return peak, resident, time.perf_counter() - start


def compare(case: TrainerCase, steps: int = 2) -> TrainerRow:
    setup = case.setup
    measured, resident, seconds = measure_trl(setup, steps)
    return TrainerRow(case, analytic_bytes(setup), measured, resident, seconds)


DOC_HEADER = f"""# The trainers' budget against real TRL steps (tiny models, CPU)

Each row trains a tiny LLaMA (hidden 128, 2 layers, vocabulary 512, micro-batch 2 × 128 tokens unless said) with
TRL {TRL_VERSION}'s own `DPOTrainer` for two steps on CPU (`use_cpu=True`, `optim="adamw_torch_fused"`; fp32 with
`bf16=False`, or bf16-mixed, TRL's default `bf16=True`: CPU autocast) and sets
the CPU allocator's peak (`torch.profiler` memory events plus the policy's and the reference's resident parameters)
beside `oomlab.budget.trainers.trainer_estimate`'s allocated peak for the same setup.  The reference is resident
(a second fp32 copy), absent (`precompute_ref_log_probs=True`) or peft's adapter-disabled base (LoRA).

Regenerate with `python -m oomlab.evidence trainers` (needs `pip install trl=={TRL_VERSION} datasets`).
"""

DOC_FOOTER = """\
The excess of each measured peak over the budget is counted in fp32 tiles of `scored positions × vocabulary`:
on a CPU, TRL runs the torch fallback of its Triton kernel (`_forward_tile`, `trl/kernels/chunked_logprob.py`
:211-254), whose `tile.float()`, `exp(z - max)`, `e * z`, `e * e` and masks are whole-tile temporaries; on a
GPU the Triton kernel folds each tile in place and the budget, which models the GPU, does not count them.
What the budget does count is measured here: the reference model (a second copy of the weights, resident or
not), the 2 × batch concatenated sequences (the batch-4 row doubles the batch-2 row's activations and tiles)
and the `min(N, 4096) × 32768` buffer of the fused head, allocated 32768 columns wide whatever the vocabulary
(most of each peak here).

NB: on CPU TRL's fused head scores every position (`_use_triton` is false), on a GPU only the completion's;
the first step (the optimizer state being created) is inside the measured peak as well as the second."""


def render(rows: Sequence[TrainerRow]) -> str:
    lines = ["| setup | analytic peak | measured peak | ratio | excess in CPU-fallback tiles | resident before "
             "training |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.case.label} | {format_size(r.analytic_bytes)} ({r.analytic_bytes:,} B) "
                     f"| {format_size(r.measured_bytes)} ({r.measured_bytes:,} B) | {r.ratio:.4f} "
                     f"| {r.fallback_tiles:.1f} | {format_size(r.resident_bytes)} |")
    return "\n".join(lines)


def regenerate() -> int:  # pragma: no cover - writes the committed document
    """Rewrite ``docs/trainers-small-scale.md`` (and print it)."""
    import torch
    import trl

    rows = [compare(case) for case in TRAINER_CASES]
    versions = {**library_versions(), "trl": trl.__version__}
    measured_with = (f"Measured with {', '.join(f'{k} {v}' for k, v in versions.items())}, on {platform.machine()} "
                     f"CPU ({torch.get_num_threads()} threads); {sum(r.seconds for r in rows):.0f} s in all.")
    markdown = f"{DOC_HEADER}\n{render(rows)}\n\n{measured_with}\n\n{DOC_FOOTER}\n"
    write_text_atomic(TRAINERS_DOC, markdown)
    print(markdown, end="")
    return 0
