"""Specs and key=value pairs from the command line: a JSON or YAML spec file, ``--label k=v``."""

import json
import re
from pathlib import Path
from typing import Any

import typer
import yaml


def parse_pairs(pairs: list[str], option: str) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint=option)
        out[key] = value
    return out


class SpecLoader(yaml.SafeLoader):
    """YAML with YAML 1.2's numbers: ``1e-3`` is a float. PyYAML (YAML 1.1) reads it as the string
    "1e-3", which the server refuses (spec numbers are never coerced from strings)."""


SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def yaml_value(text: str) -> Any:
    return yaml.load(text, Loader=SpecLoader)  # SpecLoader is a SafeLoader: no objects built


def load_spec_file(path: Path) -> dict[str, Any]:
    """A job spec from a ``.json`` file or a YAML one (``.yaml``/``.yml``); must be a mapping."""
    text = path.read_text(encoding="utf-8")
    try:
        spec = json.loads(text) if path.suffix == ".json" else yaml_value(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"{path} is not valid: {exc}", param_hint="SPEC_FILE") from None
    if not isinstance(spec, dict):
        raise typer.BadParameter(f"{path} must hold a mapping of spec fields", param_hint="SPEC_FILE")
    return spec
