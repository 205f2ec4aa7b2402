"""Render an executed notebook as one self-contained HTML file: no code, no network, a table of contents.

nbconvert's ``HTMLExporter`` with the ``oomlab`` template (``templates/oomlab/``, JupyterLab's template
without the blocks that load require.js, MathJax, mermaid or the widget manager from a CDN).  Images
stay embedded as base64, the lab CSS is inlined by nbconvert, and :func:`render_report` refuses to write
HTML that a browser would fetch anything for (:func:`network_references`).  Every Markdown cell and every HTML or
Markdown output is cleaned by :func:`oomlab.report.sanitize.clean_html` (nbconvert's ``sanitize_html`` with oomlab's
allow-list in place of its own filter), and :func:`render_report` refuses a page with live markup
(:func:`oomlab.report.sanitize.live_markup`): no text a user supplied can become a script, a handler or a link.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from oomlab.core.errors import ReportError
from oomlab.core.files import write_text_atomic
from oomlab.core.paths import TEMPLATES_DIR
from oomlab.report.sanitize import clean_html, live_markup

TEMPLATE_NAME = "oomlab"
TOC_LEVELS = ("h1", "h2", "h3")

# Output types a static page can show; widget views, JavaScript and mermaid need a script from a CDN,
# so their outputs fall back to the next type they carry (PNG, plain text).
DISPLAY_PRIORITY = (
    "text/html",
    "text/markdown",
    "image/svg+xml",
    "text/latex",
    "image/png",
    "image/jpeg",
    "text/plain",
)

# What a browser would fetch on opening the page.  <a href> links are not fetched and are allowed.
_URL = r"""[^\s"'<>)]*"""  # the rest of the address, so the error shows what would be fetched
_REMOTE = r"""\s*=\s*["']?\s*(?:https?:)?//""" + _URL
NETWORK_PATTERNS = (
    re.compile(r"""<script\b[^>]*\bsrc\s*=\s*["']?""" + _URL, re.IGNORECASE),
    re.compile(r"<link\b[^>]*\bhref" + _REMOTE, re.IGNORECASE),
    re.compile(r"<(?:img|iframe|audio|video|source|track|embed|input)\b[^>]*\b(?:src|srcset)" + _REMOTE,
               re.IGNORECASE),
    re.compile(r"<object\b[^>]*\bdata" + _REMOTE, re.IGNORECASE),
    re.compile(r"\bxlink:href" + _REMOTE, re.IGNORECASE),
    re.compile(r"""@import\b\s*(?:url\()?\s*["']?""" + _URL, re.IGNORECASE),
    re.compile(r"""url\(\s*["']?\s*(?:https?:)?//""" + _URL, re.IGNORECASE),
    re.compile(r"""\bimport\(\s*["'](?:https?:)?//""" + _URL, re.IGNORECASE),
    re.compile(r"(?:cdnjs\.cloudflare\.com|cdn\.jsdelivr\.net|unpkg\.com|fonts\.googleapis\.com)" + _URL,
               re.IGNORECASE),
)


def network_references(html: str) -> list[str]:
    """Every snippet of ``html`` that would make a browser fetch from the network (empty when none)."""
    return [m.group(0) for pattern in NETWORK_PATTERNS for m in pattern.finditer(html)]


# Markdown that a reader should never see as text: it means a block went through as plain text (or inside <pre>)
# instead of being rendered.  In code (<pre>, <code>) only a fence or a table rule counts: ``**kwargs`` is Python and
# ``# comment`` YAML, but no config or command holds a Markdown fence or table.
RAW_MARKDOWN_PATTERNS = (
    ("bold", re.compile(r"\*\*")),
    ("code fence", re.compile(r"```")),
    ("table rule", re.compile(r"\|\s*:?-{3,}:?\s*\|")),
    ("link", re.compile(r"\[[^\]\n]{1,200}\]\((?:https?://|#|\.{0,2}/)[^)\s]{0,300}\)")),
    ("heading", re.compile(r"(?m)^[ \t]{0,3}#{1,6}[ \t]+\S")),
)


IN_CODE = ("code fence", "table rule")


def raw_markdown(html: str) -> list[str]:
    """Every Markdown marker left as text in ``html`` (``**``, a code fence, a table rule, a link, a heading line;
    in code, a fence or a table rule only); empty when the page shows only rendered Markdown."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, features="html.parser")
    for tag in soup(["style", "script", "head"]):
        tag.decompose()
    code = [tag.extract() for tag in soup(["pre", "code"])]
    found = [f"{name}: {m.group(0)[:80]!r}" for name, pattern in RAW_MARKDOWN_PATTERNS
             for m in pattern.finditer(soup.get_text("\n"))]
    for tag in code:
        text = tag.get_text()
        found += [f"{name} in code: {m.group(0)[:80]!r}" for name, pattern in RAW_MARKDOWN_PATTERNS
                  if name in IN_CODE for m in pattern.finditer(text)]
    return found


def _title(nb: object, fallback: str) -> str:
    """The text of the notebook's first markdown H1, else ``fallback``."""
    for cell in nb.cells:  # type: ignore[attr-defined]
        if cell.cell_type == "markdown":
            match = re.search(r"^#\s+(.+?)\s*#*\s*$", cell.source, re.MULTILINE)
            if match:
                return match.group(1)
    return fallback


def add_toc(html: str) -> str:
    """Insert a table of contents (links to the markdown headings' anchors) after the title cell."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, features="html.parser")
    main = soup.find("main")
    if main is None:
        return html
    headings = [h for h in main.select(".jp-RenderedMarkdown " + ", .jp-RenderedMarkdown ".join(TOC_LEVELS))
                if h.get("id")]
    if not headings:
        return html
    seen: dict[str, int] = {}
    nav = soup.new_tag("nav", attrs={"class": "oomlab-toc", "aria-label": "Contents"})
    heading = soup.new_tag("strong")
    heading.string = "Contents"
    nav.append(heading)
    items = soup.new_tag("ul")
    nav.append(items)
    for h in headings:
        anchor = h["id"]
        seen[anchor] = seen.get(anchor, 0) + 1
        if seen[anchor] > 1:  # nbconvert repeats ids for repeated heading texts; make each link unique
            anchor = f"{anchor}-{seen[anchor]}"
            h["id"] = anchor
            for link in h.select("a.anchor-link"):
                link["href"] = f"#{anchor}"
        text = "".join(s for s in h.strings if s.find_parent("a", class_="anchor-link") is None).strip()
        item = soup.new_tag("li", attrs={"class": f"oomlab-toc-{h.name}"})
        link = soup.new_tag("a", href=f"#{anchor}")
        link.string = text
        item.append(link)
        items.append(item)
    first_cell = main.find("div", class_="jp-Cell")
    if first_cell is not None and first_cell.find("h1") is not None:
        first_cell.insert_after(nav)
    else:
        main.insert(0, nav)
    return str(soup)


def render_html(executed_notebook: str | os.PathLike[str], title: str | None = None) -> str:
    """The report HTML of an executed notebook: outputs and markdown only, everything inlined."""
    import nbformat
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    path = Path(executed_notebook)
    nb = nbformat.read(path, as_version=4)
    title = title or _title(nb, path.stem)
    nb.metadata["title"] = title
    # Inputs are hidden, so a code cell without outputs would only leave an empty box.
    nb.cells = [c for c in nb.cells if c.cell_type != "code" or c.get("outputs")]
    config = Config({"NbConvertBase": {"display_data_priority": list(DISPLAY_PRIORITY)}})
    exporter = HTMLExporter(
        config=config,
        template_name=TEMPLATE_NAME,
        extra_template_basedirs=[str(TEMPLATES_DIR)],
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
        theme="light",
        sanitize_html=True,  # the lab template then passes every cell and HTML/Markdown output through clean_html
    )
    exporter.register_filter("clean_html", clean_html)  # oomlab's allow-list instead of nbconvert's bleach one
    resources = {"metadata": {"name": title, "path": str(path.parent)}}
    html, _ = exporter.from_notebook_node(nb, resources=resources)
    return add_toc(html)


def render_report(
    executed_notebook: str | os.PathLike[str], html_path: str | os.PathLike[str], title: str | None = None
) -> Path:
    """Render ``executed_notebook`` to ``html_path`` (atomically); the title defaults to its first H1."""
    html = render_html(executed_notebook, title)
    live = live_markup(html)
    if live:
        raise ReportError(
            f"the report of {Path(executed_notebook).name} would carry {len(live)} piece(s) of live markup"
            f" ({'; '.join(live[:5])}); {html_path} was left as it was"
        )
    found = network_references(html)
    if found:
        shown = "; ".join(sorted(set(found))[:5])
        raise ReportError(
            f"the report of {Path(executed_notebook).name} would load {len(found)} resource(s) from the"
            f" network ({shown}); embed them in the notebook instead; {html_path} was left as it was"
        )
    return write_text_atomic(html_path, html)
