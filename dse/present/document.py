"""A run's report as one document, written two ways: Markdown (``summary.md``) and a
self-contained HTML page (``report.html``).

``dse.present.report`` builds a :class:`Document` once from what the run stored; the two
renderers here only lay it out, so the summary and the page never disagree. A document is
a title and a list of :class:`Section` s; a section holds blocks:

- ``str``: a paragraph. Two inline marks of Markdown are used, ``**bold**`` and
  ```code```; the HTML renderer turns them into ``<strong>`` and ``<code>`` after escaping;
- :class:`Bullets`: a list of short lines;
- :class:`Code`: lines to type (a command), verbatim;
- :class:`Table`: a header and rows of text cells;
- :class:`Figures`: PNG files of the run folder with captions (links in Markdown; images
  embedded as ``data:`` URIs in HTML).

A block or section with ``only="markdown"`` or ``only="html"`` appears in that rendering
alone (the summary shows 10 Pareto designs spread over the front, the page all of them).

The HTML page needs nothing at view time: CSS inline, images embedded, and a
Content-Security-Policy that forbids every fetch but ``data:`` images, so a page that asked
the network for anything would be refused by the browser (and show it in its console). A
figure with a chart (``Figure.chart``) is drawn by the document's library (plotly.js),
inlined once in the page's head; the policy allows the page's own scripts alone, each by its
SHA-256.
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from basis.errors import DseError

MARKDOWN = "markdown"
HTML = "html"


@dataclass(frozen=True)
class Bullets:
    """A bulleted list of lines (inline marks as in paragraphs)."""
    items: list[str]
    only: str | None = None


@dataclass(frozen=True)
class Code:
    """Lines to type, verbatim (a shell command): a fenced block in Markdown, ``<pre>`` in HTML."""
    text: str
    only: str | None = None


@dataclass(frozen=True)
class Table:
    """A table of text cells; ``caption`` says what it lists (a line above it in Markdown);
    ``id`` names it in HTML (``<table id=...>``)."""
    header: list[str]
    rows: list[list[str]]
    id: str = ""
    caption: str = ""
    only: str | None = None


@dataclass(frozen=True)
class Figure:
    """A PNG file of the run folder (``file``: its name) and what it shows; ``chart``: the
    same figure as an interactive chart (``dse.present.interactive``: {"data", "layout",
    "config"}), shown in HTML instead of the image."""
    file: str
    caption: str
    chart: dict | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Figures:
    """A group of figures: a list of links in Markdown, images in HTML."""
    items: list[Figure]
    only: str | None = None


@dataclass
class Section:
    """A heading (``level`` 2 or 3; no heading when ``title`` is empty) and its blocks."""
    title: str
    blocks: list = field(default_factory=list)
    level: int = 2
    id: str = ""
    only: str | None = None


@dataclass
class Document:
    """A report: its title (the study's name) and sections, in reading order; ``library``:
    the JavaScript the HTML page's charts are drawn with (plotly.js), inlined once in the
    page when a figure has a chart."""
    title: str
    sections: list[Section]
    library: str = ""


def _shown(x, where: str) -> bool:
    return getattr(x, "only", None) in (None, where)


# --------------------------------------------------------------------------- Markdown

def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table ('|' in a cell escaped)."""
    esc = [[str(c).replace("|", "\\|") for c in r] for r in [header] + rows]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return "\n".join(lines)


def _md_block(b) -> str:
    if isinstance(b, str):
        return b
    if isinstance(b, Bullets):
        return "\n".join(f"- {x}" for x in b.items)
    if isinstance(b, Code):
        return f"```sh\n{b.text}\n```"
    if isinstance(b, Table):
        return (f"{b.caption}\n\n" if b.caption else "") + md_table(b.header, b.rows)
    if isinstance(b, Figures):
        return "\n".join(f"- [{f.file}]({f.file}): {f.caption}" for f in b.items)
    raise TypeError(f"not a document block: {b!r}")


def markdown(doc: Document) -> str:
    """The document as Markdown text (ends with a newline)."""
    lines = [f"# {doc.title}"]
    for s in doc.sections:
        if not _shown(s, MARKDOWN):
            continue
        if s.title:
            lines += ["", "#" * s.level + " " + s.title]
        for b in s.blocks:
            if _shown(b, MARKDOWN):
                lines += ["", _md_block(b)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- HTML

#: every fetch refused but images written into the page and its own style sheet (and, with
#: charts, its own scripts, each allowed by its SHA-256: ``script-src``)
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:72rem;padding:1rem 2rem;
color:#1a1a1a;line-height:1.45}
h1{margin-bottom:.2rem}h2{border-bottom:1px solid #ccc;padding-bottom:.2rem;margin-top:2rem}
nav ol{columns:2;font-size:.95rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.9rem;display:block;overflow-x:auto}
th,td{border:1px solid #d0d0d0;padding:.25rem .5rem;text-align:left;white-space:nowrap}
caption{text-align:left;font-style:italic;padding:.2rem 0}th{background:#f0f0f0}
td.num{text-align:right;font-variant-numeric:tabular-nums}tbody tr:nth-child(even){background:#fafafa}
figure{margin:1rem 0 2rem}figure img{max-width:100%;height:auto;border:1px solid #eee}
.chart{width:100%;min-height:420px;border:1px solid #eee}
figcaption{font-size:.9rem;color:#444}code{background:#f3f3f3;padding:0 .2rem;border-radius:3px}
pre{background:#f3f3f3;padding:.6rem;overflow-x:auto}
""".strip()

_NUMBER = re.compile(r"^[-+$]?\d[\d,.]*(e[-+]?\d+)?( \S+)?( %)?$")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")


def inline_html(text: str) -> str:
    """``text`` escaped for HTML, then ``**bold**`` and ```code``` marked up."""
    t = html.escape(str(text), quote=True)
    t = _CODE.sub(r"<code>\1</code>", t)
    return _BOLD.sub(r"<strong>\1</strong>", t)


def _attr(name: str, value: str) -> str:
    return f' {name}="{html.escape(value, quote=True)}"' if value else ""


def _cell(tag: str, text: str) -> str:
    cls = ' class="num"' if tag == "td" and _NUMBER.match(str(text)) else ""
    return f"<{tag}{cls}>{html.escape(str(text))}</{tag}>"


def _png_uri(folder: Path, name: str) -> str:
    """``folder/name`` (a PNG) as a ``data:`` URI; DseError when it is missing or not a PNG."""
    path = folder / name
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DseError(f"{path}: cannot embed the plot in report.html: {e.strerror or e}") from None
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise DseError(f"{path}: not a PNG image; cannot embed it in report.html")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _chart(f: Figure, scripts: list[str]) -> str:
    """A figure's chart: a div and the script that draws it (appended to ``scripts``, whose
    hashes the page's policy allows)."""
    div = "chart-" + re.sub(r"[^A-Za-z0-9_-]", "-", Path(f.file).stem)
    code = (f"Plotly.newPlot({json.dumps(div)},{json.dumps(f.chart['data'], allow_nan=False)},"
            f"{json.dumps(f.chart['layout'], allow_nan=False)},{json.dumps(f.chart.get('config', {}))});")
    code = code.replace("</", "<\\/")
    scripts.append(code)
    return f'<div id="{div}" class="chart"></div><script>{code}</script>'


def _html_block(b, folder: Path, scripts: list[str]) -> str:
    if isinstance(b, str):
        return f"<p>{inline_html(b)}</p>"
    if isinstance(b, Bullets):
        return "<ul>" + "".join(f"<li>{inline_html(x)}</li>" for x in b.items) + "</ul>"
    if isinstance(b, Code):
        return f"<pre><code>{html.escape(b.text)}</code></pre>"
    if isinstance(b, Table):
        head = "<tr>" + "".join(_cell("th", h) for h in b.header) + "</tr>"
        body = "".join("<tr>" + "".join(_cell("td", c) for c in r) + "</tr>" for r in b.rows)
        caption = f"<caption>{inline_html(b.caption)}</caption>" if b.caption else ""
        return f"<table{_attr('id', b.id)}>{caption}<thead>{head}</thead><tbody>{body}</tbody></table>"
    if isinstance(b, Figures):
        return "".join(
            f'<figure{_attr("id", "plot-" + Path(f.file).stem)}>'
            + (_chart(f, scripts) if f.chart else f'<img src="{_png_uri(folder, f.file)}"{_attr("alt", f.caption)}>')
            + f"<figcaption><code>{html.escape(f.file)}</code>: {inline_html(f.caption)}"
            + (" (interactive: hover a design for its parameters, click the legend to hide a group, drag to zoom, "
               "double-click to reset)" if f.chart else "") + "</figcaption></figure>" for f in b.items)
    raise TypeError(f"not a document block: {b!r}")


def _sha256(code: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(code.encode()).digest()).decode() + "'"


def html_page(doc: Document, folder: Path) -> str:
    """The document as one self-contained HTML page; figures are read from ``folder``. With
    charts, ``doc.library`` is inlined once in the head, and the policy allows exactly the
    page's scripts (by their SHA-256), nothing fetched."""
    folder = Path(folder)
    sections = [s for s in doc.sections if _shown(s, HTML)]
    nav = "".join(f'<li><a href="#{html.escape(s.id)}">{inline_html(s.title)}</a></li>'
                  for s in sections if s.title and s.id and s.level == 2)
    scripts: list[str] = []
    body = [f"<body><header><h1>{html.escape(doc.title)}</h1></header>"]
    if nav:
        body.append(f'<nav aria-label="contents"><ol>{nav}</ol></nav>')
    body.append("<main>")
    for s in sections:
        body.append(f"<section{_attr('id', s.id)}>")
        if s.title:
            level = min(max(s.level, 2), 6)
            body.append(f"<h{level}>{inline_html(s.title)}</h{level}>")
        body += [_html_block(b, folder, scripts) for b in s.blocks if _shown(b, HTML)]
        body.append("</section>")
    body.append("</main></body></html>")
    if scripts and not doc.library:
        raise DseError("report.html: its charts need their library (plotly.js), and the document holds none")
    library = [doc.library.replace("</script", "<\\/script")] if scripts else []
    csp = CSP + ("; script-src " + " ".join(map(_sha256, dict.fromkeys(library + scripts))) if scripts else "")
    head = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f'<meta http-equiv="Content-Security-Policy" content="{html.escape(csp)}">',
            f"<title>{html.escape(doc.title)} — dse report</title>", f"<style>{_CSS}</style>",
            *(f"<script>{c}</script>" for c in library), "</head>"]
    return "\n".join(head + body) + "\n"
