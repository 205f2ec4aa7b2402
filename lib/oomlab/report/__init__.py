"""Stage 8: the report -- results JSON builders, the story told from them, tables, figures (one palette), and the
self-contained HTML."""
