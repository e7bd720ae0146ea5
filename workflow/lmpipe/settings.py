"""A setting is a dataclass field that carries its own type, default, description and
constraints; the JSON schema of a dataclass of settings is read off its fields.

Every setting of the config is written once, as a field of a dataclass (lmpipe.config's
sections, lmpipe.registry's optimizer, evaluation and architecture settings):

    lr_floor: float = setting(0.0, "final lr as a fraction of the peak", minimum=0, maximum=1)

The field's type gives the schema's type, its default the schema's default (which Snakemake's
validate() fills in) and the dataclass's, the keywords the JSON-schema constraints. The config's
schema file is generated from them (lmpipe.config_schema). Pure Python: a stage job imports it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import field
from typing import Any

# a field's metadata holds JSON-schema keywords and, for `optional()`, this marker
OPTIONAL = "lmpipe_optional"

JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def setting(default: Any = None, description: str = "", **schema: Any) -> Any:
    """A setting with its default (filled in by the schema), a description and JSON-schema
    constraints (minimum, enum, ...). A default of None on an `X | None` field is a null the
    YAML may also write."""
    meta = {"description": description, **schema}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def required(description: str = "", **schema: Any) -> Any:
    """A setting the YAML must give."""
    return field(metadata={"description": description, **schema})


def optional(description: str = "", default: Any = None, **schema: Any) -> Any:
    """A setting the YAML may leave out, with no default in the schema: the checked config has
    no such key then (so a rule's params stay as they are), and the dataclass holds `default`
    (None: not given; a pretraining run's max_steps: 0)."""
    return field(default=default, metadata={"description": description, OPTIONAL: True, **schema})


def section_schema(cls: type, **custom: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of a dataclass of settings: each field's type, default, description and
    constraints, a nested dataclass as a nested object, unknown keys refused. `custom` maps a
    field name to its schema where the type cannot say it (`optimizer`: one of several)."""
    hints = typing.get_type_hints(cls)
    props, required_ = {}, []
    for f in dataclasses.fields(cls):
        meta = {k: v for k, v in f.metadata.items() if v != ""}
        is_optional = meta.pop(OPTIONAL, False)
        if f.name in custom:
            prop = meta | custom[f.name]
        else:
            prop = meta | _json_type(hints[f.name], meta, is_optional, f"{cls.__name__}.{f.name}")
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required_.append(f.name)
        elif not is_optional:
            prop["default"] = _json_default(f)
        props[f.name] = {k: prop[k] for k in sorted(prop, key=lambda k: k != "description")}
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if required_:
        schema["required"] = required_
    schema["properties"] = props
    doc = _doc(cls)
    return {"description": doc, **schema} if doc else schema


def _json_type(hint: Any, meta: dict[str, Any], is_optional: bool, where: str) -> dict[str, Any]:
    """The JSON-schema type of a field's type hint (`X | None` nullable unless `optional`)."""
    args = typing.get_args(hint)
    nullable = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
    if nullable:
        (hint,) = [a for a in args if a is not type(None)]
    if dataclasses.is_dataclass(hint) and nullable and not is_optional:
        # Snakemake's validate() fills in defaults under a null too, and fails there
        raise TypeError(f"{where}: a nested section is optional() or has a default, never null")
    if dataclasses.is_dataclass(hint):  # its docstring describes it, unless the field does
        out = section_schema(hint)
        doc = out.pop("description", "")
        out = ({"description": doc} if doc and not meta.get("description") else {}) | out
        kind = out.pop("type")
    elif hint in JSON_TYPES:
        out, kind = {}, JSON_TYPES[hint]
    elif typing.get_origin(hint) in (list, tuple):
        item_types = typing.get_args(hint)
        items = {"type": JSON_TYPES[item_types[0]]} | meta.get("items", {})
        out, kind = {"items": items}, "array"
        if typing.get_origin(hint) is tuple and item_types[-1] is not Ellipsis:
            out |= {"minItems": len(item_types), "maxItems": len(item_types)}
    else:
        raise TypeError(f"{where}: no JSON type for {hint}")
    return {"type": [kind, "null"] if nullable and not is_optional else kind} | out


def _json_default(f: dataclasses.Field) -> Any:
    """A field's default as the schema writes it: a nested dataclass as the keys where it
    differs from its class's defaults ({}: all of them), a tuple as a list."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    value = f.default
    if dataclasses.is_dataclass(value):
        own = dataclasses.asdict(value)
        return {k: v for k, v in own.items() if v != dataclasses.asdict(type(value)())[k]}
    return list(value) if isinstance(value, tuple) else value


def _doc(cls: type) -> str:
    """A class's docstring as one paragraph; none for the signature dataclasses write."""
    doc = cls.__doc__ or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return " ".join(doc.split())
