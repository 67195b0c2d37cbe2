"""Input schemas: pydantic validation failures as :class:`~marssim.errors.InputError` with key paths, and
read YAML files with errors that name the file and line."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import InputError, format_path

__all__ = ["validate_model", "read_yaml", "problems_from_validation"]

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


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a missing file or a syntax error becomes an InputError naming the line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(p), "", "file not found") from None
    except OSError as exc:
        raise InputError(str(p), "", f"cannot read file ({exc.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(str(p), where, f"not valid YAML: {problem}") from None
