"""Options: BasicSR-style YAML -> validated dict with defaults; errors name the key path."""

from anysr.options.fields import Field, ListOf, MapOf, Section
from anysr.options.loader import (
    apply_overrides,
    data_overrides,
    load_options,
    parse_override,
    read_options_file,
    read_yaml,
    validate_dataset,
    validate_options,
)
from anysr.options.schema import OPTIONS
from anysr.options.typed import Options, plain

__all__ = [
    "OPTIONS",
    "Options",
    "Field",
    "ListOf",
    "MapOf",
    "Section",
    "apply_overrides",
    "data_overrides",
    "load_options",
    "parse_override",
    "plain",
    "read_options_file",
    "read_yaml",
    "validate_dataset",
    "validate_options",
]
