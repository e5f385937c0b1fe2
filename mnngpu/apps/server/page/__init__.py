"""GET /: the chat page, one static file (index.html, its script and style inline) that talks to the
server through its public API alone: /v1/models, and /v1/chat/completions streamed.

The page loads nothing from another site. Its Content-Security-Policy says so to the browser too:
nothing may load but the page's own inline script and style (allowed by their hashes), requests to
this server, and the data: URLs of attached images.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse

PAGE = Path(__file__).resolve().parent / "index.html"


@cache
def _page() -> tuple[str, str]:
    """The page's HTML and its Content-Security-Policy."""
    html = PAGE.read_text(encoding="utf-8")
    policy = "; ".join([
        "default-src 'none'",
        f"script-src {_hashes(html, 'script')}",
        f"style-src {_hashes(html, 'style')}",
        "connect-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ])
    return html, policy


def _hashes(html: str, tag: str) -> str:
    """The CSP source list of the page's inline <tag> blocks: one 'sha256-...' per block."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    digests = (base64.b64encode(hashlib.sha256(block.encode()).digest()).decode() for block in blocks)
    return " ".join(f"'sha256-{digest}'" for digest in digests)


async def chat_page(request: Request) -> HTMLResponse:
    html, policy = _page()
    return HTMLResponse(html, headers={"Content-Security-Policy": policy, "Cache-Control": "no-cache"})
