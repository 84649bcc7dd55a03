"""Reference tables in ``docs/`` generated from the pydantic models, so the docs cannot drift.

``python -m tools.docgen`` rewrites every table between its markers
(``<!-- docgen:NAME:start -->`` … ``<!-- docgen:NAME:end -->``); ``--check`` only reports
which files differ and exits 1. ``tests/project/test_docs.py`` runs the check in CI.

Types, bounds and defaults come from the model (its JSON schema and ``model_fields``);
the description column is each field's ``description=``: a field without one is a gap
the test reports, not something to paper over here.
"""

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from service.settings import Settings

# The one place the job spec is imported from: a move of the contract is a one-line change here.
from torchyard_contract.spec import JobSpec

REPO_ROOT = Path(__file__).resolve().parent.parent
REGENERATE_COMMAND = "python -m tools.docgen"
ENV_PREFIX = Settings.model_config.get("env_prefix", "")


@dataclass(frozen=True)
class Table:
    """One generated table: which model, which file, and how to render it."""

    name: str
    model: type[BaseModel]
    doc: Path
    render: Callable[[type[BaseModel]], str]

    @property
    def start(self) -> str:
        return f"<!-- docgen:{self.name}:start -->"

    @property
    def end(self) -> str:
        return f"<!-- docgen:{self.name}:end -->"


# --- rendering one field ---------------------------------------------------------------------


def _cell(text: str) -> str:
    """Markdown table cells cannot hold a bare ``|`` or a newline; ``<x`` would open a tag."""
    return re.sub(r"<(?=[A-Za-z/!])", "&lt;", text.replace("|", "\\|").replace("\n", " "))


def _code(text: str) -> str:
    return f"`{text}`"


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _resolve(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref")
    if ref:
        return defs[ref.rsplit("/", 1)[-1]]
    return prop


def _variants(prop: dict[str, Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives of a field, a nested ``anyOf``/``oneOf`` (a tagged union) flattened."""
    out = []
    for p in prop.get("anyOf", prop.get("oneOf", [prop])):
        out += _variants(p, defs) if ("anyOf" in p or "oneOf" in p) else [_resolve(p, defs)]
    return out


def _type_name(schema: dict[str, Any], list_word: str) -> str:
    if "enum" in schema:
        return " | ".join(_code(json.dumps(v)) for v in schema["enum"])
    if "$ref" in schema:  # a nested model: its name (described beside the table)
        return schema["$ref"].rsplit("/", 1)[-1]
    kind = schema.get("type", "any")
    if schema.get("format") == "path":
        return "path"
    if kind == "array":
        return f"{list_word} of {_type_name(schema.get('items', {}), list_word)}"
    return str(kind)


def _string_bounds(schema: dict[str, Any], noun: str = "chars") -> list[str]:
    parts = []
    low, high = schema.get("minLength"), schema.get("maxLength")
    if low is not None and high is not None and low > 0:
        parts.append(f"{low}–{high} {noun}")
    elif high is not None:
        parts.append(f"≤ {high} {noun}")
    if "pattern" in schema:
        parts.append(_code(schema["pattern"]))
    return parts


def _bounds(schema: dict[str, Any]) -> list[str]:
    """Human bounds of one (non-null) variant, e.g. ``1–64``, ``> 0, ≤ 86,400``."""
    kind = schema.get("type")
    if kind in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        xlow, xhigh = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if low is not None and high is not None:
            return [f"{_number(low)}–{_number(high)}"]
        parts = []
        if low is not None:
            parts.append(f"≥ {_number(low)}")
        if xlow is not None:
            parts.append(f"> {_number(xlow)}")
        if high is not None:
            parts.append(f"≤ {_number(high)}")
        if xhigh is not None:
            parts.append(f"< {_number(xhigh)}")
        return parts
    if kind == "string":
        return _string_bounds(schema)
    if kind == "array":
        parts = [f"≤ {schema['maxItems']} items"] if "maxItems" in schema else []
        return parts + [f"each {b}" for b in _bounds(schema.get("items", {}))]
    if kind == "object":
        parts = [f"≤ {schema['maxProperties']} entries"] if "maxProperties" in schema else []
        key = dict(schema.get("propertyNames", {}))
        values = schema.get("patternProperties", {})
        if len(values) == 1:
            (key_pattern, value), = values.items()
            key["pattern"] = key_pattern
        else:
            value = schema.get("additionalProperties", {})
        if key:
            parts.append("key " + ", ".join(_string_bounds(key)))
        if isinstance(value, dict) and _bounds(value):
            parts.append("value " + ", ".join(_bounds(value)))
        return parts
    return []


def _type_and_bounds(prop: dict[str, Any], defs: dict[str, Any], list_word: str) -> tuple[str, str]:
    variants = _variants(prop, defs)
    names = [_type_name(v, list_word) for v in variants]
    bounds = [b for v in variants for b in _bounds(v)]
    return " \\| ".join(_cell(n) for n in names), _cell(", ".join(bounds))


def _default(model: type[BaseModel], name: str, none: str = "null") -> str:
    field = model.model_fields[name]
    if field.default_factory is not None:
        empty = {list: "[]", dict: "{}"}.get(field.default_factory)  # type: ignore[call-overload]
        if empty and none == "unset":
            return none
        # Anything else is computed at start-up (e.g. the core count): the description says how.
        return _code(empty) if empty else "computed"
    value = field.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return none if none == "unset" else _code(none)
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str) and none == "unset":
        return _code(value)  # an environment variable's value is written without quotes
    return _code(json.dumps(value))


def _description(model: type[BaseModel], name: str) -> str:
    return _cell(model.model_fields[name].description or "")


# --- the tables ----------------------------------------------------------------------------


def render_spec_table(model: type[BaseModel]) -> str:
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    rows = [
        "| field | type | bounds | default | description |",
        "|---|---|---|---|---|",
    ]
    for name, prop in schema["properties"].items():
        kind, bounds = _type_and_bounds(prop, defs, "list")
        row = [_code(name), kind, bounds, _default(model, name), _description(model, name)]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def render_settings_table(model: type[BaseModel]) -> str:
    # Only types, bounds and descriptions are read from the schema; a default factory is never
    # called here, so the table does not depend on the machine that generates it.
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    rows = [
        "| variable | type | bounds | default | description |",
        "|---|---|---|---|---|",
    ]
    for name, prop in schema["properties"].items():
        kind, bounds = _type_and_bounds(prop, defs, "comma list")
        kind = kind.replace("null", "unset")
        env = _code(f"{ENV_PREFIX}{name}".upper())
        row = [env, kind, bounds, _default(model, name, "unset"), _description(model, name)]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def render_roles_table(_model: type[BaseModel]) -> str:
    """Role × route, from the authorization table itself (``service.api.authz.RULES``)."""
    from service.api.authz import CELLS, RULES

    rows = [
        "| method | route | rule | admin | member | viewer |",
        "|---|---|---|---|---|---|",
    ]
    for (method, path), rule in RULES.items():
        cells = CELLS[rule]
        row = [method, _code(path), _cell(rule.value), cells.admin, cells.member, cells.viewer]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


TABLES = (
    Table("jobspec", JobSpec, REPO_ROOT / "docs" / "spec.md", render_spec_table),
    Table("settings", Settings, REPO_ROOT / "docs" / "configuration.md", render_settings_table),
    # Not a model's fields: the rule table of service/api/authz.py (BaseModel stands in).
    Table("roles", BaseModel, REPO_ROOT / "docs" / "security.md", render_roles_table),
)


def undocumented_fields(model: type[BaseModel]) -> list[str]:
    """Fields of ``model`` with no (or a blank) description: what the docs cannot explain."""
    return [n for n, f in model.model_fields.items() if not (f.description or "").strip()]


def rewrite(text: str, table: Table) -> str:
    """``text`` with the block between ``table``'s markers replaced by the generated table."""
    head, sep, rest = text.partition(table.start)
    _, sep2, tail = rest.partition(table.end)
    if not sep or not sep2:
        raise ValueError(f"{table.doc}: markers {table.start} … {table.end} not found")
    return f"{head}{table.start}\n{table.render(table.model)}\n{table.end}{tail}"


def stale_docs(tables: tuple[Table, ...] = TABLES) -> list[Path]:
    """Files whose generated tables differ from what the models produce now."""
    return [t.doc for t in tables if rewrite(t.doc.read_text(), t) != t.doc.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE_COMMAND, description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if any table is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_docs()
        for path in stale:
            print(f"{path.relative_to(REPO_ROOT)} is stale; run: {REGENERATE_COMMAND}")
        return 1 if stale else 0
    for table in TABLES:
        text = table.doc.read_text()
        new = rewrite(text, table)
        if new != text:
            table.doc.write_text(new)
            print(f"rewrote {table.name} in {table.doc.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
