"""Stage 7: the pipeline -- the parameter registry (no torch on import) and the papermill runner."""
