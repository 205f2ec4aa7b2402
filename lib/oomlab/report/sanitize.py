"""The one place user text becomes HTML: every rendered cell is cleaned by an allow-list, and the page is checked.

oomlab escapes what a user supplies where it writes it (:mod:`oomlab.core.markdown`), but a report is built from
many notebooks and display functions: one missed field would be live markup in a page a user opens.  So the report
template renders every Markdown cell and every HTML or Markdown output through :func:`clean_html` (Ammonia, through
``nh3``: tags and attributes from an allow-list, no ``on*`` handler, no ``<script>``, ``<style>``, ``<iframe>`` or
form, links only to ``http``/``https``/``mailto``, relative addresses and the page's own anchors, images only from
relative addresses or embedded PNG/JPEG/GIF/WebP data), and :func:`live_markup` parses the finished page to prove it:
:func:`oomlab.report.html.render_report` refuses to write a page where it finds anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache

import nh3

# What oomlab's own cells use, on top of Ammonia's defaults: heading anchors and table classes need id/class;
# nbconvert's images carry width/height; tables their alignment.
ALLOWED_TAGS = frozenset(nh3.ALLOWED_TAGS)
GENERIC_ATTRIBUTES = frozenset({"class", "id", "title", "align", "lang", "dir"})
STYLE_PROPERTIES = frozenset({"text-align"})  # the only inline style kept (table cells): no position, no url()
URL_SCHEMES = frozenset({"http", "https", "mailto", "data"})  # data: only as an embedded image (see _attribute)
_IMAGE_DATA = re.compile(r"data:image/(?:png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]*\Z", re.IGNORECASE)
_URL_ATTRIBUTES = frozenset({"href", "src", "cite", "action", "formaction", "xlink:href", "poster", "background",
                             "data", "srcset", "longdesc", "usemap", "manifest", "codebase", "ping"})


def _attribute(tag: str, name: str, value: str) -> str | None:
    """Ammonia's attribute filter: a ``data:`` address survives only as an image's embedded raster."""
    if name in _URL_ATTRIBUTES and value.strip().lower().startswith("data:"):
        return value if tag == "img" and name == "src" and _IMAGE_DATA.match(value.strip()) else None
    return value


@cache
def _attributes() -> dict[str, set[str]]:
    allowed = {tag: set(names) for tag, names in nh3.ALLOWED_ATTRIBUTES.items()}
    allowed["*"] = set(GENERIC_ATTRIBUTES)
    for cell in ("th", "td"):  # Markdown tables align their columns with style="text-align: right"
        allowed[cell] = allowed[cell] | {"style"}
    return allowed


def clean_html(fragment: str | bytes) -> str:
    """``fragment`` with everything but the allow-listed tags, attributes and addresses removed (see the module).

    Used as nbconvert's ``clean_html`` filter by the report template, on every Markdown cell and HTML/Markdown output.
    """
    text = fragment.decode("utf-8") if isinstance(fragment, bytes) else str(fragment)
    return nh3.clean(text, tags=set(ALLOWED_TAGS), attributes=_attributes(), url_schemes=set(URL_SCHEMES),
                     attribute_filter=_attribute, link_rel=None, strip_comments=True,
                     filter_style_properties=set(STYLE_PROPERTIES))


# --- the check of a finished page ---------------------------------------------------------------------------------

_BAD_SCHEME = re.compile(r"^\s*(?:javascript|vbscript|data|file)\s*:", re.IGNORECASE)
_ALIGN_ONLY = re.compile(r"\s*(?:text-align\s*:\s*(?:left|right|center)\s*;?\s*)?\Z", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x20\x7f]+")  # browsers ignore these inside a scheme: "java\tscript:"
LIVE_TAGS = ("script", "iframe", "frame", "object", "embed", "applet", "form", "base", "link", "meta", "svg", "math",
             "template", "noscript")


def _scheme_is_live(tag: str, name: str, value: str) -> bool:
    squeezed = _CONTROL.sub("", value)
    if not _BAD_SCHEME.match(squeezed):
        return False
    return not (tag == "img" and name == "src" and _IMAGE_DATA.match(squeezed))


def live_markup(html: str, allowed_head: tuple[str, ...] = ("meta", "link", "style", "title")) -> list[str]:
    """Every piece of ``html`` a browser would run or follow as code: an ``on*`` attribute, a
    ``javascript:``/``vbscript:``/``data:``/``file:`` address (an embedded raster image aside), a ``<script>`` or
    other active element, an inline ``style`` attribute other than a cell's alignment; empty for a safe page.

    The page's ``<head>`` may hold oomlab's own ``meta``/``link``/``style``/``title`` (the template's); nothing in
    the body may hold a live element.
    """
    return list(_findings(html, allowed_head))


def _findings(html: str, allowed_head: tuple[str, ...]) -> Iterator[str]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, features="html.parser")
    head = soup.find("head")
    for tag in soup.find_all(True):
        in_head = head is not None and (tag is head or head in tag.parents)
        name = tag.name.lower()
        if name in LIVE_TAGS and not (in_head and name in allowed_head):
            yield f"<{name}> element: {str(tag)[:80]!r}"
        for attr, value in tag.attrs.items():
            attr = attr.lower()
            text = " ".join(value) if isinstance(value, list) else str(value)
            if attr.startswith("on"):
                yield f"{attr} attribute on <{name}>: {text[:80]!r}"
            elif attr == "style" and not in_head and not _ALIGN_ONLY.match(text):
                yield f"style attribute on <{name}>: {text[:80]!r}"
            elif attr in _URL_ATTRIBUTES and _scheme_is_live(name, attr, text):
                yield f"{attr} address on <{name}>: {text[:80]!r}"
