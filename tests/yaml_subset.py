"""A reader for the YAML subset that ``collector-config/`` is written in.

PyYAML is not a dependency of the package or its tests, so the deployable YAML files keep to a
small subset that this module reads exactly: block mappings and sequences (a sequence may sit at
its parent key's indentation), plain, single- and double-quoted scalars, literal and folded block
scalars (``|``, ``|-``, ``>``, ``>-``), one-line flow sequences and mappings of scalars, anchors on
block values and aliases, and comments. Anything else is refused with ``file:line: message``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["YamlSubsetError", "load", "loads"]

_KEY = re.compile(r"""^(?P<key>'[^']*'|"[^"]*"|[^'"\s#][^:#]*?)\s*:(?:\s+|$)(?P<rest>.*)$""")
_INT = re.compile(r"^[-+]?[0-9]+$")
_FLOAT = re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$")
_ANCHOR = re.compile(r"^&(?P<name>[A-Za-z0-9_-]+)\s*(?P<rest>.*)$")
_ALIAS = re.compile(r"^\*(?P<name>[A-Za-z0-9_-]+)$")
_DOUBLE_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "/": "/"}


class YamlSubsetError(ValueError):
    """The text is not in the supported subset; the message names the file and line."""


def load(path: Path) -> Any:
    """Read ``path`` (UTF-8) as one YAML document of the subset."""
    return loads(path.read_text(encoding="utf-8"), str(path))


def loads(text: str, source: str = "<string>") -> Any:
    """Read ``text`` as one YAML document of the subset."""
    return _Reader(text, source).document()


class _Reader:
    def __init__(self, text: str, source: str) -> None:
        self.lines = text.splitlines()
        self.source = source
        self.pos = 0
        self.anchors: dict[str, Any] = {}

    # -- lines -------------------------------------------------------------------------------

    def error(self, message: str, line: int | None = None) -> YamlSubsetError:
        number = (self.pos if line is None else line) + 1
        return YamlSubsetError(f"{self.source}:{number}: {message}")

    def skip_blank(self) -> None:
        while self.pos < len(self.lines):
            stripped = self.lines[self.pos].strip()
            if stripped and not stripped.startswith("#") and stripped != "---":
                return
            self.pos += 1

    def current(self) -> tuple[int, str] | None:
        """Indentation and content of the next meaningful line, or None at the end."""
        self.skip_blank()
        if self.pos >= len(self.lines):
            return None
        line = self.lines[self.pos]
        if "\t" in line[: len(line) - len(line.lstrip())]:
            raise self.error("tab in indentation")
        content = line.lstrip(" ")
        return len(line) - len(content), content

    # -- nodes -------------------------------------------------------------------------------

    def document(self) -> Any:
        head = self.current()
        if head is None:
            return None
        value = self.block(head[0])
        rest = self.current()
        if rest is not None:
            raise self.error("unexpected content after the document")
        return value

    def block(self, indent: int) -> Any:
        head = self.current()
        if head is None or head[0] != indent:
            raise self.error(f"expected a block at indentation {indent}")
        if head[1] == "-" or head[1].startswith("- "):
            return self.sequence(indent)
        return self.mapping(indent)

    def mapping(self, indent: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while (head := self.current()) is not None and head[0] == indent:
            if head[1] == "-" or head[1].startswith("- "):
                break
            match = _KEY.match(head[1])
            if match is None:
                raise self.error("expected 'key: value'")
            key = _scalar_text(match["key"].strip())
            if key in result:
                raise self.error(f"duplicate key {key!r}")
            line = self.pos
            self.pos += 1
            result[key] = self.value(match["rest"], indent, line, in_mapping=True)
        if (head := self.current()) is not None and head[0] > indent:
            raise self.error("unexpected indentation")
        return result

    def sequence(self, indent: int) -> list[Any]:
        result: list[Any] = []
        while (head := self.current()) is not None and head[0] == indent:
            if not (head[1] == "-" or head[1].startswith("- ")):
                break
            item = head[1][1:].lstrip(" ")
            line = self.pos
            if _KEY.match(item) and not item.startswith(("'", '"', "[", "{")):
                # "- key: value" opens a mapping whose keys sit two columns further in.
                offset = len(head[1]) - len(item)
                self.lines[self.pos] = " " * (indent + offset) + item
                result.append(self.mapping(indent + offset))
                continue
            self.pos += 1
            result.append(self.value(item, indent, line, in_mapping=False))
        if (head := self.current()) is not None and head[0] > indent:
            raise self.error("unexpected indentation")
        return result

    def value(self, text: str, indent: int, line: int, *, in_mapping: bool) -> Any:
        text = _strip_comment(text, self.error_at(line))
        anchor: str | None = None
        if (match := _ANCHOR.match(text)) is not None:
            anchor, text = match["name"], match["rest"]
        if (match := _ALIAS.match(text)) is not None:
            if match["name"] not in self.anchors:
                raise self.error(f"unknown alias *{match['name']}", line)
            return self.anchors[match["name"]]
        if text in ("|", "|-", ">", ">-"):
            value: Any = self.block_scalar(text, indent)
        elif text:
            value = _flow_or_scalar(text, self.error_at(line))
        else:
            head = self.current()
            if head is not None and head[0] > indent:
                value = self.block(head[0])
            elif (
                in_mapping
                and head is not None
                and head[0] == indent
                and (head[1] == "-" or head[1].startswith("- "))
            ):
                value = self.sequence(indent)
            else:
                value = None
        if anchor is not None:
            self.anchors[anchor] = value
        return value

    def block_scalar(self, style: str, indent: int) -> str:
        collected: list[str] = []
        body_indent: int | None = None
        while self.pos < len(self.lines):
            line = self.lines[self.pos]
            if line.strip() == "":
                collected.append("")
                self.pos += 1
                continue
            width = len(line) - len(line.lstrip(" "))
            if width <= indent:
                break
            if body_indent is None:
                body_indent = width
            if width < body_indent:
                raise self.error("block scalar line less indented than its first line")
            collected.append(line[body_indent:])
            self.pos += 1
        while collected and collected[-1] == "":
            collected.pop()
        if style.startswith(">"):
            text = " ".join(part for part in collected if part != "")
        else:
            text = "\n".join(collected)
        return text if style.endswith("-") else text + "\n"

    def error_at(self, line: int) -> _ErrorAt:
        return _ErrorAt(self, line)


class _ErrorAt:
    def __init__(self, reader: _Reader, line: int) -> None:
        self.reader = reader
        self.line = line

    def __call__(self, message: str) -> YamlSubsetError:
        return self.reader.error(message, self.line)


def _strip_comment(text: str, error: _ErrorAt) -> str:
    text = text.strip()
    if text.startswith(("'", '"')):
        end = _quoted_end(text, error)
        rest = text[end:].strip()
        if rest and not rest.startswith("#"):
            raise error("text after a quoted scalar")
        return text[:end]
    cut = re.search(r"\s#", text)
    return (text[: cut.start()] if cut else text).strip()


def _quoted_end(text: str, error: _ErrorAt) -> int:
    quote = text[0]
    i = 1
    while i < len(text):
        if quote == "'" and text[i] == "'":
            if text[i + 1 : i + 2] == "'":
                i += 2
                continue
            return i + 1
        if quote == '"' and text[i] == "\\":
            i += 2
            continue
        if quote == '"' and text[i] == '"':
            return i + 1
        i += 1
    raise error("unterminated quoted scalar")


def _flow_or_scalar(text: str, error: _ErrorAt) -> Any:
    if text.startswith("["):
        if not text.endswith("]"):
            raise error("a flow sequence must close on its line")
        inner = text[1:-1].strip()
        return [_scalar(part.strip(), error) for part in _split_flow(inner, error)] if inner else []
    if text.startswith("{"):
        if not text.endswith("}"):
            raise error("a flow mapping must close on its line")
        inner = text[1:-1].strip()
        result: dict[str, Any] = {}
        for part in _split_flow(inner, error) if inner else []:
            key, sep, raw = part.partition(":")
            if not sep:
                raise error("expected 'key: value' in a flow mapping")
            result[_scalar_text(key.strip())] = _scalar(raw.strip(), error)
        return result
    return _scalar(text, error)


def _split_flow(inner: str, error: _ErrorAt) -> list[str]:
    parts: list[str] = []
    start = i = 0
    while i < len(inner):
        if inner[i] in "'\"":
            i += _quoted_end(inner[i:], error)
            continue
        if inner[i] in "[]{}":
            raise error("nested flow collections are not supported")
        if inner[i] == ",":
            parts.append(inner[start:i])
            start = i + 1
        i += 1
    parts.append(inner[start:])
    return parts


def _scalar_text(text: str) -> str:
    if text.startswith("'") and text.endswith("'") and len(text) >= 2:
        return text[1:-1].replace("''", "'")
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        return _unescape_double(text[1:-1])
    return text


def _unescape_double(body: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char == "\\" and i + 1 < len(body):
            escaped = body[i + 1]
            if escaped not in _DOUBLE_ESCAPES:
                raise YamlSubsetError(f"unsupported escape \\{escaped}")
            out.append(_DOUBLE_ESCAPES[escaped])
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _scalar(text: str, error: _ErrorAt) -> Any:
    if text.startswith(("'", '"')):
        if _quoted_end(text, error) != len(text):
            raise error("text after a quoted scalar")
        return _scalar_text(text)
    if text.startswith(("&", "*", "!", "%", "@", "`", "|", ">")):
        raise error(f"unsupported YAML syntax: {text[:20]!r}")
    if text in ("null", "~"):
        return None
    if text == "true":
        return True
    if text == "false":
        return False
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text
