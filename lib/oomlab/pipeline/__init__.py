"""Stage 9: the pipeline -- the parameter registry (no torch on import) and the papermill runner."""
