"""Small HTML pieces for panels and tables.  Every value is escaped here: text from documents, messages,
titles and user names is shown as text, never as markup."""

from collections.abc import Sequence
from html import escape


def text(value: object) -> str:
    return escape("" if value is None else str(value))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[int] = ()) -> str:
    """A table; the columns at `numeric` are right-aligned."""

    def cell(tag: str, index: int, value: object) -> str:
        css = ' class="num"' if index in numeric else ""
        return f"<{tag}{css}>{text(value)}</{tag}>"

    head = "".join(cell("th", i, header) for i, header in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f'<table class="kv-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def stats(items: Sequence[tuple[str, object]]) -> str:
    """A grid of figures, each with its label underneath."""
    cells = "".join(
        f'<div class="kv-stat"><b>{text(value)}</b><span>{text(label)}</span></div>' for label, value in items
    )
    return f'<div class="kv-stats">{cells}</div>'


def passage(meta: str, body: str) -> str:
    return f'<div class="kv-passage"><span class="kv-meta">{text(meta)}</span>{text(body)}</div>'


def muted(message: str) -> str:
    return f'<p class="kv-muted">{text(message)}</p>'


def unavailable(message: str) -> str:
    return f'<div class="kv-unavailable">{text(message)}</div>'


def size(num_bytes: int | None) -> str:
    if num_bytes is None:
        return "–"
    value, unit = float(num_bytes), "B"
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
