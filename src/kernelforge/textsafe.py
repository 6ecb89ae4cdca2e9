"""Text a candidate produced, made safe to print and store: no control characters, and no text
longer than its kind allows (:func:`cut`, the one place messages are shortened).

A candidate controls the text of its exceptions, its compile errors and what it prints, and that
text reaches the terminal (``kernelforge check``), the database and the reports. Raw ANSI escapes
there can rewrite the terminal (move the cursor, hide lines, set the window title), and
bidirectional overrides can make a message read differently from what it says. Every verdict's
message and traceback is cleaned here (:class:`kernelforge.result.Verification` calls
:func:`printable` when it is made), so what is printed and what is stored are the same, clean text.
"""

from __future__ import annotations

import re

#: ANSI escape sequences: CSI (``ESC [ ... final``), OSC (``ESC ] ... BEL`` or ``ESC \\``), and
#: two-character escapes; removed whole, so no parameter bytes are left behind.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?|\x9b[0-?]*[ -/]*[@-~]")
#: Every other control character but newline and tab (C0, DEL, C1) and the Unicode
#: bidirectional controls (overrides, embeddings, isolates, marks).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` without ANSI escape sequences and control characters (newlines and tabs kept)."""
    if not text:
        return text
    return _CONTROL.sub("", _ANSI.sub("", text.replace("\r\n", "\n")))


def has_control(text: str) -> bool:
    """Whether ``text`` holds a character :func:`printable` removes (other than ``\\r\\n``)."""
    return printable(text) != text.replace("\r\n", "\n")


#: How long each kind of text may be once it is stored, printed or sent (characters). A verdict's
#: message, a note, one line, a short detail (an exception inside a message), a traceback.
MESSAGE = 2000
NOTE = 500
LINE = 300
DETAIL = 200
TRACEBACK = 20000


def cut(text: object, limit: int = MESSAGE) -> str:
    """``text`` as a string of at most ``limit`` characters (its end dropped). Every message of
    kernelforge is shortened here, to one of the limits above, so the same kind of text is the same
    length wherever it is shown."""
    return str(text)[:limit]


def tail(text: object, limit: int = TRACEBACK) -> str:
    """The last ``limit`` characters of ``text`` (a traceback: its end says where it failed)."""
    return str(text)[-limit:]


def error_text(exc: BaseException, limit: int = NOTE) -> str:
    """``"TypeName: message"`` of an exception, cut to ``limit``."""
    return cut(f"{type(exc).__name__}: {exc}", limit)
