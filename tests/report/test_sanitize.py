"""No user text becomes live markup in the report (oomlab.report.sanitize, through oomlab.report.html)."""

from __future__ import annotations

import nbformat
import pytest

from oomlab.core.errors import ReportError
from oomlab.report.html import render_html, render_report
from oomlab.report.sanitize import clean_html, live_markup

# Each row: hostile HTML a cell could carry, and what must not survive it.
ATTACKS = [
    ("<img src=x onerror=alert(1)>", "onerror"),
    ("<a href='javascript:alert(3)'>x</a>", "javascript:"),
    ("<a href=' JaVa\tScRiPt:alert(3)'>x</a>", "script:"),  # case and control characters inside the scheme
    ("<a href='vbscript:msgbox(1)'>x</a>", "vbscript:"),
    ("<a href='data:text/html;base64,PHNjcmlwdD4='>x</a>", "data:"),
    ("<img src='data:image/svg+xml;base64,PHN2Zz4='>", "data:"),
    ("<script>alert(2)</script>", "<script"),
    ("<svg onload=alert(5)></svg>", "<svg"),
    ("<iframe src='https://x.org'></iframe>", "<iframe"),
    ("<form action='https://x.org'><input></form>", "<form"),
    ("<b style='position:fixed;top:0'>x</b>", "style="),
    ("<meta http-equiv=refresh content='0;url=javascript:1'>", "<meta"),
]


@pytest.mark.parametrize(("attack", "gone"), ATTACKS)
def test_clean_html_removes_live_markup(attack: str, gone: str) -> None:
    """The allow-list drops handlers, active elements, inline styles and every scheme but http(s)/mailto/relative."""
    cleaned = clean_html(attack)
    assert gone.lower() not in cleaned.lower()
    assert live_markup(f"<html><body>{cleaned}</body></html>") == []


@pytest.mark.parametrize(("attack", "gone"), ATTACKS)
def test_live_markup_finds_each_attack(attack: str, gone: str) -> None:
    """The page check finds each attack that the cleaning would have removed (it can fail)."""
    assert live_markup(f"<html><body>{attack}</body></html>")


def test_clean_html_keeps_what_the_report_uses() -> None:
    """Headings with anchors, tables with classes, relative and https links and embedded PNGs are kept as written."""
    ours = ('<h2 id="the-fix">The fix<a class="anchor-link" href="#the-fix">¶</a></h2>'
            '<table class="oomlab"><caption>c</caption><thead><tr><th>a</th></tr></thead>'
            '<tbody><tr><td>1</td></tr></tbody></table>'
            '<p><a href="https://pytorch.org/docs">docs</a> <code>x</code></p>'
            '<img alt="a figure" src="data:image/png;base64,iVBORw0KGgo=">')
    assert clean_html(ours) == ours


def _notebook(tmp_path, markdown: str, html: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(f"# Report\n\n{markdown}"),
                nbformat.v4.new_code_cell("x", outputs=[
                    nbformat.v4.new_output("display_data", data={"text/html": html, "text/plain": "x"}),
                    nbformat.v4.new_output("display_data", data={"text/markdown": markdown, "text/plain": "x"})])]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_rendered_report_carries_no_live_markup(tmp_path) -> None:
    """Markdown cells, Markdown outputs and HTML outputs full of attacks render to a page with no live markup."""
    attacks = " ".join(a for a, _ in ATTACKS) + " [click me](javascript:alert(3)) ![i](javascript:alert(4))"
    html = render_html(_notebook(tmp_path, attacks, attacks))
    assert live_markup(html) == []
    body = html.split("<main>", 1)[1].lower()  # the head's CSS names ".validationerrors"
    for needle in ("onerror=", '="javascript:', "vbscript:", "<script", "<iframe", "<svg"):
        assert needle not in body, needle


def test_render_report_refuses_live_markup_and_keeps_the_old_page(tmp_path, monkeypatch) -> None:
    """A page with live markup (should the cleaning miss one) is refused and the previous report left as it was."""
    import oomlab.report.html as report_html

    out = tmp_path / "report.html"
    out.write_text("previous")
    monkeypatch.setattr(report_html, "render_html", lambda *a, **k: "<html><body><b onclick=x>b</b></body></html>")
    with pytest.raises(ReportError, match="live markup.*onclick"):
        render_report(tmp_path / "nb.ipynb", out)
    assert out.read_text() == "previous"


def test_table_alignment_is_the_only_style_kept() -> None:
    """A Markdown table's column alignment survives; any other property of a style attribute is dropped."""
    cleaned = clean_html('<table><tr><th style="text-align:right">a</th>'
                         '<td style="text-align: right; position: fixed; background: url(https://x.org)">b</td>'
                         '</tr></table><b style="color: red">x</b>')
    assert cleaned == ('<table><tbody><tr><th style="text-align:right">a</th><td style="text-align:right">b</td>'
                       '</tr></tbody></table><b>x</b>')
    assert live_markup(f"<html><body>{cleaned}</body></html>") == []
