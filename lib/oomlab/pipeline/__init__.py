"""Stage 9: the pipeline -- the parameter registry (no torch on import) and the papermill runner."""

from oomlab.core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "kernel": ("run_notebook",),
    "params": ("notebook_launch", "parse_params"),
    "runner": ("PipelineResult", "run_pipeline"),
})
