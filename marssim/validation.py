"""Turn pydantic validation failures into :class:`~marssim.errors.InputError` with key paths, and
read YAML files with errors that name the file and line."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import InputError, format_path

__all__ = ["validate_model", "read_yaml", "problems_from_validation"]

M = TypeVar("M", bound=BaseModel)


def _message(err: dict[str, Any], model: type[BaseModel] | None) -> str:
    kind = err.get("type", "")
    msg = str(err.get("msg", ""))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "missing required key"
    got = err.get("input")
    if kind.endswith("_type") or kind.startswith(("literal", "enum", "greater", "less", "int_", "float_", "too_short")):
        return f"{msg[0].lower() + msg[1:]}, got {got!r}" if msg else f"invalid value {got!r}"
    return msg


def problems_from_validation(exc: ValidationError, prefix: Sequence[str | int] = ()) -> list[tuple[str, str]]:
    """One ``(key path, message)`` pair per pydantic error, paths prefixed by ``prefix``."""
    out = []
    for err in exc.errors():
        loc = [p for p in err.get("loc", ()) if not (isinstance(p, str) and "[" in p and p.startswith("function-"))]
        out.append((format_path([*prefix, *loc]), _message(err, None)))
    return out


def validate_model(model: type[M], data: Any, file: str | None, prefix: Sequence[str | int] = ()) -> M:
    """Validate ``data`` as ``model``; on failure raise an InputError naming every bad key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(file, problems=problems_from_validation(exc, prefix)) from None


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
