"""The user's library versions, and the version facts the budget reads: what changed in which release.

A budget describes the step the user's stack runs, and some of its bytes depend on the release: peft's QLoRA
preparation, bitsandbytes' saved input, where transformers upcasts the logits, how it stores MoE experts, the
Trainer's default optimizer.  :class:`Versions` holds the user's releases -- given as ``torch==2.0.1,
transformers==4.31.0`` (the CLI's ``--versions`` and the pipeline parameter ``versions``), a ``pip freeze`` file, or a
mapping (``estimate(..., versions={"transformers": "4.48.1"})``) -- and falls back to the installed release of every
package not given (:func:`installed_versions`, read from the package metadata, no import), saying which is which.

:data:`FACTS` is the one table of version facts: each keyed to the first release with the new behaviour and citing
the file and line that changed it in that release.  :func:`applies` answers a fact for one :class:`Versions`.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache, cached_property
from importlib import metadata

from oomlab.core.choices import Choice
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.user_input import read_user_text, shown

__all__ = ["FACTS", "Fact", "Versions", "applies", "installed_versions", "parse_versions", "pin_text",
           "read_freeze_file", "runs_sdpa_by_default", "sdpa_release", "trainer_default_optimizer", "versions_from"]

Release = tuple[int, ...]

# The packages whose release moves a budgeted byte (the model code, the adapters, the quantization, the optimizer and
# the launcher), and the training frameworks that replace transformers + peft altogether (their own model code).
PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "trl", "deepspeed", "torchao")
FRAMEWORKS = ("torchtune", "litgpt")
# The release a framework pins for a package it installs with itself: (package, framework, the framework's releases
# from, up to (excluded), the pinned release).  Read where neither the user nor the framework's own release is given
# otherwise -- the pin is what that framework's users ran.  torchtune v0.1.0 and v0.1.1 pyproject.toml
# dependencies: "torchao==0.1"; v0.2.0 and v0.2.1: "torchao==0.3.1" (pytorch/torchtune tags).
FRAMEWORK_PINS: tuple[tuple[str, str, tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...] = (
    ("torchao", "torchtune", (0, 1), (0, 2), (0, 1)),
    ("torchao", "torchtune", (0, 2), (0, 3), (0, 3, 1)),
)
KNOWN = PACKAGES + FRAMEWORKS
MAX_PINS = 64  # a --versions list names a handful; a pip freeze file is filtered to KNOWN first

_RELEASE = re.compile(r"^v?(\d{1,6}(?:\.\d{1,6}){0,3})(?:[.+\-_ ]?[A-Za-z0-9.+\-_]*)?$")
_FREEZE_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)\s*(?:\[[^\]]*\])?\s*===?\s*(\S+)\s*$")


def pin_text(package: str, release: Release) -> str:
    """``("torchtune", (0, 2, 0))`` -> ``torchtune==0.2.0``, as ``--versions`` takes a pin."""
    return f"{package}=={'.'.join(map(str, release))}"


def parse_release(text: str, package: str) -> Release:
    """``"2.0.1+cu118"`` → ``(2, 0, 1)``: the leading numeric components (a local or pre-release tag is dropped)."""
    match = _RELEASE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InvalidValueError(f"invalid version {shown(text)} for {package}; expected a release such as 4.31.0 "
                                "(numbers separated by dots, an optional +local or pre-release tag)")
    return tuple(int(p) for p in match.group(1).split("."))


def _normal(name: str) -> str:
    return name.strip().lower().replace("_", "-")


class Origin(enum.Enum):
    """Where a package's release came from."""

    GIVEN = "given"  # the user named it
    PINNED = "pinned by the framework"  # not given: the release the user's framework release pins (FRAMEWORK_PINS)
    INSTALLED = "installed"  # not given: the release installed beside oomlab
    ASSUMED = "assumed: the release oomlab reads; give yours"  # a framework launched with no release named


@dataclass(frozen=True)
class Versions:
    """The releases one budget assumes: ``given`` by the user, the rest ``installed`` (hashable, frozen)."""

    given: tuple[tuple[str, Release], ...] = ()
    installed: tuple[tuple[str, Release], ...] = ()
    assumed: tuple[str, ...] = ()  # given packages whose release is oomlab's assumption (a launch named no release)

    def release(self, package: str) -> Release | None:
        """The release of ``package`` (given first, else installed), or ``None`` where neither has it."""
        for name, release in self.given:
            if name == package:
                return release
        if package in FRAMEWORKS:  # a framework counts only when the user names it (installed it does nothing)
            return None
        pinned = self._pinned(package)
        return pinned if pinned is not None else dict(self.installed).get(package)

    def _pinned(self, package: str) -> Release | None:
        """The release of ``package`` that the user's framework release pins (:data:`FRAMEWORK_PINS`), or None."""
        for name, framework, low, high, pin in FRAMEWORK_PINS:
            release = dict(self.given).get(framework)
            if name == package and release is not None and low <= release < high:
                return pin
        return None

    def origin(self, package: str) -> Origin | None:
        if package in self.assumed:
            return Origin.ASSUMED
        if any(name == package for name, _ in self.given):
            return Origin.GIVEN
        if package not in FRAMEWORKS and self._pinned(package) is not None:
            return Origin.PINNED
        return Origin.INSTALLED if self.release(package) is not None else None

    @cached_property
    def framework(self) -> str:
        """The training code: ``torchtune`` or ``litgpt`` when the user names one (their own model and loop, no peft),
        else ``transformers`` (with peft's adapters)."""
        return next((f for f in FRAMEWORKS if self.release(f) is not None), "transformers")

    @cached_property
    def answers(self) -> dict[Fact, bool]:
        """Every fact answered once for these releases (:func:`applies` reads it: the budget asks per estimate)."""
        return {fact: _applies(fact, self) for fact in Fact}

    def with_given(self, **releases: Release | None) -> Versions:
        """A copy with these packages given at these releases (None: no longer given), the installed ones kept."""
        given = dict(self.given)
        for package, release in releases.items():
            if release is None:
                given.pop(package, None)
            else:
                given[package] = release
        return Versions(tuple(sorted(given.items())), self.installed,
                        tuple(p for p in self.assumed if p not in releases))

    def assuming(self, **releases: Release) -> Versions:
        """A copy with these packages at these releases, each marked as oomlab's assumption (``origin``: ASSUMED)."""
        given = self.with_given(**releases)
        return replace(given, assumed=tuple(sorted({*given.assumed, *releases})))

    def describe(self) -> str:
        """``transformers 4.31.0 (given), peft 0.21.2 (installed), ...`` for the budget's notes."""
        parts = []
        for package in (*FRAMEWORKS, *PACKAGES):
            release = self.release(package)
            if release is not None:
                parts.append(f"{package} {'.'.join(map(str, release))} ({self.origin(package).value})")
        return ", ".join(parts) or "none known"


@cache
def installed_versions() -> Versions:
    """The releases installed beside oomlab (package metadata only: nothing is imported)."""
    found = []
    for package in PACKAGES:
        try:
            found.append((package, parse_release(metadata.version(package), package)))
        except (metadata.PackageNotFoundError, InvalidValueError):
            continue
    return Versions((), tuple(found))


def _pins(pairs: Mapping[str, object], what: str) -> Versions:
    if len(pairs) > MAX_PINS:
        raise InvalidValueError(f"{what}: {len(pairs)} packages; at most {MAX_PINS} (name the ones oomlab reads: "
                                f"{', '.join(KNOWN)})")
    given = []
    for raw_name, raw_release in pairs.items():
        name = _normal(str(raw_name))
        if name not in KNOWN:
            raise UnknownNameError("package", str(raw_name)[:120], KNOWN,
                                   f"{what}: the packages whose release oomlab reads")
        if not isinstance(raw_release, str):
            raise InvalidValueError(f"invalid version {shown(raw_release)} for {name} in {what}; expected a string "
                                    "such as '4.31.0'")
        given.append((name, parse_release(raw_release, name)))
    return Versions(tuple(sorted(given)), installed_versions().installed)


def parse_versions(text: str) -> Versions:
    """``torch==2.0.1,transformers==4.31.0`` (comma-separated ``name==release`` pins) → :class:`Versions`."""
    pairs: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, release = item.partition("==")
        if not sep or not name.strip() or not release.strip():
            raise InvalidValueError(f"invalid version pin {shown(item)}; expected name==release, e.g. "
                                    "transformers==4.31.0 (pins separated by commas)")
        pairs[name] = release
    if not pairs:
        raise InvalidValueError(f"no version pins in {shown(text)}; expected e.g. torch==2.0.1,transformers==4.31.0")
    return _pins(pairs, "--versions")


def read_freeze_file(path: str | os.PathLike[str]) -> Versions:
    """A ``pip freeze`` file: its ``name==release`` lines for the packages oomlab reads (others, comments, editable
    and URL requirements are skipped).  NB: not torchtune's or litgpt's: installed beside transformers they do not say
    which code trains (a Trainer launch stays transformers'); ``--versions litgpt==X`` names the framework."""
    text = read_user_text(path, "pip freeze file")
    pairs = {}
    for line in text.splitlines():
        match = _FREEZE_LINE.match(line.strip())
        if match and _normal(match.group(1)) in KNOWN and _normal(match.group(1)) not in FRAMEWORKS:
            pairs[match.group(1)] = match.group(2)
    if not pairs:
        raise InvalidValueError(f"pip freeze file {shown(str(path))} names none of the packages oomlab reads "
                                f"({', '.join(KNOWN)}) as name==release")
    return _pins(pairs, f"pip freeze file {shown(str(path))}")


def versions_from(value: Versions | Mapping[str, str] | str | os.PathLike[str] | None) -> Versions:
    """Whatever an entry point received: nothing (the installed releases), a :class:`Versions`, a mapping, pins as
    text (``name==release,...``) or the path of a ``pip freeze`` file."""
    if value is None:
        return installed_versions()
    if isinstance(value, Versions):
        return value
    if isinstance(value, Mapping):
        return _pins(value, "versions")
    if isinstance(value, str) and "==" in value:
        return parse_versions(value)
    if isinstance(value, (str, os.PathLike)):
        return read_freeze_file(value)
    raise InvalidValueError(f"invalid versions {shown(value)}; expected name==release pins, a pip freeze file or a "
                            "mapping of package to release")


# ----------------------------------------------------------------------------------------------------------- facts


class Fact(Choice):
    """A behaviour that changed in one release of one package (the member's ``package`` and ``since``)."""

    def __new__(cls, key: str, package: str, since: Release, text: str, source: str) -> Fact:
        member = object.__new__(cls)
        member._value_ = key
        member.package = package
        member.since = since  # the first release with the behaviour
        member.text = text
        member.source = source
        return member

    PEFT_KBIT_UPCAST = (
        "peft-kbit-upcast", "peft", (0, 4, 0),
        "prepare_model_for_kbit_training casts every fp16/bf16 parameter that is not 4-bit (embedding, norms, "
        "lm_head) to fp32",
        "peft v0.4.0 src/peft/utils/other.py:78-81 ('cast all non INT8 parameters to fp32'); since v0.10.0 "
        "Params4bit is spared by class name (other.py:104-109, #1550), peft 0.21.2 other.py:204-209")
    BNB_DROPS_SAVED_INPUT = (
        "bnb-drops-saved-input", "bitsandbytes", (0, 43, 2),
        "MatMul4Bit keeps only the packed weight for backward; before, every 4-bit projection kept its input "
        "(ctx.tensors = (A, B)) whenever the input needed a gradient",
        "bitsandbytes 0.43.2 bitsandbytes/autograd/_functions.py:516 (commit 9e75374, #1270 'fix QLoRA mem bug: "
        "delete useless buffered activation'); 0.43.1 _functions.py:516 saved (A, B)")
    LOSS_UPCASTS_LOGITS = (
        "loss-upcasts-logits", "transformers", (4, 46, 0),
        "the causal-LM forward returns the logits in the model's dtype and the loss (loss_utils.ForCausalLMLoss) "
        "upcasts them; before, LlamaForCausalLM.forward ran logits = logits.float() and returned fp32 logits (the "
        "half ones freed at once)",
        "transformers 4.45 models/llama/modeling_llama.py ('TODO: remove the float() operation in v4.46', "
        "logits = self.lm_head(...).float()); 4.46 loss/loss_utils.py ForCausalLMLoss 'logits = logits.float()'")
    LOSS_SHIFTS_LABELS = (
        "loss-shifts-labels", "transformers", (4, 49, 0),
        "ForCausalLMLoss shifts the labels, not the logits; before, logits[..., :-1, :].contiguous() made a second "
        "fp32 (tokens x vocab) copy at the loss",
        "transformers loss/loss_utils.py ForCausalLMLoss (PR #35646, merged 2025-01, 'removing unnecessary "
        "contiguous() call'; NB: the release is the first after the merge, inferred from its date)")
    MOE_EXPERTS_3D = (
        "moe-experts-3d", "transformers", (5, 0, 0),
        "Mixtral-style experts are one module of 3-D parameters (gate_up_proj E x 2i x h, down_proj E x h x i) "
        "that bitsandbytes does not quantize; before, each expert's w1/w2/w3 was an nn.Linear, quantized to 4 bits",
        "transformers 5.x models/mixtral/modeling_mixtral.py:57-66 (class MixtralExperts, 'Collection of expert "
        "weights stored as 3D tensors'); 4.x MixtralBlockSparseTop2MLP: w1, w2, w3 = nn.Linear")
    TRAINER_ADAMW_TORCH = (
        "trainer-adamw-torch", "transformers", (4, 32, 0),
        "TrainingArguments' default optim is adamw_torch (torch.optim.AdamW, foreach on CUDA); before, adamw_hf "
        "(transformers' own AdamW, a loop over the parameters)",
        "PR #25109 'Change default from adamw_hf to adamw_torch' (merged 2023-07-26; NB: 4.32.0 is the first release "
        "after the merge, inferred from its date); transformers 4.31 training_args.py optim default 'adamw_hf'")
    SDPA_DEFAULT = (
        "sdpa-default", "transformers", (4, 36, 0),
        "from_pretrained picks attn_implementation='sdpa' (torch's scaled_dot_product_attention) where the family "
        "supports it; before, the eager attention, which keeps the (heads x seq x seq) probabilities for backward",
        "PR #26572 '[core] Add SDPA support for Llama, Mistral, ...' (merged 2023-12-08, released in 4.36.0); 4.35 "
        "models/llama/modeling_llama.py LlamaAttention: softmax(QK^T) then dropout and matmul")
    TRAINER_FUSED_ADAMW = (
        "trainer-fused-adamw", "transformers", (4, 54, 0),
        "TrainingArguments' default optim is adamw_torch_fused where torch >= 2.8; before, adamw_torch (foreach)",
        "transformers training_args.py:811 in 5.24 (default_optim = 'adamw_torch_fused' under torch >= 2.8), added by "
        "PR #37358 'Defaults to adamw_torch_fused for Pytorch>=2.8' (merged 2025-07; NB: 4.54.0 is the first release "
        "after the merge, inferred from its date)")

    LOAD_DTYPE_AUTO = (
        "load-dtype-auto", "transformers", (5, 0, 0),
        "from_pretrained without a dtype loads dtype='auto': the checkpoint's config.json torch_dtype (else its first "
        "floating weight's dtype); before, the model was built and loaded in torch's default float32",
        "transformers 5.24 modeling_utils.py:4186-4187 ('if dtype is None: dtype = \"auto\"'), _get_dtype:829-833; "
        "4.40.1 (the PyPI wheel) modeling_utils.py:3490-3513 sets the default dtype only under 'if torch_dtype is not "
        "None:' ('we also may have config.torch_dtype available, but we won't rely on it till v5', :3487) and its "
        "from_pretrained docstring :2847-2849 'If not specified - the model will get loaded in torch.float (fp32)' "
        "(NB: 5.0.0 taken as the release that changed it)")
    LOAD_STREAMS = (
        "load-streams", "transformers", (5, 0, 0),
        "from_pretrained always builds the model on the meta device and streams the checkpoint tensor by tensor; "
        "before, only low_cpu_mem_usage=True (implied by a device_map, a bitsandbytes quantization or accelerate's "
        "FSDP cpu_ram_efficient_loading) did -- else a full model was built on the host, each shard loaded beside it",
        "transformers 5.24 modeling_utils.py:4179-4181 (low_cpu_mem_usage among the kwargs 'Not used anymore'); "
        "4.x modeling_utils.py from_pretrained: 'if device_map is not None: low_cpu_mem_usage = True', PR #25603 "
        "(4/8-bit forces it), commit 3f06f95 modeling_utils.py:3442-3443 (is_fsdp_enabled() -> True); NB: releases "
        "4.51-4.57 may already stream (the from_pretrained refactor), 5.0.0 is the release checked")

    TORCHAO_CHUNKED_NF4 = (
        "torchao-chunked-nf4", "torchao", (0, 2, 0),
        "to_nf4 finds each element's nearest NF4 code in chunks of 1024**2 elements; before, to_nf4 searched the whole "
        "weight at once -- (value.unsqueeze(-1) - nf4).abs() holds two (elements x 16) tensors, 64 bytes per bf16 "
        "weight element at the quantization's peak (torchtune < 0.2.0 pins torchao 0.1: its QLoRA init)",
        "torchao v0.1 (the PyPI wheel) torchao/dtypes/nf4tensor.py:438-446 quantize_tensor_nearest over the whole "
        "flattened weight, called from convert_to_norm_float_weight:378-407; v0.2.0 nf4tensor.py:33 CHUNK_SIZE = "
        "1024**2, :649-652 the chunk loop (PR #196 'perform in chunks', commit 6081796bc, 2024-05-01)")

    TORCHTUNE_FROZEN_NF4 = (
        "torchtune-frozen-nf4", "torchtune", (0, 3, 0),
        "QLoRA's builders quantize the projections LoRA does not adapt too (FrozenNF4Linear); before, only the "
        "adapted projections were NF4 and the others stayed nn.Linear in the model's dtype (bf16)",
        "torchtune v0.3.0 torchtune/models/llama2/_component_builders.py:134-144 ('else FrozenNF4Linear(...)'); "
        "v0.2.0 the same file :331-367 and v0.1.0 :329-362 ('else nn.Linear(...)')")

    @property
    def release_text(self) -> str:
        return f"{self.package} {'.'.join(map(str, self.since))}"


FACTS = tuple(Fact)


# What torchtune's and litgpt's own code does where a fact is transformers' or peft's: no peft preparation (their
# adapters go on their own modules), their loss chunk by chunk (the newest behaviour's bytes or fewer; litgpt's runs
# on Fabric's fp32 logits, budgeted with the rest of its loop by oomlab.budget.frameworks), their own MoE and
# optimizer code (the newest).
FRAMEWORK_BEHAVIOUR = {Fact.PEFT_KBIT_UPCAST: False, Fact.LOSS_UPCASTS_LOGITS: True, Fact.LOSS_SHIFTS_LABELS: True,
                       Fact.MOE_EXPERTS_3D: True, Fact.TRAINER_FUSED_ADAMW: True, Fact.LOAD_DTYPE_AUTO: True,
                       Fact.LOAD_STREAMS: True, Fact.TRAINER_ADAMW_TORCH: True, Fact.SDPA_DEFAULT: True}


# The first transformers release whose model class of a family sets ``_supports_sdpa = True`` (the default
# attn_implementation is SDPA from then on, Fact.SDPA_DEFAULT's machinery permitting), read in the PyPI wheels'
# models/<family>/modeling_<family>.py: llama 4.36.0 (:845) and falcon 4.36.0 (:938); mistral, mixtral, qwen2 4.37.0
# (:809, :950, :828; mistral and mixtral had no SDPA class in 4.36.0); phi and stablelm 4.39.0 (:834, :780; none in
# 4.38.0); gpt_neox 4.42.0 (:83); phi3 4.45.0 (:846; '_supports_sdpa = False' in 4.41.0-4.44.0).  A family not
# listed was added to transformers with SDPA (gemma 4.38.0, qwen2_moe 4.40.0, gemma2 4.42.0, granitemoe 4.45.0, and
# the later ones).
FAMILY_SDPA_SINCE: Mapping[str, Release] = {
    "llama": (4, 36, 0), "falcon": (4, 36, 0), "mistral": (4, 37, 0), "mixtral": (4, 37, 0), "qwen2": (4, 37, 0),
    "phi": (4, 39, 0), "stablelm": (4, 39, 0), "gpt_neox": (4, 42, 0), "phi3": (4, 45, 0),
}


def sdpa_release(family: str) -> Release:
    """The first transformers release that runs ``family`` (a :class:`~oomlab.core.layouts.Family` value) with SDPA
    by default (:data:`FAMILY_SDPA_SINCE`; else :attr:`Fact.SDPA_DEFAULT`'s)."""
    return FAMILY_SDPA_SINCE.get(family, Fact.SDPA_DEFAULT.since)


def runs_sdpa_by_default(family: str, versions: Versions) -> bool:
    """Does transformers at ``versions`` pick SDPA for ``family`` when the launch names no attention (torch aside)?"""
    release = versions.release("transformers")
    return applies(Fact.SDPA_DEFAULT, versions) and (release is None or release >= sdpa_release(family))


def trainer_default_optimizer(versions: Versions) -> str:
    """The HF Trainer's ``optim`` when none is given: ``adamw_torch_fused`` from transformers 4.54 under torch >= 2.8
    (:attr:`Fact.TRAINER_FUSED_ADAMW`), ``adamw_torch`` from 4.32 (:attr:`Fact.TRAINER_ADAMW_TORCH`), else
    ``adamw_hf``."""
    torch = versions.release("torch")
    if applies(Fact.TRAINER_FUSED_ADAMW, versions) and (torch is None or torch >= (2, 8)):
        return "adamw_torch_fused"
    return "adamw_torch" if applies(Fact.TRAINER_ADAMW_TORCH, versions) else "adamw_hf"


def applies(fact: Fact, versions: Versions) -> bool:
    """Does the stack ``versions`` run ``fact``'s new behaviour (the release it names or a later one)?  A package
    neither given nor installed runs the newest; under torchtune or litgpt a transformers or peft fact is
    :data:`FRAMEWORK_BEHAVIOUR`'s."""
    return versions.answers[fact]


def _applies(fact: Fact, versions: Versions) -> bool:
    if fact.package in ("transformers", "peft") and versions.framework != "transformers":
        return FRAMEWORK_BEHAVIOUR[fact]
    release = versions.release(fact.package)
    return release is None or release >= fact.since
