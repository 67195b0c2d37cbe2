"""Input schemas: pydantic validation failures as :class:`~marssim.errors.InputError` with key paths, and
read YAML files with errors that name the file and line.

Every YAML file marssim reads goes through :func:`read_yaml` (text: :func:`parse_yaml`), one safe
loader configured here: plain data only (no Python objects), the file's size checked before it is
read, and the document bounded while it is composed (:mod:`marssim.limits`): the nodes it expands
to with aliases counted at their full size (so an "alias bomb" stops at once), how deeply it
nests, no alias inside the node it names (a recursive structure), no key twice in one mapping."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.error import MarkedYAMLError
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver
from pydantic import BaseModel, ValidationError

from .errors import InputError, format_path
from .limits import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, read_bounded

__all__ = ["validate_model", "read_yaml", "parse_yaml", "problems_from_validation"]

M = TypeVar("M", bound=BaseModel)


def _step(tp: Any, part: str | int) -> Any:
    """The type found one key (str) or index (int) below ``tp``, or None when unknown."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _step(typing.get_args(tp)[0], part)
    if origin is typing.Union or origin is types.UnionType:
        for arg in typing.get_args(tp):
            found = _step(arg, part)
            if found is not None:
                return found
        return None
    if isinstance(part, int):
        return typing.get_args(tp)[0] if origin in (list, tuple) and typing.get_args(tp) else None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(part)
        return field.annotation if field is not None else None
    if origin is dict and len(typing.get_args(tp)) == 2:
        return typing.get_args(tp)[1]
    return None


def _allowed_keys(model: type[BaseModel] | None, loc: Sequence[str | int], hidden: Sequence[str]) -> list[str]:
    """The keys the model accepts at ``loc`` (the mapping that holds an unknown key); [] if unknown."""
    current: Any = model
    for part in loc:
        if current is None:
            return []
        current = _step(current, part)
    while typing.get_origin(current) in (typing.Annotated, typing.Union, types.UnionType):
        models = [a for a in typing.get_args(current) if isinstance(a, type) and issubclass(a, BaseModel)]
        current = models[0] if models else typing.get_args(current)[0]
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [k for k in current.model_fields if k not in hidden]
    return []


def _message(err: dict[str, Any], model: type[BaseModel] | None, hidden: Sequence[str] = ()) -> str:
    kind = err.get("type", "")
    msg = str(err.get("msg", ""))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, list(err.get("loc", ()))[:-1], hidden)
        return f"unknown key; expected one of: {', '.join(allowed)}" if allowed else "unknown key"
    if kind == "missing":
        return "missing required key"
    got = err.get("input")
    if kind.endswith("_type") or kind.startswith(("literal", "enum", "greater", "less", "int_", "float_", "too_short")):
        return f"{msg[0].lower() + msg[1:]}, got {got!r}" if msg else f"invalid value {got!r}"
    return msg


def problems_from_validation(exc: ValidationError, prefix: Sequence[str | int] = (),
                             model: type[BaseModel] | None = None,
                             hidden: Sequence[str] = ()) -> list[tuple[str, str]]:
    """One ``(key path, message)`` pair per pydantic error, paths prefixed by ``prefix``.

    With ``model`` (the model that was validated), an unknown key's message lists the keys
    accepted there, leaving out ``hidden`` ones (keys the caller fills in itself)."""
    out = []
    for err in exc.errors():
        loc = [p for p in err.get("loc", ()) if not (isinstance(p, str) and "[" in p and p.startswith("function-"))]
        out.append((format_path([*prefix, *loc]), _message(err, model, hidden)))
    return out


def validate_model(model: type[M], data: Any, file: str | None, prefix: Sequence[str | int] = ()) -> M:
    """Validate ``data`` as ``model``; on failure raise an InputError naming every bad key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(file, problems=problems_from_validation(exc, prefix, model)) from None


class _Refused(MarkedYAMLError):
    """A document past one of the loader's bounds (reported like a syntax error, with its line)."""


class _BoundedComposer(Composer):
    """PyYAML's composer, counting the nodes a document expands to (an alias counts as the nodes
    of what it names), its nesting depth, and refusing an alias inside the node it names and a
    key given twice in one mapping."""

    def __init__(self) -> None:
        super().__init__()
        self._expanded = 0  # nodes so far, aliases expanded
        self._depth = 0
        self._anchor_nodes: dict[str, int] = {}  # anchor -> nodes of what it names
        self._open: set[str] = set()  # anchors whose node is being composed

    def _count(self, n: int, mark: Any) -> None:
        self._expanded += n
        if self._expanded > MAX_YAML_NODES:
            raise _Refused(None, None, f"the document expands to more than {MAX_YAML_NODES:,} values (aliases "
                                       "counted at the size of what they name); not read", mark)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self._open:
                raise _Refused(None, None, f"alias *{event.anchor} is inside the node it names (a recursive "
                                           "structure)", event.start_mark)
            self._count(self._anchor_nodes.get(event.anchor, 1), event.start_mark)
            return super().compose_node(parent, index)
        nested = isinstance(event, CollectionStartEvent)
        if nested:
            self._depth += 1
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", event.start_mark)
        anchor = event.anchor
        before = self._expanded
        self._count(1, event.start_mark)
        if anchor is not None:
            self._open.add(anchor)
        node = super().compose_node(parent, index)
        if anchor is not None:
            self._open.discard(anchor)
            self._anchor_nodes[anchor] = self._expanded - before
        if nested:
            self._depth -= 1
        return node

    def compose_mapping_node(self, anchor: Any) -> Any:
        node = super().compose_mapping_node(anchor)
        seen: set[tuple[str, str]] = set()
        for key, _ in node.value:
            if isinstance(key, ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                ident = (key.tag, key.value)
                if ident in seen:
                    raise _Refused(None, None, f"key {key.value!r} given twice in one mapping", key.start_mark)
                seen.add(ident)
        return node


try:  # libyaml's scanner and parser when present (several times faster), composed in Python
    from yaml._yaml import CParser as _Parser

    class _Loader(_BoundedComposer, _Parser, SafeConstructor, Resolver):  # type: ignore[misc]
        def __init__(self, stream: str) -> None:
            _Parser.__init__(self, stream)
            _BoundedComposer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Loader(Reader, Scanner, Parser, _BoundedComposer, SafeConstructor, Resolver):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)
            _BoundedComposer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)


def parse_yaml(text: str, file: str | None = None) -> Any:
    """Parse YAML ``text`` with the bounded safe loader (module docstring); a syntax error or a
    document past a bound becomes an InputError naming ``file`` and the line."""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        what = problem if isinstance(exc, _Refused) else f"not valid YAML: {problem}"
        raise InputError(file, where, what) from None
    except RecursionError:  # pragma: no cover - the depth bound comes first
        raise InputError(file, "", f"nested too deeply; expected at most {MAX_YAML_DEPTH} levels") from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file with the bounded safe loader (:func:`parse_yaml`); a missing file, one
    larger than :data:`~marssim.limits.MAX_YAML_BYTES`, a syntax error or a document past a bound
    becomes an InputError naming the file (and the line)."""
    data = read_bounded(path, MAX_YAML_BYTES, "a YAML file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(str(path), "", f"not a text file (byte {exc.start:,} is not UTF-8); expected YAML") from None
    return parse_yaml(text, str(path))
