"""What ``oomlab check`` is told beside the launch -- ``--seq N``, ``--batch N``, ``--trainer KIND``, ``--loss``,
each deciding whatever the launch says (its origin "given on the command line") -- and the trainer kind nobody named."""

from __future__ import annotations

from oomlab.core.choices import Loss, Trainer, choice
from oomlab.launch.claims import Claims
from oomlab.launch.origin import Sourced, assumed, flag_origin
from oomlab.launch.read import MAX_BATCH, MAX_SEQ, LaunchInputs, int_value


def given_claims(claims: Claims, inputs: LaunchInputs) -> Sourced | None:
    """``check --seq/--batch/--trainer``: they decide whatever the launch says (what it says is listed as
    overridden); returns the trainer kind given."""
    for name, value, high in (("seq", inputs.seq, MAX_SEQ), ("batch", inputs.batch, MAX_BATCH)):
        if value is not None:
            origin = flag_origin(f"--{name} {value} (given on the command line)")
            claims.override(name, int_value(value, origin, high), origin, f"overridden by {origin}")
    if inputs.loss is not None:
        origin = flag_origin(f"--loss {inputs.loss} (given on the command line)")
        claims.override("loss", choice(Loss, inputs.loss, "loss"), origin, f"overridden by {origin}")
    if inputs.trainer is None:
        return None
    origin = flag_origin(f"--trainer {inputs.trainer} (given on the command line)")
    return Sourced(choice(Trainer, inputs.trainer, "trainer"), origin)


def trainer_default(script: bool) -> Sourced:
    """The trainer kind nobody named: a script's loop is taken as supervised fine-tuning."""
    why = "a custom script: supervised fine-tuning (check --trainer dpo|grpo|... says otherwise)" if script else \
        "no launch command: supervised fine-tuning"
    return Sourced(Trainer.SFT, assumed(why))
