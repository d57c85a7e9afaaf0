"""Escaping for the pages RouteScope writes (corpus.html, report.html, the app's HTML grid): one
function per context a string from data or a file name can land in. Element ids are never made
from such strings; callers number them.

- `text`: HTML text. `<`, `>`, `&` and both quotes become references, and so do line breaks
  (`&#10;`): a page the app hands Streamlit's Markdown keeps its HTML block whole (a blank line
  would end it and let Markdown read the rest).
- `attr`: a double- or single-quoted attribute value (the same escapes).
- `script_json`: JSON for inside <script> (a JSON data block, or a JS expression): `<`, `>`, `&`
  and U+2028/U+2029 as \\u escapes, so no `</script>`, `<!--` or `<script` can appear and change
  how the browser reads the script's end, and the text stays a valid JS literal.
- `js_string`: a JS string literal for inside <script> (the same escapes, quotes included).
"""
from __future__ import annotations

import html
import json
from typing import Any

_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                              "\u2029": "\\u2029"})


def text(s: Any) -> str:
    return html.escape(str(s), quote=True).replace("\r", "&#13;").replace("\n", "&#10;")


attr = text


def script_json(obj: Any, **dumps: Any) -> str:
    """`obj` as JSON safe inside <script> (`json.dumps` keyword arguments pass through)."""
    return json.dumps(obj, **dumps).translate(_SCRIPT_SAFE)


def js_string(s: str) -> str:
    return script_json(str(s), ensure_ascii=False)
