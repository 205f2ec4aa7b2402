"""TRL's launch read: ``trl sft|dpo|grpo|kto|reward|rloo [--config cfg.yaml] --flags`` and the scripts taking its
configs (``python trl/scripts/dpo.py ...``, ``accelerate launch examples/scripts/dpo.py ...``): ``SFTConfig``,
``DPOConfig``, ``GRPOConfig``, ... with ``ModelConfig`` -- TrainingArguments plus TRL's own keys and defaults.

TRL is not installed beside oomlab (it would pin its own transformers), so its defaults are cited from its source
at the release named in :data:`VERSION` (``pip download trl==1.16.0``, the release :mod:`oomlab.budget.trainers`
reads):

- every TRL config: ``gradient_checkpointing`` True (``trl/trainer/base_config.py:62-63``), ``bf16`` = ``not fp16``
  (``:108``);
- ``max_length`` 1024: ``SFTConfig`` (``trl/trainer/sft_config.py:202-203``; named ``max_seq_length`` before TRL
  0.16, also 1024), ``DPOConfig`` (``dpo_config.py:195-196``), ``KTOConfig`` (``kto_config.py:166-167``),
  ``RewardConfig`` (``reward_config.py:144-145``); GRPO and RLOO bound only the completion
  (``max_completion_length`` 512, ``grpo_config.py:494-495``): their length is the prompt's plus that:
  ``max_prompt_length`` + ``max_completion_length`` where the launch gives both, else oomlab's assumption unless a
  length is stated;
- ``ModelConfig``: ``dtype`` ``"float32"`` (``trl/trainer/model_config.py:89-90``: the scripts load the model in
  it), ``lora_r`` 16 (``:107-108``), ``lora_alpha`` 32 (``:111-112``), ``lora_target_modules`` None: peft's per-model
  default (``peft/utils/constants.py``: ``q_proj, v_proj`` for llama, mistral, qwen2, qwen3);
- ``precompute_ref_log_probs`` False (``dpo_config.py:227-228``, ``kto_config.py:180-181``): True leaves no
  reference model in memory while training; GRPO's ``beta`` 0.0 (``grpo_config.py:681-682``) loads none, a
  positive beta keeps one;
- ``--config`` YAML values replace the dataclass defaults and flags replace them (``trl/scripts/utils.py:303``);
- ``--accelerate_config NAME`` is one of ``trl/accelerate_configs/NAME.yaml`` (``trl/cli/accelerate_config.py:19``):
  zero1/zero2/zero3 (DeepSpeed, bf16), fsdp1/fsdp2, multi_gpu, single_gpu, each with ``num_processes: 8``.
"""

from __future__ import annotations

from typing import Any

from oomlab.core.choices import Method, Precision, Reference, Trainer
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.gpus import load_gpu
from oomlab.core.versions import Release, Versions, installed_versions
from oomlab.launch import keys as K
from oomlab.launch.claims import Claims, Strength
from oomlab.launch.command import LaunchCommand
from oomlab.launch.framework import (
    Framework,
    FrameworkRead,
    config_file,
    layered_lookup,
    number_of,
    say_default,
    trl_script,
)
from oomlab.launch.memory_flags import memory_flags
from oomlab.launch.origin import Origin, Sourced, Unmodelled, default_origin, flag_origin
from oomlab.launch.read import MAX_SEQ, bool_value, int_value, training_claims

VERSION = "TRL 1.16.0"
_MERGE = "TrlParser.parse_args_and_config: flags replace the YAML, trl/scripts/utils.py:303"

# the script (or trl subcommand) -> the trainer kind; RLOO generates and keeps a reference as GRPO does
SCRIPTS = {"sft": Trainer.SFT, "dpo": Trainer.DPO, "orpo": Trainer.ORPO, "kto": Trainer.KTO, "grpo": Trainer.GRPO,
           "rloo": Trainer.GRPO, "ppo": Trainer.PPO, "reward": Trainer.REWARD}
READ_RELEASE = (1, 16, 0)
# TRL defaults that changed: the first release with each, its text and line at 1.16.0, and its line at that release
# (git show v0.22.0:trl/trainer/sft_config.py, v0.19.0 ...); earlier releases keep transformers' own default
_FACTS = {
    "checkpointing": ((0, 22, 0), "gradient_checkpointing=True (trl/trainer/base_config.py:62-63)",
                      "trl/trainer/sft_config.py:111-112, dpo_config.py:205-206 at v0.22.0"),
    "bf16": ((0, 19, 0), "bf16 = not fp16 (trl/trainer/base_config.py:108)",
             "trl/trainer/sft_config.py:252, dpo_config.py:441 at v0.19.0"),
}
# ModelConfig's load dtype: named torch_dtype before 0.21 (dtype after: huggingface/gpt-oss-recipes PR #29, "use
# ModelConfig.dtype when available (TRL >= 0.21)"), defaulting to None (from_pretrained's own default) until PR #4778
# "Set dtype default to float32" (merged 2026-01-06): the PyPI wheels' trl/trainer/model_config.py read 'dtype ...
# default=None' in 0.26.2 (:92-93) and 'default="float32"' from 0.27.0 (:91-92; the same in 0.27.2, 0.28.0, 0.29.x,
# 1.0.0)
DTYPE_FLAG_SINCE = (0, 21, 0)
DTYPE_FLOAT32_SINCE = (0, 27, 0)
DPO_MAX_LENGTH_SINCE = (0, 14, 0)  # DPOConfig max_length=1024 from v0.14.0 (None before: no bound oomlab can read)
# each config's max_length default (None: the length is the prompt's plus the completion's, not bounded as one)
MAX_LENGTH = {"sft": (1024, "sft_config.py:202-203"), "dpo": (1024, "dpo_config.py:195-196"),
              "kto": (1024, "kto_config.py:166-167"), "reward": (1024, "reward_config.py:144-145")}
# trl/accelerate_configs/NAME.yaml at 1.16.0, as accelerate_refs reads a config file
ACCELERATE_CONFIGS: dict[str, dict[str, Any]] = {
    "zero1": {"distributed_type": "DEEPSPEED", "zero_stage": 1, "zero3_init_flag": False},
    "zero2": {"distributed_type": "DEEPSPEED", "zero_stage": 2, "zero3_init_flag": False},
    "zero3": {"distributed_type": "DEEPSPEED", "zero_stage": 3, "zero3_init_flag": True},
    "fsdp1": {"distributed_type": "FSDP", "fsdp_version": 1, "fsdp_offload_params": False},
    "fsdp2": {"distributed_type": "FSDP", "fsdp_version": 2, "fsdp_offload_params": False},
    "multi_gpu": {"distributed_type": "MULTI_GPU"},
    "single_gpu": {"distributed_type": "NO"},
}
_REFERENCE_KEYS = ("precompute_ref_log_probs", "beta")  # read into the setup's reference (beta: GRPO's)
# read, and said why they are not budgeted apart
_NOTED = {
    "max_prompt_length": "the prompt's share of max_length: the budget takes max_length",
    "max_completion_length": "the generated completion's length: with max_prompt_length, GRPO's seq (their sum)",
    "num_generations": "completions per prompt: not budgeted apart from the trainer kind",
    "packing": "packed sequences fill max_length: the budget takes every sequence at max_length either way",
    "padding_free": "no padding: the budget takes every sequence at max_length",
    "loss_type": "the preference loss: the same forward",
    "precompute_ref_log_probs": "the trainer's default reference model (set: none in memory for DPO, KTO)",
    "beta": "the loss's weight: the same forward",
    "use_vllm": "generation in vLLM (its own memory): not budgeted",
    "accelerate_config": "read as TRL's packaged accelerate config (trl/accelerate_configs)",
    "config": "the TRL config YAML, read",
}


def trl_release(versions: Versions | None) -> tuple[Release, str]:
    """The TRL release whose defaults apply, and its label: the user's (``--versions trl==0.21.0``), else the
    installed one, else :data:`VERSION`'s (TRL is not installed beside oomlab) -- each said so."""
    versions = versions if versions is not None else installed_versions()
    release = versions.release("trl")
    if release is None:
        return READ_RELEASE, VERSION
    return release, f"TRL {'.'.join(map(str, release))} ({versions.origin('trl').value})"


def _since(release: Release, fact: str) -> str | None:
    """The origin text of a TRL default at ``release``: 1.16.0's line, or the release that introduced it (None:
    ``release`` predates it, transformers' own default applies)."""
    first, at_read, at_first = _FACTS[fact]
    if release >= READ_RELEASE:
        return at_read
    if release >= first:
        return f"{at_read.split(' (')[0]}, the default since TRL {'.'.join(map(str, first))} ({at_first})"
    return None


def _generated_length(claims: Claims, look: Any, script: str) -> None:
    """GRPO / RLOO: a sequence is the prompt and its generated completion, so where the launch bounds both
    (``max_prompt_length`` and ``max_completion_length``, flags or the YAML) and no length key says otherwise, the
    budget's ``seq`` is their sum (an upper bound: prompts truncated at their bound, completions stopped at theirs)."""
    if script not in ("grpo", "rloo") or any(look(k)[0] for k in K.SEQ_KEYS):
        return
    prompt, completion = look("max_prompt_length"), look("max_completion_length")
    if not (prompt[0] and completion[0]) or prompt[1] is None or completion[1] is None:
        return
    total = int_value(prompt[1], prompt[2], MAX_SEQ) + int_value(completion[1], completion[2], MAX_SEQ)
    where = f"{prompt[2].where} + {completion[2].where}" if prompt[2].kind is completion[2].kind else \
        f"{prompt[2]} + {completion[2]}"
    claims.say("seq", total, Origin(prompt[2].kind, where, prompt[2].key, prompt[2].line))


def read_trl(claims: Claims, cmd: LaunchCommand, command_dir: str | None, gpu: str,
             versions: Versions | None = None) -> FrameworkRead:
    """Claims of a TRL script's flags and ``--config`` YAML, TRL's defaults where they say nothing (at the release
    :func:`trl_release` picks)."""
    release, label = trl_release(versions)
    unmodelled: list[Unmodelled] = []
    script = trl_script(cmd) or "sft"
    named = cmd.flag("--config")
    config = config_file(command_dir, named[1] if named and named[1] else cmd.config)
    look = layered_lookup(cmd, config, unmodelled, _MERGE)
    unmodelled += memory_flags(claims, look)  # the loss kernel; refused settings
    refs = training_claims(claims, look, is_json=config is not None)
    origin = flag_origin(f"trl {script}") if cmd.launcher.value == "trl" else flag_origin(cmd.script)
    kind = SCRIPTS.get(script, Trainer.SFT)
    read = FrameworkRead(Framework.TRL, label, Sourced(kind, origin), refs=refs, unmodelled=unmodelled,
                         files=[] if config is None else [config.path])
    checkpointing = _since(release, "checkpointing")
    if checkpointing is not None:
        say_default(claims, "checkpointing", True, label, checkpointing)
    fp16, bf16_default = look("fp16"), _since(release, "bf16")
    if not (fp16[0] and bool_value(fp16[1], fp16[2])) and not look("bf16")[0] and bf16_default is not None:
        if not load_gpu(gpu).bf16:  # TrainingArguments refuses bf16 where the GPU lacks it
            raise InvalidValueError(f"{label} defaults to {bf16_default}, which the {gpu} lacks; the launch stops "
                                    "there: pass --fp16 (or --bf16 false)")
        say_default(claims, "precision", Precision.BF16_MIXED, label, bf16_default)
    if script in MAX_LENGTH and not any(look(k)[0] for k in K.SEQ_KEYS) and \
            (script != "dpo" or release >= DPO_MAX_LENGTH_SINCE):  # DPO before 0.14: max_length None
        value, where = MAX_LENGTH[script]
        say_default(claims, "seq", value, label, f"max_length={value} (trl/trainer/{where})")
    _generated_length(claims, look, script)
    if not any(look(k)[0] for k in K.DTYPE_KEYS) and release >= DTYPE_FLOAT32_SINCE:  # scripts load ModelConfig.dtype
        claims.say("load_dtype", "float32", default_origin(label, "ModelConfig dtype='float32' "
                                                                    "(trl/trainer/model_config.py:89-90)"),
                   Strength.WEAK)
    peft = look("use_peft")
    if peft[0] and bool_value(peft[1], peft[2]):
        for key, name, value, where in (("lora_r", "lora_rank", 16, "107-108"),
                                        ("lora_alpha", "lora_alpha", 32, "111-112")):
            if not look(key)[0]:
                say_default(claims, name, value, label, f"ModelConfig {key}={value} "
                            f"(trl/trainer/model_config.py:{where})")
        if not look("lora_target_modules")[0]:
            say_default(claims, "lora_targets", ("q_proj", "v_proj"), label, "lora_target_modules=None: peft's "
                        "default for llama, mistral, qwen2, qwen3 (peft/utils/constants.py)")
    elif look("lora_r")[0] or look("lora_target_modules")[0]:
        say_default(claims, "method", Method.FULL, label, "use_peft=False (trl/trainer/model_config.py:103-104): "
                    "the lora_* flags are ignored")
    read.reference = _reference(look, kind)
    read.launcher_refs = _accelerate_config(claims, look)
    read.unmodelled += _unread(cmd, config, look, () if read.reference is None else _REFERENCE_KEYS)
    return read


def _reference(look: Any, kind: Trainer) -> Sourced | None:
    """The reference model as the config sets it (None: the trainer's default)."""
    hit = look("precompute_ref_log_probs")
    if kind in (Trainer.DPO, Trainer.KTO) and hit[0] and bool_value(hit[1], hit[2]):
        return Sourced(Reference.NONE, hit[2])
    hit = look("beta")
    if kind is Trainer.GRPO and hit[0] and hit[1] is not None:
        return Sourced(Reference.RESIDENT if number_of(hit[1], hit[2]) > 0 else Reference.NONE, hit[2])
    return None


def _accelerate_config(claims: Claims, look: Any) -> dict[str, Any]:
    """TRL's packaged accelerate config, as :func:`oomlab.launch.read.accelerate_refs` reads a config file."""
    hit = look("accelerate_config")
    if not hit[0] or hit[1] is None:
        return {}
    name = str(hit[1])
    if name not in ACCELERATE_CONFIGS:
        raise UnknownNameError(f"accelerate_config ({hit[2]})", name, list(ACCELERATE_CONFIGS),
                               "TRL's packaged configs (a file path: pass it with --accelerate-config F)")
    origin = Origin(hit[2].kind, f"{hit[2].where} (trl/accelerate_configs/{name}.yaml)")
    refs: dict[str, Any] = {key: (value, origin) for key, value in ACCELERATE_CONFIGS[name].items()}
    refs["num_processes"] = (1 if name == "single_gpu" else 8, origin)
    if name != "single_gpu":
        claims.say("precision", Precision.BF16_MIXED, Origin(origin.kind, f"{origin.where} mixed_precision bf16"))
    return refs


def _unread(cmd: LaunchCommand, config: Any, look: Any, read_keys: tuple[str, ...]) -> list[Unmodelled]:
    out = []
    names = [key for key, _ in config.leaves()] if config is not None else []
    names += [flag.lstrip("-").replace("-", "_") for flag, _ in cmd.flags]
    for name in dict.fromkeys(names):
        if name in K.TRAINING_KEYS or name in ("accelerate_config", "config", "num_processes", *read_keys):
            continue
        hit = look(name)
        if hit[0]:
            out.append(Unmodelled(hit[2], hit[1], _NOTED.get(name, "TRL key not modelled by oomlab")))
    return out
