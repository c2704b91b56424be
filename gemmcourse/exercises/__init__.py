"""Exercise checks whose expected values the page does not show.

A chapter's check cell calls ``check("ch05.phases", answer, **context)``; the expected
value comes from the function ``phases(**context)`` in ``gemmcourse.exercises.ch05``, so
the cell's source never contains the expression being asked for.  Each chapter keeps its
answer functions in its own module (``ch01.py``, ``ch13.py``, ...).
"""

from __future__ import annotations

import importlib


def expected(key: str, **context):
    """The expected value of exercise ``key`` ("<chapter module>.<function>")."""
    module, _, name = key.partition(".")
    if not name:
        raise ValueError(f"an exercise key is '<chapter>.<name>', not {key!r}")
    fn = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return fn(**context)


def check(key: str, answer, what: str | None = None, rel: float = 1e-9, **context) -> bool:
    """Compare ``answer`` with exercise ``key``'s expected value; never print that value."""
    from gemmcourse import notebook as nb

    return nb.check_hidden(answer, expected(key, **context), what or key.partition(".")[2],
                           rel=rel)
