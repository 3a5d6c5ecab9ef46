"""``web_fetch``: HTTP GET a URL and return its text (HTML reduced to readable text)."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urlsplit

from loom.errors import MissingDependencyError, ToolError
from loom.tools.base import RunContext
from loom.tools.builtin._base import builtin

__all__ = ["MAX_BYTES", "html_to_text", "web_fetch"]

MAX_BYTES = 2 * 1024 * 1024
"""The most bytes read from one response; the rest is not downloaded."""
TIMEOUT = 20.0
_TEXT_TYPES = (
    "text/",
    "application/json",
    "application/xml",
    "application/xhtml+xml",
    "application/javascript",
    "application/x-yaml",
    "application/ld+json",
)
_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "head"})
_BLOCK = frozenset(
    {
        "p",
        "div",
        "br",
        "li",
        "tr",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "section",
        "article",
        "header",
        "footer",
        "pre",
        "blockquote",
        "table",
        "ul",
        "ol",
        "title",
    }
)


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _SKIP:
            self.skipping += 1
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _SKIP and self.skipping:
            self.skipping -= 1
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        if not self.skipping:
            self.parts.append(data)


def html_to_text(html: str) -> tuple[str, str]:
    """``(title, text)`` of an HTML page: scripts and styles dropped, blank runs collapsed."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    text = "\n".join(line for line in lines if line)
    return " ".join(parser.title.split()), text


@builtin(effect="idempotent", subject=("url", "url"), timeout=TIMEOUT + 5)
async def web_fetch(ctx: RunContext, url: str, max_chars: int = 50_000) -> str:
    """Fetch a web page or text document with HTTP GET and return its text.

    HTML is reduced to readable text (no scripts or styles). Binary content is refused.
    Redirects are followed (at most 5).

    Args:
        url: An http:// or https:// URL.
        max_chars: Return at most this many characters of text.
    """
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx comes with the tools extra
        raise MissingDependencyError("httpx", "tools", "web_fetch") from None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ToolError(f"{url!r} is not an http(s) URL", code="invalid_url")
    try:
        async with (
            httpx.AsyncClient(
                timeout=TIMEOUT,
                follow_redirects=True,
                max_redirects=5,
                headers={"User-Agent": "loom-agents web_fetch"},
            ) as client,
            client.stream("GET", url) as response,
        ):
            ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if response.status_code >= 400:
                raise ToolError(
                    f"GET {url} answered HTTP {response.status_code} {response.reason_phrase}",
                    code="http_error",
                )
            if ctype and not ctype.startswith(_TEXT_TYPES):
                raise ToolError(
                    f"{url} is {ctype}, not text; web_fetch returns text only",
                    code="unsupported_content",
                )
            body = bytearray()
            truncated = False
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_BYTES:
                    del body[MAX_BYTES:]
                    truncated = True
                    break
            encoding = response.encoding or "utf-8"
            final_url = str(response.url)
            status = response.status_code
    except httpx.TimeoutException:
        raise ToolError(f"GET {url} timed out after {TIMEOUT:g} s", code="timeout") from None
    except httpx.TooManyRedirects:
        raise ToolError(f"GET {url} redirected too many times", code="http_error") from None
    except httpx.HTTPError as exc:
        raise ToolError(
            f"GET {url} failed: {type(exc).__name__}: {exc}", code="http_error"
        ) from None
    text = bytes(body).decode(encoding, errors="replace")
    title = ""
    if ctype in ("text/html", "application/xhtml+xml") or (not ctype and "<html" in text[:500]):
        title, text = html_to_text(text)
    notes = []
    if truncated:
        notes.append(f"only the first {MAX_BYTES // 1024 // 1024} MB were downloaded")
    if len(text) > max_chars:
        text = text[:max_chars]
        notes.append(f"text cut at max_chars={max_chars}")
    header = f"URL: {final_url}\nStatus: {status}" + (f"\nTitle: {title}" if title else "")
    tail = f"\n[{'; '.join(notes)}]" if notes else ""
    return f"{header}\n\n{text}{tail}"
