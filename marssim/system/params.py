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

__all__ = ["split_system_spec", "apply_parameters", "format_system_spec"]


def split_system_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"dgx-h100-cluster:nodes=128"`` -> ``("dgx-h100-cluster", {"nodes": "128"})``; a spec
    without ``:`` (or whose ``:`` is not followed by ``key=value`` pairs) is returned whole."""
    name, sep, rest = spec.rpartition(":")
    if not sep or not name or "=" not in rest:
        return spec, {}
    params: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise InputError(spec, key.strip() or item, "expected parameters like 'dgx-h100-cluster:nodes=128'")
        if key.strip() in params:
            raise InputError(spec, key.strip(), "given twice")
        params[key.strip()] = value.strip()
    return name, params


def _typed(spec: str, key: str, raw: str, default: Any) -> Any:
    if isinstance(default, bool):
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise InputError(spec, key, f"expected true or false, got {raw!r}")
    if isinstance(default, int):
        try:
            value = int(raw)
        except ValueError:
            raise InputError(spec, key, f"expected a positive integer, got {raw!r}") from None
        if value <= 0:
            raise InputError(spec, key, f"expected a positive integer, got {raw!r}")
        return value
    if isinstance(default, float):
        try:
            value = float(raw)
        except ValueError:
            raise InputError(spec, key, f"expected a number, got {raw!r}") from None
        if not value > 0 or value == float("inf"):
            raise InputError(spec, key, f"expected a positive finite number, got {raw!r}")
        return value
    return raw


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
    values = {key: _typed(spec, key, given[key], default) if key in given else default
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


def format_system_spec(name: str, changed: dict[str, Any]) -> str:
    """The canonical spec: ``name`` and the changed parameters, sorted."""
    if not changed:
        return name
    return name + ":" + ",".join(f"{k}={changed[k]}" for k in sorted(changed))
