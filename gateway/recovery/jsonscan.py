"""Is a tool call's argument string complete yet? An incremental answer.

Arguments arrive as fragments. Re-parsing the whole string after every fragment
is quadratic in its length; instead the scanner follows only the characters
that change nesting (brackets outside strings, quotes, escapes) and parses the
whole string once, when the outermost bracket closes.
"""

from __future__ import annotations

import re

import orjson

_STRUCTURAL = re.compile(r'[{}\[\]"\\]')


class JsonCompleteness:
    __slots__ = ("_depth", "_in_string", "_escaped", "_parts", "complete")

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._parts: list[str] = []
        self.complete = False

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def feed(self, fragment: str) -> bool:
        """Add a fragment; return whether the arguments now form one valid JSON value."""
        self._parts.append(fragment)
        if not fragment:
            return self.complete
        if self.complete:
            # Anything but white space after a complete value makes it invalid.
            self.complete = not fragment.strip()
            return self.complete
        # Position of a backslash whose next character is escaped; -1: the previous
        # fragment ended with it, so it escapes this fragment's first character.
        escape_at = -1 if self._escaped else -2
        closed = False
        for match in _STRUCTURAL.finditer(fragment):
            char, at = match.group(), match.start()
            if self._in_string:
                if escape_at == at - 1:
                    escape_at = -2
                elif char == "\\":
                    escape_at = at
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            else:  # } or ]
                self._depth -= 1
                closed = self._depth == 0
        self._escaped = self._in_string and escape_at == len(fragment) - 1
        if closed and self._depth == 0 and not self._in_string:
            self.complete = self._valid()
        return self.complete

    def _valid(self) -> bool:
        try:
            orjson.loads(self.text)
        except orjson.JSONDecodeError:
            return False
        return True
