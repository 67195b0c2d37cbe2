"""Spec strings, parsed once: ``name:key=value,...`` names a system or a workload
(``dgx-h100-cluster:nodes=128``, ``bert-base:seq=512,batch=4``, ``model.onnx:batch=8``) and
``key=value,...`` a parallel configuration (``tp=8,pp=2,dp=8,sp=true``).

One grammar, one typed coercion and one error style for all three: every problem is an
:class:`~marssim.errors.InputError` naming the spec, the key and what was expected
(``dgx-h100-cluster:nodes=x: nodes: expected an integer >= 1, got 'x'``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marssim.errors import InputError

__all__ = ["Spec", "Field", "KeyValues", "field_like", "split_spec", "parse_items", "parse_params", "coerce",
           "format_spec"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Spec:
    """A parsed spec: its ``name`` ("" for a bare ``key=value,...``) and its raw parameters, in
    the order given."""

    text: str
    name: str
    params: dict[str, str]


@dataclass(frozen=True)
class Field:
    """What a parameter takes: ``kind`` one of ``bool``, ``int``, ``float``, ``str``, ``ints``
    (one integer per pipeline stage, ``10/12/12/14``) and ``floats`` (one number per item,
    ``3/1/1/1.5``); ``low`` and ``high``: the
    smallest and largest number allowed (inclusive); ``choices``: the strings allowed."""

    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    def _range(self, fmt) -> str:
        if self.low is not None and self.high is not None:
            return f" from {fmt(self.low)} to {fmt(self.high)}"
        if self.low is not None:
            return f" >= {fmt(self.low)}"
        return f" <= {fmt(self.high)}" if self.high is not None else ""

    def allows(self, number: float) -> bool:
        return (self.low is None or number >= self.low) and (self.high is None or number <= self.high)

    def expectation(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "int":
            if self.low == 1 and self.high is None:
                return "a positive integer"
            return "an integer" + self._range(int)
        if self.kind == "float":
            return "a finite number" + self._range(lambda x: f"{x:g}")
        if self.kind == "ints":
            return "one integer per stage like 10/12/12/14" + (f", each{self._range(int)}" if self._range(int) else "")
        if self.kind == "floats":
            rng = self._range(lambda x: f"{x:g}")
            return "numbers separated by / like 3/1/1/1.5" + (f", each{rng}" if rng else "")
        if self.choices:
            return "one of " + ", ".join(self.choices)
        return "a value"


def field_like(default: Any) -> Field:
    """The field a default value implies: a bool, an integer >= 1, a finite number >= 0, numbers
    >= 0 separated by ``/`` (a tuple) or text."""
    if isinstance(default, bool):
        return Field("bool")
    if isinstance(default, tuple):
        return Field("floats", low=0.0)
    if isinstance(default, int):
        return Field("int", low=1)
    if isinstance(default, float):
        return Field("float", low=0.0)
    return Field("str")


@dataclass(frozen=True)
class KeyValues:
    """``key=value,...`` text split once: ``named`` the raw values by key, in the order given;
    ``positional`` the items without ``=`` where the grammar allows them (``trace:NAME``'s name)."""

    named: dict[str, str]
    positional: tuple[str, ...] = ()


def parse_items(text: str, where: str, *, file: str | None = None, expected: str = "",
                positional: bool = False, continues: Callable[[str, str], bool] | None = None) -> KeyValues:
    """The one reader of ``key=value,...`` text (spec parameters, ``--pool``, ``--slo``, request
    specs, ``--gpu-price``): items separated by commas, blanks around them ignored, each key once.

    ``where``: the flag or key path errors name (``--pool``; a repeated key is named
    ``where.key``, or ``key`` when ``where`` is empty); ``file``: the file or spec the text came
    from (None for a flag); ``expected``: what the grammar takes, shown when an item is not
    ``key=value`` (default: key=value pairs separated by commas); ``positional``: items without
    ``=`` are kept in order instead of refused; ``continues(last_key, item)``: True when ``item``
    belongs to the value of the key before it (a draft model's own parameters after
    ``spec_model=``), joined to it with its comma. Raises InputError."""
    named: dict[str, str] = {}
    loose: list[str] = []
    last = ""
    for raw in str(text).split(","):
        item = raw.strip()
        if not item:
            continue
        if last and continues is not None and continues(last, item):
            named[last] += "," + item
            continue
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq and positional:
            loose.append(item)
            continue
        if not eq or not key or not value:
            what = expected or "key=value pairs separated by commas"
            raise InputError(file, where or key or item, f"expected {what}, got {item!r}")
        if key in named:
            raise InputError(file, f"{where}.{key}" if where else key,
                             f"given twice ({named[key]} and {value}); expected each key once")
        named[key] = value
        last = key
    return KeyValues(named, tuple(loose))


def parse_params(where: str, text: str) -> dict[str, str]:
    """``"a=1,b=2"`` -> ``{"a": "1", "b": "2"}`` (the parameters of spec ``where``); InputError
    for an item without ``=`` or a key given twice."""
    return parse_items(text, "", file=where, expected="parameters as key=value pairs separated by commas").named


def split_spec(text: str, *, named: bool = True) -> Spec:
    """Parse ``text``. ``named``: ``name:key=value,...``, split at the last ``:`` (a ``:``
    followed by a path, as in ``C:\\systems\\x.yaml``, belongs to the name); otherwise the whole
    text is ``key=value,...``."""
    if not named:
        return Spec(text, "", parse_params(text, text))
    name, sep, rest = text.rpartition(":")
    if not sep or not name or ("=" not in rest and ("/" in rest or "\\" in rest)):
        return Spec(text, text.strip(), {})
    return Spec(text, name.strip(), parse_params(text, rest))


def coerce(where: str, key: str, raw: Any, field: Field) -> Any:
    """``raw`` (text from a spec, or a value from a YAML file) as ``field`` takes it; InputError
    naming ``where`` and ``key`` otherwise."""

    def refuse() -> InputError:
        return InputError(where, key, f"expected {field.expectation()}, got {raw!r}")

    kind = field.kind
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise refuse()
    if kind == "int":
        value = _integer(raw)
        if value is None or not field.allows(value):
            raise refuse()
        return value
    if kind == "float":
        if isinstance(raw, bool):
            raise refuse()
        try:
            number = float(raw)
        except (TypeError, ValueError):
            raise refuse() from None
        if not math.isfinite(number) or not field.allows(number):
            raise refuse()
        return number
    if kind == "ints":
        parts = raw if isinstance(raw, (list, tuple)) else str(raw).replace(" ", "").split("/")
        values = tuple(_integer(p) for p in parts)
        if not values or any(v is None or not field.allows(v) for v in values):
            raise refuse()
        return values
    if kind == "floats":
        parts = raw if isinstance(raw, (list, tuple)) else str(raw).replace(" ", "").split("/")
        numbers = tuple(_number(p) for p in parts)
        if not numbers or any(v is None or not math.isfinite(v) or not field.allows(v) for v in numbers):
            raise refuse()
        return numbers
    text = str(raw).strip()
    if field.choices and text not in field.choices:
        raise refuse()
    return text


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def _integer(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, float):
        return int(raw) if raw.is_integer() else None
    try:
        return int(str(raw).strip())
    except ValueError:
        return None


def format_spec(name: str, params: dict[str, Any]) -> str:
    """The canonical spec: ``name`` and ``params`` sorted by key (equal specs compare equal)."""
    if not params:
        return name

    def text(value: Any) -> str:
        return "/".join(f"{v:g}" for v in value) if isinstance(value, tuple) else str(value)

    return name + ":" + ",".join(f"{k}={text(params[k])}" for k in sorted(params))
