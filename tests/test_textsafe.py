"""Candidate text is printed and stored without control characters (issue 29): a verdict's
message and traceback are cleaned when made, and a source holding one is refused by the policy."""

from __future__ import annotations

from kernelforge.policy.checker import check_source
from kernelforge.result import Status, Verification
from kernelforge.textsafe import printable

HOSTILE = "ok\x1b[2J\x1b[H\x1b]0;pwned\x07 done\r\n\x9b31m\u202eevil\x00\x7f\tend"


def test_escapes_and_controls_are_removed_newlines_and_tabs_kept():
    assert printable(HOSTILE) == "ok done\nevil\tend"
    assert "\x1b" not in printable(HOSTILE) and "\u202e" not in printable(HOSTILE)
    assert printable("plain text\nline 2") == "plain text\nline 2"


def test_a_verdict_never_carries_a_control_character():
    verdict = Verification(Status.RUNTIME_ERROR, message=f"raised {HOSTILE}", traceback=f"Traceback\n{HOSTILE}")
    for text in (verdict.message, verdict.traceback):
        assert not any(ord(c) < 32 and c not in "\n\t" for c in text), repr(text)
        assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text
    assert verdict.message.startswith("raised ok")


def test_the_policy_refuses_a_source_with_a_control_character_naming_its_line():
    report = check_source('import triton\nBANNER = "\x1b[31m"\n')
    assert not report.ok and "line 2" in report.message() and "control character" in report.message()
    assert not check_source('x = 1  # \u202e hidden direction\n').ok
    assert check_source("x = 1\r\ny = 2\r\n").ok  # Windows line ends are fine
