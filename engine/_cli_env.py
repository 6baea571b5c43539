"""``WEIR_*`` environment variables for every ``weir serve`` option.

Theory of operation
-------------------
Every ``serve`` argument has a variable named after its destination:
``--max-sessions`` is ``$WEIR_MAX_SESSIONS``, the APP argument ``$WEIR_APP``.  The
variables are generated from the parser's own actions (:func:`document` adds
``[env: WEIR_...]`` to each option's help; :func:`overlay` reads them), so an option
added to the parser later has its variable with no further code.

Precedence is command line > environment > default: the command line is parsed first
(with every default hidden, to learn which options it gave); then each option it did
not give takes its variable's value, converted and checked exactly as argparse would
(the option's ``type`` and ``choices``).  A value that does not convert is one line
naming the variable, and exit status 1.  Flags take ``1/true/yes/on`` or
``0/false/no/off``; repeatable options take a comma-separated list; an empty value
counts as unset.

``weir serve --workers N`` children (and the ``--reload`` child) get the parent's
command line and environment, so they overlay the same variables on the same command
line and arrive at the same configuration; what the parent adds to a child's command
line (``--port``, ``--workers 1``, ...) overrides the environment, as it must.

A ``WEIR_*`` variable that is no option's but is close to one's name (a typo:
``WEIR_MAX_SESION``) is reported by :func:`typos`, naming the option meant.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Mapping, Sequence

PREFIX = "WEIR_"
#: ``WEIR_*`` variables weir reads that are no option's.
OTHER_VARIABLES = frozenset({"WEIR_STATE_KEYS"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def variable(action: argparse.Action) -> str:
    """The environment variable of a ``serve`` argument: ``WEIR_`` + its dest, upper-case."""
    return PREFIX + action.dest.upper()


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments that have a variable (not ``--help``, not the hidden ones)."""
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._VersionAction)
        and a.help is not argparse.SUPPRESS
    ]


def document(parser: argparse.ArgumentParser) -> None:
    """Add ``[env: WEIR_...]`` to the help of each of ``parser``'s arguments."""
    for action in _actions(parser):
        action.help = f"{action.help or ''} [env: {variable(action)}]".lstrip()


def _flag(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise SystemExit(f"weir: ${name}={text!r}: expected 1/true/yes/on or 0/false/no/off")


def _convert(action: argparse.Action, name: str, text: str) -> object:
    """``text`` as the value ``action`` would have made of it on the command line."""
    if action.nargs == 0:  # a flag
        on = _flag(name, text)
        if isinstance(action, argparse.BooleanOptionalAction):
            return on
        return action.const if on else action.default
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not isinstance(action, argparse._AppendAction):
        items = [text]
    values = []
    for item in items:
        try:
            value = action.type(item) if callable(action.type) else item
        except argparse.ArgumentTypeError as exc:
            raise SystemExit(f"weir: ${name}={item!r}: {exc}") from None
        except (TypeError, ValueError):
            kind = getattr(action.type, "__name__", "value")
            what = {"int": "an integer", "float": "a number"}.get(kind, f"a valid {kind}")
            raise SystemExit(f"weir: ${name}={item!r}: not {what}") from None
        if action.choices is not None and value not in action.choices:
            shown = ", ".join(map(str, action.choices))
            raise SystemExit(f"weir: ${name}={item!r}: must be one of {shown}")
        values.append(value)
    return values if isinstance(action, argparse._AppendAction) else values[0]


def given_on_command_line(
    top: argparse.ArgumentParser, parser: argparse.ArgumentParser, argv: Sequence[str]
) -> set[str]:
    """The dests of ``parser``'s arguments that ``argv`` (the whole command line,
    parsed by ``top``, of which ``parser`` is a sub-command) gives."""
    actions = _actions(parser)
    saved = [a.default for a in actions]
    try:
        for a in actions:
            a.default = argparse.SUPPRESS
        given, _ = top.parse_known_args(argv)
    finally:
        for a, default in zip(actions, saved, strict=True):
            a.default = default
    return set(vars(given))


def overlay(
    top: argparse.ArgumentParser,
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: Sequence[str],
    environ: Mapping[str, str],
) -> dict[str, str]:
    """Set on ``args`` (``argv`` parsed by ``top``) the value of each variable set in
    ``environ`` whose option of ``parser`` (the sub-command) ``argv`` does not give;
    return ``{option: variable}`` for those it set.

    Raises:
        SystemExit: a value that does not convert, naming the variable.
    """
    given = given_on_command_line(top, parser, argv)
    applied: dict[str, str] = {}
    for action in _actions(parser):
        name = variable(action)
        text = environ.get(name, "")
        if action.dest in given or not text.strip():
            continue
        setattr(args, action.dest, _convert(action, name, text))
        flag = max(action.option_strings, key=len) if action.option_strings else action.dest
        applied[flag] = name
    return applied


def typos(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> dict[str, str]:
    """``{variable: warning line}`` for each ``WEIR_*`` variable in ``environ`` that no
    option has but that is close to the name of one (a misspelling that would go
    unnoticed)."""
    options = {variable(a): a for a in _actions(parser)}
    known = set(options) | OTHER_VARIABLES
    lines = {}
    for name in sorted(environ):
        if not name.startswith(PREFIX) or name in known:
            continue
        near = difflib.get_close_matches(name, list(options), n=1, cutoff=0.8)
        if near:
            action = options[near[0]]
            flag = max(action.option_strings, key=len) if action.option_strings else "APP"
            lines[name] = (
                f"weir: WARNING: ${name} is not a weir setting (ignored); "
                f"did you mean ${near[0]} ({flag})?"
            )
    return lines


def blame(exc: SystemExit, applied: dict[str, str]) -> SystemExit:
    """``exc`` naming the variable that set an option its message names, if one did."""
    if not isinstance(exc.code, str):
        return exc
    named = [
        f"${name}"
        for flag, name in applied.items()
        if re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", exc.code)
    ]
    return SystemExit(f"{exc.code} (set by {', '.join(named)})") if named else exc
