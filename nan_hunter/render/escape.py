"""Escaping of untrusted strings, one function per sink.

Tensor names, metadata, module names and class names from user code, prompts, file paths, notes
and evidence all come from outside, and every message that quotes them is untrusted too. Each
sink receives them through its function here, applied once, where the output is written: a raw
control character, a bidi override or a markup tag in a name then shows as what it is (``\\x1b``,
``\\u202e``, ``[bold]``, ``&lt;script&gt;``) instead of acting on the terminal, the XML parser,
the Actions runner, the browser or matplotlib.
"""

from __future__ import annotations

import unicodedata
from html import escape as _html_escape

# Categories that act instead of showing: controls (C0, DEL, C1), format characters (bidi
# overrides and isolates, zero-width characters), lone surrogates (undecodable file names) and the
# line/paragraph separators.
_HIDDEN = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
_NONCHARACTERS = frozenset("\ufffe\uffff")  # XML 1.0 forbids them
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _code(ch: str) -> str:
    n = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{n:02x}" if n <= 0xFF else f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"


def visible(s: object, keep: str = "") -> str:
    """``s`` with every character that would act rather than show written as a Python-style
    escape (``\\x1b``, ``\\n``, ``\\u202e``); characters in ``keep`` pass through."""
    s = str(s)
    if s.isprintable():  # fast path: no control, format, separator or surrogate character
        return s
    return "".join(
        _code(c) if (c not in keep and (unicodedata.category(c) in _HIDDEN or c in _NONCHARACTERS)) else c
        for c in s
    )


def terminal(s: object) -> str:
    """For the terminal. The result goes into a ``rich.text.Text``, never through rich markup, so
    ``[bold]`` and ``:emoji:`` stay literal; only the control characters need escaping."""
    return visible(s)


def junit(s: object) -> str:
    """For JUnit XML text and attributes: nothing XML 1.0 forbids remains (``&``, ``<`` and quotes
    are left to the XML serializer, which escapes them)."""
    return visible(s)


def actions_message(s: object) -> str:
    """The message of a GitHub Actions workflow command (``::error ...::MESSAGE``): ``%``, CR and
    LF encoded as the runner decodes them, every other control character shown as an escape."""
    return visible(s, keep="\r\n").replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def actions_property(s: object) -> str:
    """A property value of a workflow command (``file=``, ``title=``): also ``:`` and ``,``."""
    return actions_message(s).replace(":", "%3A").replace(",", "%2C")


def html(s: object) -> str:
    """For HTML text and quoted attribute values."""
    return _html_escape(visible(s), quote=True)


# Markdown: HTML-significant characters become entities (so ``<script>`` never appears raw);
# characters with inline Markdown meaning are backslash-escaped (emphasis, code, links, tables,
# strike-through, GitHub math ``$``, mentions ``@`` and issue references ``#``). Newlines are
# already escaped by ``visible``, so nothing untrusted can start a line (headings, lists, quotes).
_MARKDOWN = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "\\": "\\\\",
        "`": "\\`",
        "*": "\\*",
        "_": "\\_",
        "[": "\\[",
        "]": "\\]",
        "|": "\\|",
        "~": "\\~",
        "$": "\\$",
        "@": "\\@",
        "#": "\\#",
        "!": "\\!",
    }
)


def markdown(s: object) -> str:
    """Inline Markdown text (GitHub flavour), also inside table cells."""
    return visible(s).translate(_MARKDOWN)


def markdown_code(s: object) -> str:
    """Inline Markdown in a monospace font. A backtick code span cannot hold an escaped ``<``, so
    this is an HTML ``<code>`` element around escaped text (GitHub keeps ``<code>``)."""
    return f"<code>{markdown(s)}</code>"


def plot(s: object) -> str:
    """A matplotlib label: every ``$`` escaped, so no part of the label is parsed as mathtext (an
    unbalanced ``$x_`` would make drawing the figure raise); control characters shown."""
    return visible(s).replace("$", "\\$")


def html_prose(s: object) -> str:
    """A sentence for HTML (a diagnosis, a fix, a note): escaped as ``html``, and each
    ```code span``` (a command, a setting) set as ``<code>`` instead of showing its backticks."""
    import re

    return re.sub(r"`([^`\n]+)`", r"<code>\1</code>", html(s))


def markdown_prose(s: object) -> str:
    """A sentence for Markdown, escaped as ``markdown``, each ```code span``` as ``<code>``."""
    import re

    return re.sub(r"\\`((?:(?!\\`).)+?)\\`", r"<code>\1</code>", markdown(s))
