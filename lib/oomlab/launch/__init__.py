"""Stage 6: the user's launch, read: accelerate / DeepSpeed / TrainingArguments / peft / quantization / model files
and the launch command turned into a :class:`~oomlab.core.setup.TrainingSetup` whose every field says where it came
from (:mod:`.read`), which launch path that is (:mod:`.paths`), and where it fails first (:mod:`.check`)."""
