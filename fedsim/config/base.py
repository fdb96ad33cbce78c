"""What every config section shares: strict fields (unknown keys, inf/nan and bool/number mix-ups refused) and
a pydantic error turned into the one line the CLI prints."""
from __future__ import annotations

import difflib
import re
import reprlib
import types
import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

# Short: a value in an error may be huge (a whole section, an alias expansion).
SHORT = reprlib.Repr()
SHORT.maxstring = SHORT.maxother = 40
SHORT.maxlist = SHORT.maxdict = 3
SHORT.maxlevel = 1


INT64 = 2**63  # every count and size ends up in numpy, torch or Ray, which hold 64-bit integers


def scalar_types(annotation: Any) -> set:
    """``int | None`` -> {int, NoneType}; ``Literal[...]``, ``dict[...]`` -> their origin."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(scalar_types(a) for a in typing.get_args(annotation)))
    return {origin or annotation}


class Section(BaseModel):
    """A config section: its keys are exactly its fields."""
    # inf/nan are never meaningful settings (round_timeout_s: .inf would reach Ray as a timeout).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    # Fields whose product fedsim.config.checks.check_work bounds: too large, they are refused with the estimate.
    counted_by_the_work_estimate: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_number_confusion(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic's lax mode turns true into 1 and 1 into true; in a config that is always a typo."""
        assert info.field_name is not None  # a field validator always validates a field
        wanted = scalar_types(cls.model_fields[info.field_name].annotation)
        if bool in wanted and not isinstance(value, bool) and not (value is None and type(None) in wanted):
            raise ValueError("expected true or false")
        if isinstance(value, bool) and bool not in wanted and wanted & {int, float}:
            raise ValueError("expected a number, not true/false")
        if isinstance(value, float) and value.is_integer() and int in wanted and float not in wanted:
            return int(value)  # 1e26 as the number it is (pydantic takes 1e6 but not a float past 64 bits)
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul_and_no_overflow(cls, value: Any, info: ValidationInfo) -> Any:
        """Values every consumer can take: checked here, where the field is named, not where they fail later."""
        if isinstance(value, str) and "\0" in value:
            # The OS refuses a path holding a NUL with a bare "embedded null byte", far from the field.
            raise ValueError("holds a NUL byte (\\0), which no path or name can contain; remove it")
        if (isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64
                and info.field_name not in cls.counted_by_the_work_estimate):
            raise ValueError(f"{value:.3g} is beyond a 64-bit integer, which numpy, torch and Ray count in; give a "
                             "smaller number")
        return value


def format_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """The first error of ``err`` as one line naming its dotted field (under ``prefix``); an unknown key of
    ``model`` (the class ``err`` validated) gets the nearest key its section knows."""
    first = err.errors()[0]
    message = first["msg"].removeprefix("Value error, ")
    if re.match(r"^[\w.]+: ", message):
        return message  # a validator's own message, which names its field
    where = ".".join(str(p) for p in ((prefix,) if prefix else ()) + tuple(first["loc"]))
    if where:
        got = SHORT.repr(first.get("input"))
        hint = _did_you_mean(model, first["loc"]) if first["type"] == "extra_forbidden" else ""
        return f"{where}: {message} (got {got}){hint}"
    return f"config: {message}"


def _did_you_mean(model: type[BaseModel] | None, loc: tuple) -> str:
    """``; did you mean rounds?`` for the unknown last key of ``loc``, from its section's own field names."""
    section = model
    for key in loc[:-1]:
        field = section.model_fields.get(str(key)) if section is not None else None
        section = _section_class(field.annotation) if field is not None else None
    if section is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(section.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _section_class(annotation: Any) -> type[BaseModel] | None:
    """The config section a field holds (``PrivacyConfig | None`` -> PrivacyConfig), or None for a value."""
    for kind in scalar_types(annotation):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind
    return None
