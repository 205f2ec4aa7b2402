"""The shared base every stage imports: errors, units, paths, specs, the user-facing choices, the training
setup, atomic writes, the seed case."""

from oomlab.core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "choices": ("Attention", "Device", "MessageFormat", "Method", "Optimizer", "Precision", "Route", "Strategy"),
    "defaults": ("DEFAULTS", "SetupDefaults", "launch_strategy"),
    "dtypes": ("DType",),
    "errors": ("InvalidValueError", "LaunchConflictError", "LaunchFileError", "NotAnOomMessageError", "OomlabError",
               "OutputFolderError", "PipelineError", "ReportError", "UnknownNameError"),
    "gpus": ("GPUSpec", "known_gpus", "load_gpu"),
    "models": ("ModelSpec", "known_models", "load_model"),
    "prices": ("load_prices", "resolve_host_ram"),
    "seed": ("SeedFigures", "is_seed_case", "seed_figures", "seed_report_text"),
    "setup": ("TrainingSetup", "make_setup"),
    "units": ("GiB", "KiB", "MiB", "format_signed_size", "format_size", "parse_size"),
})
