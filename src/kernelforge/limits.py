"""The trusted side's size and time limits on what a template, a model or a candidate gives it.

Every limit on untrusted text is here, so the template parser, the renderer, the header
expressions and the static policy refuse the same things with the same numbers (and the docs name
these constants). The shipped templates are under 30 kB and render in milliseconds: every limit is
far above what an honest template needs and far below what stalls a search.
"""

from __future__ import annotations

from typing import Callable

from kernelforge.textsafe import has_control

#: The most characters a template's text or a candidate's source may have (the largest shipped
#: template is about 27 kB). A larger one is refused before it is parsed.
MAX_SOURCE_CHARS = 256 * 1024
#: The most characters one render may produce (the rendered module is then a candidate source:
#: :data:`MAX_SOURCE_CHARS` applies to it too).
MAX_RENDER_CHARS = MAX_SOURCE_CHARS
#: The most loop iterations (``{% for %}`` over ``range``) one render may make, all loops together.
MAX_RENDER_ITERATIONS = 10_000
#: A render still running after this many seconds is cut (a backstop: the iteration and size
#: limits above bound an honest template's render long before).
MAX_RENDER_SECONDS = 5.0
#: The most characters of one header expression (constraint, ``when``, ``computed``).
MAX_EXPRESSION_CHARS = 1_000
#: The most syntax nodes of one header expression (its evaluation visits each at most once).
MAX_EXPRESSION_NODES = 400
#: The largest exponent of ``**`` in a header expression or a template body.
MAX_EXPONENT = 64
#: The most bits an integer computed by a header expression or a template body may have.
MAX_INT_BITS = 256


class LimitExceeded(ValueError):
    """Untrusted text asked for more than a limit of this module allows; the message names it."""


_NUMBER = (int, float)
_SEQUENCE = (str, tuple, list)


def bounded_arithmetic(symbol: str, left: object, right: object, apply: Callable[[object, object], object]) -> object:
    """``apply(left, right)`` for the operator ``symbol`` (``+ - * / // % **``), refused
    (:class:`LimitExceeded`) before it is computed when it could be large: a power with an exponent
    over :data:`MAX_EXPONENT` or an integer result over :data:`MAX_INT_BITS`, a repeated or
    concatenated string or sequence over :data:`MAX_RENDER_CHARS`, and arithmetic on anything but
    numbers, strings and sequences (``%`` and ``**`` on numbers only). Header expressions and
    template bodies both compute through this one function, so ``7 ** 7 ** 9`` is refused in
    microseconds wherever it is written."""
    numbers = isinstance(left, _NUMBER) and isinstance(right, _NUMBER)
    if symbol == "**":
        if not numbers:
            raise LimitExceeded(f"** needs numbers, not {type(left).__name__} and {type(right).__name__}")
        if abs(right) > MAX_EXPONENT:
            raise LimitExceeded(f"exponent {right!r} is over the limit of {MAX_EXPONENT}")
        if isinstance(left, int) and isinstance(right, int) and right > 0 \
                and abs(left).bit_length() * right > MAX_INT_BITS + right:
            raise LimitExceeded(f"{left!r} ** {right!r} has over {MAX_INT_BITS} bits")
    elif not numbers:
        sequences = isinstance(left, _SEQUENCE) or isinstance(right, _SEQUENCE)
        if symbol not in ("+", "*") or not sequences:
            raise LimitExceeded(f"{symbol} is not allowed on {type(left).__name__} and {type(right).__name__}")
        if symbol == "*":
            count = right if isinstance(left, _SEQUENCE) else left
            sequence = left if isinstance(left, _SEQUENCE) else right
            if isinstance(count, int) and len(sequence) * max(count, 0) > MAX_RENDER_CHARS:  # type: ignore[arg-type]
                raise LimitExceeded(f"a repetition of {len(sequence)} items {count} times is over the limit of "  # type: ignore[arg-type]
                                    f"{MAX_RENDER_CHARS}")
    result = apply(left, right)
    if isinstance(result, int) and result.bit_length() > MAX_INT_BITS:
        raise LimitExceeded(f"an integer of {result.bit_length()} bits is over the limit of {MAX_INT_BITS}")
    if isinstance(result, _SEQUENCE) and len(result) > MAX_RENDER_CHARS:
        raise LimitExceeded(f"a value of {len(result)} items is over the limit of {MAX_RENDER_CHARS}")
    return result


def source_problem(source: str) -> tuple[int, str]:
    """(line, why) a candidate's source is refused before it is parsed (why empty: it is not): over
    :data:`MAX_SOURCE_CHARS`, or holding a control character other than newline and tab (an ANSI
    escape in a string would reach a terminal; a bidirectional override makes code read
    differently from what it does)."""
    if len(source) > MAX_SOURCE_CHARS:
        return 0, f"the source has {len(source)} characters, over the limit of {MAX_SOURCE_CHARS} (MAX_SOURCE_CHARS)"
    if has_control(source):
        line = next(i for i, text in enumerate(source.split("\n"), 1) if has_control(text))
        return line, "the source holds a control character (an escape, a bidirectional override...)"
    return 0, ""
