"""The sentences about a launch, computed from it, for notebook 01 and ``oomlab check``: the launch's name, what is
being reproduced (the user's launch, read or assumed), and which launches a ``Module._apply`` traceback proves --
the one notebook 01 read, or (``check``, with none read) the one the launch would or could not raise."""

from __future__ import annotations

from collections.abc import Sequence

from oomlab.core.choices import Route
from oomlab.core.markdown import markdown_table, md_code, md_text
from oomlab.core.seed import is_seed_case
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import format_size
from oomlab.launch.origin import OriginKind
from oomlab.launch.paths import APPLY_FRAMES, ROWS, LoadPath, load_path_of, paths_the_traceback_allows
from oomlab.launch.read import UserLaunch
from oomlab.remedies.remedy import remedy_name
from oomlab.reproduction.result import ReproduceResult


def replica_dtype(launch: UserLaunch) -> str:
    """The dtype of the replica ``.to()`` moves: DeepSpeed's engine casts to the half dtype first; the Trainer and
    accelerate move what from_pretrained loaded."""
    s = launch.setup
    path = load_path_of(s, hf_trainer=launch.hf_trainer, zero3_init=launch.zero3_init)
    if path is LoadPath.DEEPSPEED_TO:
        return s.precision.compute_dtype
    return launch.load_dtype


def launch_name(setup: TrainingSetup) -> str:
    """The launch as the remedy table names it (``DDP · full fine-tuning · fp16-mixed · adamw``)."""
    s = setup
    return remedy_name(Route.PROCESS_PER_GPU, s.strategy, s.method, s.precision, s.optimizer, s.checkpointing,
                       s.lora_rank, s.base_dtype)


def is_seed_launch(launch: UserLaunch, dtype: str) -> bool:
    """Is this the seed's case (llama-13b in float16 on T4s)?"""
    return is_seed_case(launch.setup.model.name, dtype, launch.setup.gpu.name)


def case_intro(launch: UserLaunch, dtype: str) -> str:
    """The case in two or three sentences: the model, the GPUs and the launch, and whether the launch was read or
    assumed."""
    s = launch.setup
    name = launch_name(s)
    path = ROWS[load_path_of(s, hf_trainer=launch.hf_trainer, zero3_init=launch.zero3_init)]
    lines = [f"**The case.** {md_text(s.model.name)} on {s.gpus * s.nodes} × {s.gpu.display_name} "
             f"({format_size(s.gpu.total_memory_bytes)} each), launched as {name}, micro-batch {s.batch} × "
             f"{s.seq} tokens; the weights reach each GPU through {path.short}, in {dtype}."]
    if is_seed_launch(launch, dtype):
        lines.append("The user's report shows this run dying before training, inside `torch.nn.Module._apply` → "
                     "`convert` → `t.to(device)`.")
    if launch.files or launch.command is not None:
        lines.append(f"Read from {', '.join(md_code(f) for f in launch.files)}"
                     + (f" and the command {md_code(launch.command.text)}" if launch.command else "")
                     + f"; {len(launch.assumptions)} field(s) assumed, {len(launch.unmodelled)} key(s) not modelled.")
    else:
        lines.append("No launch files were given (`launch_dir`): every field below is an assumption, the pipeline's "
                     "parameters; the table of the other plausible launches shows how the verdict changes under "
                     "each.")
    return " ".join(lines)


def launch_path_reading(launch: UserLaunch, result: ReproduceResult) -> str:
    """What the reproduced (for the seed: the user's) traceback proves about the launch, and whether the launch as
    read or assumed is one of those."""
    s = launch.setup
    if not result.raised:
        return (f"`.to()` of the {result.dtype} replica does not fail on one {s.gpu.display_name}: there is no "
                "`Module._apply` failure to read a launch from.")
    moved = f"{result.moved_fraction:.1%} of the parameters were already on the GPU"
    if is_seed_launch(launch, result.dtype):  # the user's own traceback, reproduced
        return traceback_proves(launch, f"This traceback (`Module._apply` → `convert` → `t.to`, {moved})",
                                "the user's launcher", tuple(result.frames))
    # no traceback of the user's: what oomlab's own reproduction of the move would prove, were it seen
    return traceback_proves(launch, f"A `Module._apply` → `convert` → `t.to` failure (as reproduced above, {moved})",
                            frames=tuple(result.frames), hypothetical=True)


def traceback_proves(launch: UserLaunch, traceback: str, whose: str = "a launcher that fails this way",
                     frames: Sequence[str] = APPLY_FRAMES, *, hypothetical: bool = False) -> str:
    """What ``traceback`` (a ``Module._apply → convert → t.to`` failure in words, with its ``frames``) proves about
    ``whose`` launcher, and whether the launch as read or assumed is one of those. ``hypothetical``: no traceback
    was read (``oomlab check``), so the sentence says what one would prove, and a launch outside those cannot fail
    there; otherwise (notebook 01) the traceback happened, and a launch outside those is not the one that ran."""
    s = launch.setup
    mine = ROWS[load_path_of(s, hf_trainer=launch.hf_trainer, zero3_init=launch.zero3_init)]
    allowed = paths_the_traceback_allows(tuple(frames))
    names = "; ".join(r.short for r in allowed)
    others = ", ".join(r.short for r in ROWS.values() if r not in allowed)
    origin = launch.fields["strategy"].origin
    said = "assumed" if origin.kind is OriginKind.ASSUMED else f"read from {md_text(origin)}"
    if hypothetical:
        fit = "is one of them" if mine in allowed else "is not one of them: it cannot fail there"
        return (f"{traceback} would prove that {whose} moved a full replica to each GPU with `Module.to()`: one of "
                f"{names}; not {others}. The launch {said} ({s.strategy.value}: {mine.short}) {fit}.")
    fit = ("is one of them" if mine in allowed else
           "is not one of them: under it this traceback could not happen, so the launch that ran differed")
    return (f"{traceback} means {whose} moved a full replica to each GPU with `Module.to()`: it was one of {names}. "
            f"It was not {others}. The launch {said} ({s.strategy.value}: {mine.short}) {fit}.")


def launch_section(launch: UserLaunch, result: ReproduceResult, dtype: str,
                   path_table: tuple[tuple[str, ...], list[tuple[str, ...]]],
                   others: list[tuple[str, str, str, str]]) -> str:
    """The report's account of the launch (Markdown): the case, the launch-path table, what the traceback proves,
    and the verdict under the other plausible launches."""
    heading = ("### The launch the traceback proves" if is_seed_launch(launch, dtype) and result.raised else
               "### How the weights reach the GPUs")  # no traceback of the user's: nothing is proved
    return "\n\n".join([
        heading, case_intro(launch, dtype), markdown_table(*path_table),
        launch_path_reading(launch, result),
        markdown_table(("launch", "how the weights load", "fails first at", "per GPU"), others)])
