"""Stage 8: the report -- results JSON builders, the story told from them, tables, figures (one palette), and the
self-contained HTML."""

from oomlab.core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "html": ("render_html", "render_report"),
    "results": ("budget_results", "load_results", "plan_results", "reproduce_results", "write_results"),
    "tables": ("html_table", "show_table"),
})
