"""Parameterised system files: ``dgx-h100-cluster:nodes=128,oversubscription=2``.

A system file may declare ``parameters:`` with their defaults; any string value of the file that
is exactly ``"{name}"`` takes the parameter's value (its type is the default's), and ``{name}``
inside a longer string (a description) is replaced by its text. A spec string overrides the
defaults; its canonical form lists the overridden parameters in sorted order, so two specs
naming the same system compare equal.
"""

from __future__ import annotations

from typing import Any

from marssim.errors import InputError
from marssim.specs import coerce, field_like

__all__ = ["apply_parameters"]


def apply_parameters(data: Any, given: dict[str, str], file: str, spec: str) -> tuple[Any, dict[str, Any]]:
    """``data`` (a parsed system file) with its ``parameters:`` set from their defaults and
    ``given`` (spec strings) and substituted; returns it without the ``parameters`` key, and
    the parameters that differ from their defaults."""
    if not isinstance(data, dict):
        return data, {}
    declared = data.get("parameters") or {}
    if not isinstance(declared, dict):
        raise InputError(file, "parameters", f"expected a mapping of names to default values, got {declared!r}")
    for key in given:
        if key not in declared:
            allowed = ", ".join(sorted(declared)) or "none"
            raise InputError(spec, key, f"unknown parameter of this system; expected one of: {allowed}")
    values = {key: coerce(spec, key, given[key], field_like(default)) if key in given else default
              for key, default in declared.items()}
    changed = {k: v for k, v in values.items() if v != declared[k]}
    body = {k: v for k, v in data.items() if k != "parameters"}
    return _substitute(body, values), changed


def _substitute(value: Any, params: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        return {k: _substitute(v, params) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, params) for v in value]
    if isinstance(value, str) and "{" in value:
        for key, v in params.items():
            if value == "{" + key + "}":
                return v
            value = value.replace("{" + key + "}", str(v))
    return value
