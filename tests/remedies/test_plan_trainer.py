"""A DPO run is a DPO run at every entry point (issue 23): check, plan, the pipeline's setup and estimate() budget it
under its trainer -- the reference copy and the doubled batch -- and every remedy keeps the trainer."""

from __future__ import annotations

from oomlab.budget.api import estimate
from oomlab.core.choices import Trainer
from oomlab.core.setup import make_setup
from oomlab.launch.check import check
from oomlab.launch.user import user_launch
from oomlab.pipeline.params import PARAMETERS
from oomlab.remedies.ladder import Rung
from oomlab.remedies.plan import plan_for

DPO = dict(model="llama-2-7b", gpu="a100-80gb", gpus=2, strategy="ddp", seq=2048, batch=2, precision="bf16-mixed")


def test_every_entry_point_budgets_the_trainer() -> None:
    sft, dpo = estimate(**DPO), estimate(**DPO, trainer="dpo")
    assert dpo.per_gpu_peak_bytes > sft.per_gpu_peak_bytes
    checked = check(launch="torchrun --nproc_per_node 2 train.py --bf16 --per_device_train_batch_size 2 "
                    "--max_seq_length 2048", model="llama-2-7b", gpu="a100-80gb", trainer="dpo")
    assert checked.launch.setup.trainer is Trainer.DPO
    assert checked.budget.per_gpu_peak_bytes == dpo.per_gpu_peak_bytes
    defaults = {name: p.default for name, p in PARAMETERS.items()}
    launch = user_launch({**defaults, **DPO, "trainer": "dpo"}, defaults)
    assert launch.setup.trainer is Trainer.DPO and str(launch.fields["trainer"].origin) == "flag -p trainer=dpo"


def test_the_plan_keeps_the_trainer_and_offers_precomputing_the_reference() -> None:
    plan = plan_for(make_setup(**DPO, trainer="dpo"))
    assert plan.configured.setup.trainer is Trainer.DPO
    assert all(r.setup.trainer is Trainer.DPO for r in plan.remedies if r.setup is not None)
    # tried before checkpointing (it costs one pass over the data), kept only where the fit needs it
    tried = [rung for rung, _ in plan.decision.tried]
    assert tried.index(Rung.PRECOMPUTE_REFERENCE) < tried.index(Rung.CHECKPOINTING)
    assert plan.configured.per_gpu_peak_bytes == estimate(**DPO, trainer="dpo").per_gpu_peak_bytes
