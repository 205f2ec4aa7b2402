"""Tests for oomlab.report: self-contained HTML from an executed notebook, built here without a kernel."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import nbformat
import pytest
from nbconvert import HTMLExporter

from oomlab.core.errors import ReportError
from oomlab.report.html import add_toc, network_references, raw_markdown, render_html, render_report

# A 1x1 transparent PNG, as a matplotlib output would carry it (base64 in the notebook).
PNG_B64 = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()
CODE_MARKER = "SECRET_CODE_MARKER = 42"

# What a browser would fetch; checked here independently of oomlab.report.NETWORK_PATTERNS.
FETCHING = (
    r"<script\b[^>]*\bsrc\s*=",
    r"<link\b[^>]*\bhref\s*=\s*[\"']?(?:https?:)?//",
    r"<(?:img|iframe|source|embed)\b[^>]*\bsrc\s*=\s*[\"']?(?:https?:)?//",
    r"@import",
    r"url\(\s*[\"']?(?:https?:)?//",
    r"https?://(?:cdn|unpkg)",
    r"cdnjs\.cloudflare\.com|unpkg\.com|cdn\.jsdelivr\.net|fonts\.googleapis\.com",
)


def output(output_type: str, **data: str) -> nbformat.NotebookNode:
    """A display_data / execute_result output with the given mime bundle."""
    if output_type == "execute_result":
        return nbformat.v4.new_output(output_type, data=data, execution_count=1)
    return nbformat.v4.new_output(output_type, data=data)


def executed_notebook(path: Path, extra_markdown: str = "") -> Path:
    """Write a notebook as papermill would leave it: code with outputs, markdown headings, widgets."""
    code = nbformat.v4.new_code_cell(CODE_MARKER + "\nprint('hello')", execution_count=1)
    code.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="hello from stdout\n"),
        output("display_data", **{"image/png": PNG_B64, "text/plain": "<Figure size 200x200>"}),
        output("execute_result", **{"text/plain": "13015864320"}),
    ]
    rich = nbformat.v4.new_code_cell("show_rich()", execution_count=2)
    rich.outputs = [
        output("display_data", **{"application/vnd.jupyter.widget-view+json": {"model_id": "abc",
               "version_major": 2, "version_minor": 0}, "text/plain": "WIDGET_FALLBACK"}),
        output("display_data", **{"application/javascript": "console.log(1)", "text/plain": "JS_FALLBACK"}),
        output("display_data", **{"text/vnd.mermaid": "graph TD; A-->B", "text/plain": "MERMAID_FALLBACK"}),
        output("display_data", **{"text/markdown": "## Generated section"}),
    ]
    silent = nbformat.v4.new_code_cell("SILENT_CELL_MARKER = 1", execution_count=3)
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# Why does llama-13b not fit?\n\nThe question this answers."),
            silent,
            nbformat.v4.new_markdown_cell(
                "## The failure\n\nSee [the docs](https://pytorch.org/docs/stable/notes/cuda.html)"
                " and $x^2$.\n\n### Details" + extra_markdown
            ),
            code,
            nbformat.v4.new_markdown_cell("## The failure\n\nSame title twice."),
            rich,
        ]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2,
                                                                           "version_minor": 0}}
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The report HTML of the synthetic executed notebook."""
    root = tmp_path_factory.mktemp("report")
    return render_report(executed_notebook(root / "01_x.ipynb"), root / "report.html").read_text()


@pytest.mark.parametrize("pattern", FETCHING)
def test_report_fetches_nothing(report: str, pattern: str) -> None:
    """No script src, remote link, @import, remote url() or CDN name is left in the report."""
    assert re.findall(pattern, report, re.IGNORECASE) == []


def test_report_has_no_script_at_all(report: str) -> None:
    """Widgets, JavaScript and mermaid outputs fall back to text, so no <script> remains."""
    assert "<script" not in report
    assert "WIDGET_FALLBACK" in report and "JS_FALLBACK" in report and "MERMAID_FALLBACK" in report


def test_report_keeps_text_links(report: str) -> None:
    """Plain <a href> links in markdown stay (a browser fetches them only when clicked)."""
    assert '<a href="https://pytorch.org/docs/stable/notes/cuda.html">the docs</a>' in report


def test_report_hides_code_and_prompts(report: str) -> None:
    """Code inputs and In/Out prompts are not in the report; the outputs are."""
    body = report[report.index("<main>"):]  # the CSS above names the prompt classes
    assert "SECRET_CODE_MARKER" not in report
    assert "jp-InputPrompt" not in body and "jp-OutputPrompt" not in body and "In&nbsp;[" not in body
    assert "hello from stdout" in report and "13015864320" in report


def test_report_drops_code_cells_without_output(report: str) -> None:
    """A code cell with no output leaves no empty box behind."""
    body = report[report.index("<main>"):]
    assert body.count("jp-CodeCell") == 2
    assert "SILENT_CELL_MARKER" not in report


def test_report_embeds_images(report: str) -> None:
    """The PNG output stays embedded as a base64 data URI."""
    assert f'src="data:image/png;base64,{PNG_B64}"' in report


def test_report_has_title_and_h1(report: str) -> None:
    """The page title defaults to the first H1, whose text is in the page."""
    assert "<title>Why does llama-13b not fit?</title>" in report
    assert re.search(r'<h1 id="Why-does-llama-13b-not-fit\?">Why does llama-13b not fit\?', report)


def test_report_has_table_of_contents(report: str) -> None:
    """A TOC lists the markdown headings (cells and markdown outputs) as links to their anchors."""
    toc = re.search(r'<nav aria-label="Contents" class="oomlab-toc">(.*?)</nav>', report, re.DOTALL)
    assert toc is not None
    links = re.findall(r'<li class="oomlab-toc-(h\d)"><a href="#([^"]+)">([^<]+)</a></li>', toc.group(1))
    assert links == [
        ("h1", "Why-does-llama-13b-not-fit?", "Why does llama-13b not fit?"),
        ("h2", "The-failure", "The failure"),
        ("h3", "Details", "Details"),
        ("h2", "The-failure-2", "The failure"),
        ("h2", "Generated-section", "Generated section"),
    ]
    for _, anchor, _ in links:
        assert report.count(f'id="{anchor}"') == 1


def test_toc_follows_title_cell(report: str) -> None:
    """The TOC comes right after the title cell, before the rest of the notebook."""
    assert report.index("<h1") < report.index('class="oomlab-toc"') < report.index('id="The-failure"')


def test_report_has_phone_css(report: str) -> None:
    """Viewport meta and the small readability CSS (max-width, scrolling tables, fitting images)."""
    assert '<meta content="width=device-width, initial-scale=1.0" name="viewport"/>' in report
    assert "img, svg { max-width: 100%; height: auto; }" in report
    assert re.search(r"table \{ display: block; max-width: 100%; overflow-x: auto; \}", report)


def test_lab_css_is_inlined(report: str) -> None:
    """JupyterLab's stylesheet is inlined in a <style>, not linked."""
    assert "--jp-content-font-family" in report
    assert "<link" not in report


def test_stock_lab_template_would_fetch(tmp_path: Path) -> None:
    """The stock lab template loads require.js and MathJax from a CDN: the template drops are needed."""
    nb = nbformat.read(executed_notebook(tmp_path / "01_x.ipynb"), as_version=4)
    html, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    found = " ".join(network_references(html))
    assert "require.min.js" in found or "require.js" in found
    assert "mathjax" in found.lower()


def test_explicit_title(tmp_path: Path) -> None:
    """An explicit title replaces the H1-derived one."""
    html = render_html(executed_notebook(tmp_path / "01_x.ipynb"), title="Custom <title>")
    assert "<title>Custom &lt;title&gt;</title>" in html


def test_report_replaces_existing_file_atomically(tmp_path: Path) -> None:
    """An existing report is replaced and no temporary file is left beside it."""
    target = tmp_path / "report.html"
    target.write_text("old")
    render_report(executed_notebook(tmp_path / "01_x.ipynb"), target)
    assert target.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01_x.ipynb", "report.html"]


def test_remote_image_is_refused_and_old_report_kept(tmp_path: Path) -> None:
    """A markdown image from the web makes rendering fail, leaving the old report byte-identical."""
    notebook = executed_notebook(tmp_path / "01_x.ipynb", extra_markdown="\n\n![plot](https://example.com/p.png)")
    target = tmp_path / "report.html"
    target.write_bytes(b"previous")
    with pytest.raises(ReportError) as info:
        render_report(notebook, target)
    assert str(info.value) == (
        "the report of 01_x.ipynb would load 1 resource(s) from the network"
        f' (<img alt="plot" src="https://example.com/p.png); embed them in the notebook instead;'
        f" {target} was left as it was"
    )
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01_x.ipynb", "report.html"]


@pytest.mark.parametrize(
    "snippet",
    [
        '<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js"></script>',
        '<script type="text/javascript" src="local.js"></script>',  # any script src, even relative
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">',
        "<link href='//example.com/x.css' rel=stylesheet>",  # protocol-relative
        "<style>@import url(x.css);</style>",
        '<div style="background: url(https://example.com/bg.png)"></div>',
        '<img src="http://example.com/a.png">',
        '<iframe src="https://example.com"></iframe>',
        'const m = await import("https://cdn.example.com/mermaid.mjs");',
        "see unpkg.com/@jupyter-widgets/html-manager",
    ],
)
def test_network_references_finds_fetches(snippet: str) -> None:
    """Each kind of fetching markup is reported."""
    assert network_references(f"<html><body>{snippet}</body></html>") != []


@pytest.mark.parametrize(
    "snippet",
    [
        '<a href="https://pytorch.org">docs</a>',  # a link is followed only when clicked
        '<svg xmlns="http://www.w3.org/2000/svg"></svg>',  # a namespace, not a fetch
        '<img src="data:image/png;base64,AAAA">',
        '<link rel="icon" href="data:,">',
    ],
)
def test_network_references_allows_inert_urls(snippet: str) -> None:
    """Links, XML namespaces and data URIs are not fetches."""
    assert network_references(snippet) == []


def test_add_toc_without_headings_is_identity() -> None:
    """HTML without markdown headings is returned unchanged."""
    html = "<html><body><main><p>no headings</p></main></body></html>"
    assert add_toc(html) == html


# ------------------------------------------------------------------------------------ raw Markdown


@pytest.mark.parametrize(
    ("snippet", "marker"),
    [
        ("<p>**As configured, no.** It fails.</p>", "bold"),
        ("<p>see ```\nx\n```</p>", "code fence"),
        ("<p>| config | strategy |\n|---|---|</p>", "table rule"),
        ("<p>| a |\n| --- |</p>", "table rule"),  # spaced rule
        ("<p>[the docs](https://pytorch.org/docs)</p>", "link"),
        ("<p>## The answer</p>", "heading"),
        ("<pre># Launching\n| --- |\n```\naccelerate launch\n```</pre>", "code fence"),  # LAUNCH.md shown raw
    ],
)
def test_raw_markdown_is_found(snippet: str, marker: str) -> None:
    """Each Markdown marker left as text is reported with its kind."""
    found = raw_markdown(f"<html><body><main>{snippet}</main></body></html>")
    assert any(item.startswith(marker) for item in found), found


@pytest.mark.parametrize(
    "snippet",
    [
        "<p><strong>As configured, no.</strong> <a href='https://x.org'>the docs</a></p>",
        "<pre>def f(**kwargs):\n    return kwargs</pre>",  # Python in code
        "<pre># accelerate config\ndistributed_type: MULTI_GPU</pre>",  # a YAML comment in code
        "<table><tr><th>#</th><th>remedy</th></tr></table>",  # the ranked table's '#' column
        "<style>.a { x: 1 } /* ** */</style><p>ok</p>",
    ],
)
def test_rendered_markdown_is_clean(snippet: str) -> None:
    """Rendered Markdown, code and CSS are not mistaken for raw Markdown."""
    assert raw_markdown(f"<html><head></head><body><main>{snippet}</main></body></html>") == []


LAUNCH_SAMPLE = """# Launching the remedies

Written by oomlab, for `<script>alert(1)</script>` (a model path), run **here**.

| config | strategy | what accelerate builds |
|---|---|---|
| `accelerate_ddp.yaml` | `ddp` | DistributedDataParallel |

## DDP · QLoRA r8

```
accelerate launch --config_file accelerate_ddp.yaml --num_processes 4 train.py --model '<b>x</b>'
```
"""


def markdown_notebook(path: Path, *markdown_outputs: str) -> Path:
    """An executed notebook whose code cells display the given Markdown, as ``display(Markdown(...))`` leaves it."""
    cells = [nbformat.v4.new_markdown_cell("# The report\n\nIntro.")]
    for k, text in enumerate(markdown_outputs, start=1):
        cell = nbformat.v4.new_code_cell("display(Markdown(x))", execution_count=k)
        cell.outputs = [output("display_data", **{"text/markdown": text, "text/plain": "<Markdown>"})]
        cells.append(cell)
    nb = nbformat.v4.new_notebook(cells=cells)
    nbformat.write(nb, path)
    return path


def test_launch_md_renders_as_markdown(tmp_path: Path) -> None:
    """LAUNCH.md in the report: a table, a heading below the report's own and a code block; no marker left, the
    model path's markup escaped in text and code alike, the file's headings kept out of the contents."""
    from oomlab.report.story import config_block

    html = render_html(markdown_notebook(tmp_path / "04.ipynb", config_block("LAUNCH.md", LAUNCH_SAMPLE)))
    assert raw_markdown(html) == []
    assert "<table" in html and "<h4" in html and "<strong>here</strong>" in html
    assert "<script>alert(1)</script>" not in html and "<b>x</b>" not in html
    assert "accelerate launch --config_file accelerate_ddp.yaml" in html
    toc = re.search(r"<nav\b[^>]*oomlab-toc.*?</nav>", html, re.DOTALL).group(0)
    assert "The report" in toc and "Launching the remedies" not in toc


def test_config_block_of_a_config_is_code(tmp_path: Path) -> None:
    """A YAML config is one escaped code block, its comments kept as text, not turned into headings."""
    from oomlab.report.story import config_block

    yaml = "# written by oomlab\ndistributed_type: MULTI_GPU\nnum_processes: 4\n"
    html = render_html(markdown_notebook(tmp_path / "04.ipynb", config_block("accelerate_ddp.yaml", yaml)))
    assert "<pre># written by oomlab\ndistributed_type: MULTI_GPU" in html
    assert raw_markdown(html) == []


def test_markdown_shown_as_text_is_caught(tmp_path: Path) -> None:
    """The old way (Markdown as plain text output) leaves markers that the check names."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T")])
    cell = nbformat.v4.new_code_cell("print(doc)", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=LAUNCH_SAMPLE)]
    nb.cells.append(cell)
    nbformat.write(nb, tmp_path / "x.ipynb")
    found = raw_markdown(render_html(tmp_path / "x.ipynb"))
    assert {f.split(":")[0] for f in found} >= {"code fence in code", "table rule in code"}


def test_committed_screenshots_are_the_scripts() -> None:
    """docs/screenshots/ holds one PNG per width and section that scripts/screenshot_report.py shoots, at that width
    (times the device scale), so a new section or width is shot and committed too."""
    import importlib.util
    import struct

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("screenshot_report", root / "scripts" / "screenshot_report.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    expected = {f"{name}-{stem}.png": (width * scale, height * scale)
                for name, width, height, scale in script.VIEWPORTS for stem, _ in script.SECTIONS}
    assert {p.name for p in script.OUT_DIR.glob("*.png")} == set(expected)
    for name, size in expected.items():
        head = (script.OUT_DIR / name).read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == size, name
