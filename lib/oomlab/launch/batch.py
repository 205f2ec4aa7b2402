"""DeepSpeed's batch arithmetic: ``train_batch_size = micro-batch × gradient_accumulation_steps × world size``.

A DeepSpeed JSON may give any two (or all three) of ``train_batch_size``, ``train_micro_batch_size_per_gpu`` and
``gradient_accumulation_steps``; DeepSpeed derives the rest and refuses a set that does not multiply out
(``deepspeed/runtime/config.py`` ``DeepSpeedConfig._configure_train_batch_size``: ``_set_batch_related_parameters``
then ``_batch_assertion``, deepspeed 0.19.8).  Under the HF Trainer every ``"auto"`` is first filled from
TrainingArguments (``transformers/integrations/deepspeed.py`` ``HfTrainerDeepSpeedConfig.trainer_config_process``:
``train_micro_batch_size_per_gpu`` ← ``per_device_train_batch_size``, ``gradient_accumulation_steps`` ←
``gradient_accumulation_steps``, ``train_batch_size`` ← ``world_size × per_device × accumulation``), so an
``"auto"`` adds no constraint of its own.  :func:`deepspeed_batch` turns that into the micro-batch claim, with the
arithmetic in its origin: ``train_batch_size 8`` over 4 GPUs with 1 accumulation step trains a micro-batch of 2.

# NB: ``fill_match`` also refuses a number that disagrees with a TrainingArguments *default* (a JSON
# ``train_batch_size`` 8 on 4 GPUs against the Trainer's unsaid per_device_train_batch_size 8); oomlab lets the JSON's
# number win over a default, as it does for ``train_micro_batch_size_per_gpu``, and refuses only stated disagreements.
"""

from __future__ import annotations

from typing import Any

from oomlab.core.errors import LaunchConflictError
from oomlab.launch.claims import Claims, Strength
from oomlab.launch.files import LaunchFile
from oomlab.launch.keys import TRANSFORMERS
from oomlab.launch.origin import Origin, default_origin, file_origin
from oomlab.launch.read import MAX_BATCH, int_value

__all__ = ["World", "deepspeed_batch"]

_REFUSED = "DeepSpeed refuses it (runtime/config.py _batch_assertion)"
_FIX = "make train_batch_size = micro-batch × gradient_accumulation_steps × world size, or set it to \"auto\""


class World:
    """The world size the batch arithmetic divides by, with the places that say it."""

    def __init__(self, gpus: int, gpus_origin: Origin, nodes: int, nodes_origin: Origin | None) -> None:
        self.size = gpus * nodes
        self.text = f"{gpus} processes per node ({gpus_origin})" + (
            "" if nodes_origin is None or nodes == 1 else f" × {nodes} nodes ({nodes_origin})")


def _number(ds: LaunchFile, key: str) -> int | None:
    """A batch key of the JSON as a number (absent or ``"auto"``: None -- the Trainer fills ``"auto"``)."""
    value = ds.get(key)
    return None if value is None or value == "auto" else int_value(value, ds.origin(key), MAX_BATCH)


def _stated_batch(claims: Claims) -> tuple[Any, Origin] | None:
    found = [(v, o) for v, o, s in claims.said.get("batch", ()) if s is Strength.STATED]
    return found[0] if found else None


def deepspeed_batch(claims: Claims, ds: LaunchFile, world: World,
                    accumulation: tuple[int, Origin] | None) -> None:
    """Check the JSON's batch keys against the world size and claim the micro-batch they fix (``accumulation``: the
    TrainingArguments' ``gradient_accumulation_steps``, which fills the JSON's ``"auto"``); a set DeepSpeed or the HF
    integration refuses raises :class:`LaunchConflictError` naming both places."""
    total, micro = _number(ds, "train_batch_size"), _number(ds, "train_micro_batch_size_per_gpu")
    steps, steps_origin = _number(ds, "gradient_accumulation_steps"), ds.origin("gradient_accumulation_steps")
    if steps is not None and accumulation is not None and accumulation[0] != steps:  # fill_match's mismatch
        raise LaunchConflictError(f"contradiction in gradient_accumulation_steps: {steps_origin} says {steps} but "
                                  f"{accumulation[1]} says {accumulation[0]}; the HF Trainer refuses it "
                                  "(integrations/deepspeed.py trainer_config_process); make them agree or set the "
                                  "JSON's to \"auto\"")
    if steps is None and ds.get("gradient_accumulation_steps") == "auto":
        steps, steps_origin = accumulation or (1, default_origin(TRANSFORMERS, "TrainingArguments "
                                                                 "gradient_accumulation_steps=1 fills \"auto\""))
    if total is None:
        return  # the micro-batch (if any) is claimed as written; train_batch_size follows from it
    t_origin = ds.origin("train_batch_size")
    if micro is not None:
        m_origin = ds.origin("train_micro_batch_size_per_gpu")
        if steps is None:  # _set_batch_related_parameters: grad_acc = train_batch // micro // world_size
            steps = max(total // micro // world.size, 1)
            steps_origin = Origin(t_origin.kind, t_origin.where, "train_batch_size // micro-batch // world size")
        if total != micro * steps * world.size:
            raise LaunchConflictError(
                f"contradiction in batch: {t_origin} says {total} but {m_origin} {micro} × {steps} accumulation steps "
                f"({steps_origin}) × world size {world.size} ({world.text}) is {micro * steps * world.size}; "
                f"{_REFUSED}; {_FIX}")
        return
    if steps is None:  # train_batch_size alone: gradient_accumulation_steps = 1
        steps, steps_origin = 1, Origin(t_origin.kind, t_origin.where, "gradient_accumulation_steps 1 (DeepSpeed "
                                        "sets it when only train_batch_size is given)")
    if total % (steps * world.size):
        raise LaunchConflictError(
            f"contradiction in batch: {t_origin} says {total}, which {steps} accumulation steps ({steps_origin}) × "
            f"world size {world.size} ({world.text}) do not divide; {_REFUSED}; {_FIX}")
    derived = total // (steps * world.size)
    origin = file_origin(ds.path, f"train_batch_size {total} / ({world.size} processes × {steps} accumulation "
                         f"step{'s' if steps > 1 else ''})", t_origin.line)
    stated = _stated_batch(claims)
    if stated is not None and stated[0] != derived:
        raise LaunchConflictError(
            f"contradiction in batch: {t_origin} says {total}, a micro-batch of {derived} over {steps} accumulation "
            f"steps ({steps_origin}) × world size {world.size} ({world.text}), but {stated[1]} says {stated[0]}; "
            f"{_REFUSED}; {_FIX}")
    claims.say("batch", derived, origin)
