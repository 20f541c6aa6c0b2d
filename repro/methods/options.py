"""Method options, typed from the method's defaults: an option takes the type of its default value.

    bool    True or False; the strings "true" / "false" (any case)
    int     an integer, a float with an integral value (100.0), or a string of one ("100")
    float   any real number (an int becomes a float, so k=1 and k=1.0 are the same option), or a string
            of one ("1.5")
    str     a string
    None    a string, or None (the string "none", any case, is None)

Strings are accepted because command lines and configs deliver them (`--method-options k=1.5`). A value
that fits none of these is a ValueError of one line naming the method, the option and what it takes, so
`repro train`, `repro table`, Int8TrainingHook and the Python API all report it the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def typed_options(method: str, defaults: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` converted to the types of `defaults` (every key of options must be in defaults)."""
    return {name: typed_option(method, name, defaults[name], value) for name, value in options.items()}


def typed_option(method: str, name: str, default: Any, value: Any) -> Any:
    convert, takes = _CONVERTERS.get(type(default), (None, ""))
    if convert is None:
        return value  # a default of another type: the method's validate() checks the value
    try:
        return convert(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"option {name} of method {method} takes {takes}, got {value!r}") from None


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError


def _integer(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int):
        return value
    number = float(value)  # a str or a float; anything else raises, and typed_option says what it takes
    if number.is_integer():
        return int(number)
    raise ValueError


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError
    return float(value)


def _optional_string(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.lower() == "none"):
        return None
    if isinstance(value, str):
        return value
    raise ValueError


def _string(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ValueError


_CONVERTERS = {
    bool: (_boolean, "true or false"),
    int: (_integer, "an integer"),
    float: (_number, "a number"),
    str: (_string, "a string"),
    type(None): (_optional_string, "a string or none"),
}
