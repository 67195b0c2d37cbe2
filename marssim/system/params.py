"""Parameterised system files: ``dgx-h100-cluster:nodes=128,oversubscription=2``.

A system file may declare ``parameters:`` with their defaults; any string value of the file that
is exactly ``"{name}"`` takes the parameter's value (its type is the default's), and ``{name}``
inside a longer string (a description) is replaced by its text. A default may carry bounds, as
``{default: 72, low: 2, high: 72}``: a value given outside them is refused naming the parameter. A
spec string overrides the defaults; its canonical form lists the overridden parameters in sorted
order, so two specs naming the same system compare equal.
"""

from __future__ import annotations

from typing import Any

from marssim.errors import InputError
from marssim.specs import Field, coerce, field_like

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
    defaults = {key: _declared(file, key, value) for key, value in declared.items()}
    values = {key: coerce(spec, key, given[key], field) if key in given else default
              for key, (default, field) in defaults.items()}
    changed = {k: v for k, v in values.items() if v != defaults[k][0]}
    body = {k: v for k, v in data.items() if k != "parameters"}
    return _substitute(body, values), changed


def _declared(file: str, key: str, value: Any) -> tuple[Any, Field]:
    """A declared parameter's default and the field a given value must fit: the default's kind,
    within ``low`` and ``high`` where the declaration gives them."""
    if not isinstance(value, dict):
        return value, field_like(value)
    if "default" not in value or set(value) - {"default", "low", "high"}:
        raise InputError(file, f"parameters.{key}",
                         f"expected a default value or {{default, low, high}}, got {value!r}")
    default = value["default"]
    base = field_like(default)
    low, high = value.get("low", base.low), value.get("high", base.high)
    return default, Field(base.kind, low=low, high=high, choices=base.choices)


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
