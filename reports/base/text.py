"""Text made safe at the edges: the terminal, an error line, report.md.

What ppscope prints or renders often comes from the user's evidence: a log's fields, file names,
bench files, command-line values. None of it may drive the terminal (an ANSI escape can set its
title, clear the screen or rewrite what was printed), run in a markdown viewer (`<script>`, a
`javascript:` link) or flood stderr (one 69 kB error line). Each edge passes text through one
function here instead of each message escaping its own parts.
"""
from __future__ import annotations

import re
from typing import TextIO

# C0 controls but tab and newline, DEL, C1 controls, lone surrogates (a file name that is not
# UTF-8, as os.fsdecode gives it), and the invisible format characters that reorder or hide
# text (bidirectional overrides and isolates, zero-width characters, the byte-order mark)
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u200b-\u200f\u202a-\u202e"
                     "\u2066-\u2069\ufeff]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(s: str) -> str:
    """`s` with every character that acts on a terminal instead of showing (ESC, BEL, CR,
    backspace...) or cannot be encoded written as its escape (`\\x1b`); newlines and tabs
    stay."""
    return _UNSAFE.sub(_escape, s)


class PrintableStream:
    """A text stream (sys.stdout, sys.stderr) that writes `printable(text)`: the CLI wraps
    both while a command runs, so nothing it prints reaches the terminal raw."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, s: str) -> int:
        self._stream.write(printable(s))
        return len(s)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name):   # flush, fileno, isatty, encoding, buffer...
        return getattr(self._stream, name)


MAX_ERROR_CHARS = 400


def one_line(msg: str, limit: int = MAX_ERROR_CHARS) -> str:
    """An error message as one line of at most about `limit` characters: line breaks become
    " / ", a longer message is cut in the middle (its start names the thing, its end says
    why) and says how much was left out."""
    s = " / ".join(x.strip() for x in msg.splitlines() if x.strip())
    if len(s) <= limit:
        return s
    keep = (limit - 40) // 2
    return f"{s[:keep]} ...[{len(s) - 2 * keep} characters cut]... {s[-keep:]}"


# markdown: an HTML tag, comment or autolink starts with `<` and a letter, `/`, `!` or `?`;
# an inline link or image is `](`; a link reference definition a line `[label]: url`
_MD_TAG = re.compile(r"<(?=[A-Za-z/!?])")
_MD_LINK = re.compile(r"\]\(")
_MD_REF = re.compile(r"^(\s{0,3})\[(?=[^\]]*\]:)")
_FENCE = re.compile(r"^\s{0,3}```")


def markdown_safe(md: str) -> str:
    """A markdown document whose text can hold no raw HTML and no link of its own: outside
    fenced code blocks every `<` that would open a tag is written `\\<` and every `](` is
    written `]\\(` (markdown's own escapes: a viewer shows the characters). ppscope's own
    markdown uses neither, so only text taken from the evidence changes."""
    out, fenced = [], False
    for line in md.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            line = _MD_REF.sub(r"\1\\[", _MD_LINK.sub(r"]\\(", _MD_TAG.sub(r"\\<", line)))
        out.append(line)
    return "\n".join(out)
