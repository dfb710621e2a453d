"""Options: BasicSR-style YAML -> validated dict with defaults; errors name the key path."""

from anysr.options.fields import Field, ListOf, MapOf, Section
from anysr.options.loader import apply_overrides, load_options, parse_override, read_yaml, validate_options
from anysr.options.schema import OPTIONS

__all__ = [
    "OPTIONS",
    "Field",
    "ListOf",
    "MapOf",
    "Section",
    "apply_overrides",
    "load_options",
    "parse_override",
    "read_yaml",
    "validate_options",
]
