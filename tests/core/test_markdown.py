"""User text in Markdown reads as the user's characters, whatever they are (oomlab.core.markdown)."""

from __future__ import annotations

import pytest
from bs4 import BeautifulSoup
from hypothesis import given, settings
from hypothesis import strategies as st
from nbconvert.filters.markdown_mistune import markdown2html_mistune

from oomlab.core.markdown import markdown_table, md_code, md_code_block, md_text

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "[click me](javascript:alert(3))",
    "a\\`b`c",  # a backslash before a backtick: the bypass of the old esc_markdown
    "``x``",
    "*star* _under_ #hash ~~strike~~",
    "a|b",
    "trailing\\",
    "&amp; &lt;script&gt;",
    "<script>alert(2)</script>",
    "![img](data:text/html;base64,PHNjcmlwdD4=)",
]


def _rendered_text(markdown: str) -> tuple[str, str]:
    html = markdown2html_mistune(markdown)
    return html, BeautifulSoup(html, "html.parser").get_text().strip()


@pytest.mark.parametrize("text", HOSTILE)
@pytest.mark.parametrize("escape", [md_text, md_code])
def test_user_text_renders_as_its_characters(escape, text) -> None:
    """md_text and md_code render to exactly the user's characters and to no element but text (or one <code>)."""
    html, shown = _rendered_text(escape(text))
    assert shown == text
    tags = {t.name for t in BeautifulSoup(html, "html.parser").find_all(True)}
    assert tags <= {"p", "code"}, html


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")), max_size=40))
def test_any_text_round_trips(text: str) -> None:
    """Random text (control characters and line breaks aside: those become spaces) reads back unchanged."""
    for escape in (md_text, md_code):
        html, shown = _rendered_text(escape(text))
        assert shown == text.strip(), (escape.__name__, text, html)


def test_code_block_fence_outlasts_the_text() -> None:
    """A fence inside the text cannot close the block: the block is fenced longer."""
    block = md_code_block("a ``` b\n```\n<b>c</b>")
    assert block.startswith("````\n")
    html, shown = _rendered_text(block)
    assert shown == "a ``` b\n```\n<b>c</b>"


def test_table_cells_keep_escaped_pipes() -> None:
    """A user's pipe, escaped by md_text, is not escaped twice (which would split the cell)."""
    html, _ = _rendered_text(markdown_table(["h"], [[md_text("a|b")], ["p|q"]]))
    cells = [td.get_text() for td in BeautifulSoup(html, "html.parser").find_all("td")]
    assert cells == ["a|b", "p|q"]
