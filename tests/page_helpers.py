"""Reading the HTML pages the way a browser would: every link, every clip (with its poster) per card."""
from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np

LINK_ATTRIBUTES = ("src", "href", "poster")


@dataclass
class Card:
    classes: str
    videos: list[dict] = field(default_factory=list)  # each <video>'s attributes
    bars: list[str] = field(default_factory=list)  # the style of each state bar's fill


class PageReader(HTMLParser):
    """Collects every link attribute and, per ``<div class="card">``, its videos and state-bar fills."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.cards: list[Card] = []
        self._open: list[Card | None] = []  # one entry per open <div>: the card it starts, or None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.links += [(tag, name, attrs[name]) for name in LINK_ATTRIBUTES if attrs.get(name)]
        card = next((c for c in reversed(self._open) if c is not None), None)
        if tag == "div":
            classes = (attrs.get("class") or "").split()
            new = Card(attrs.get("class") or "") if "card" in classes else None
            if new is not None:
                self.cards.append(new)
            self._open.append(new)
            if card is not None and "fill" in classes:
                card.bars.append(attrs.get("style") or "")
        elif tag == "video" and card is not None:
            card.videos.append(attrs)

    def handle_endtag(self, tag):
        if tag == "div" and self._open:
            self._open.pop()


def read_page(path: Path) -> PageReader:
    reader = PageReader()
    reader.feed(Path(path).read_text(encoding="utf-8"))
    reader.close()
    return reader


def local_target(page: Path, url: str) -> Path:
    """The file a relative link of ``page`` points at (absolute or remote links are refused)."""
    parsed = urlparse(url)
    assert not parsed.scheme and not parsed.netloc and not url.startswith("/"), f"{page}: non-relative link {url}"
    return (Path(page).parent / unquote(parsed.path)).resolve()


def broken_links(page: Path) -> list[str]:
    """Every src/href/poster of ``page`` that does not name an existing file beside it."""
    return [f"<{tag} {name}={url!r}>" for tag, name, url in read_page(page).links
            if not local_target(page, url).is_file()]


def image_pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))
