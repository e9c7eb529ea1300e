"""Typed ``vllm serve`` flags: schema, flag sets, validation, and command-line round trips.

The schema comes from the installed vLLM's own argparse parser when vLLM is importable
(so validation matches the version on this box), extracted once in a subprocess --
importing vLLM takes seconds -- and cached as JSON in ``data_dir()/schema-<version>.json``.
Without vLLM a built-in schema of the tuning flags is used; any other flag can still be
set and is reported as unknown by :func:`validate` only when the schema is vLLM's.

A :class:`FlagSet` turns into an argv list (for exec, never a shell string), a
``vllm serve`` line quoted with shlex, or a ``docker run`` line, and
:func:`parse_command_line` reads those lines (and the ones in blog posts) back.
Secrets (``--api-key``, ``--hf-token``) never appear in exported lines: they are
written as references to environment variables.

The package's rooms: ``spec`` (one flag: FlagSpec, the tuning and secret flags), ``schema``
(the flags of the installed vLLM, cached per version), ``flagset`` (FlagSet and the lines
written from it), ``cmdline`` (lines read back), ``validate`` (checks across flags), ``edited``
(the flags being edited, checked as they change). Import from ``engine.flags``; the submodules
are for the package itself and its tests.
"""

from __future__ import annotations

from engine.flags.cmdline import parse_argv, parse_command_line, read_argv, read_command_line
from engine.flags.flagset import CommandLine, DockerRun, FlagSet, FlagsLike, default_image, devices_needed
from engine.flags.schema import Schema, background_held, builtin_schema, installed_vllm_version, load_schema, schema_pending
from engine.flags.spec import SECRET_FLAGS, TUNING_FLAGS, FlagError, FlagSpec, FlagValue
from engine.flags.validate import recordable_values, validate, validation_warnings

__all__ = [
    "SECRET_FLAGS",
    "TUNING_FLAGS",
    "CommandLine",
    "DockerRun",
    "FlagError",
    "FlagSet",
    "FlagSpec",
    "FlagValue",
    "FlagsLike",
    "Schema",
    "background_held",
    "builtin_schema",
    "default_image",
    "devices_needed",
    "installed_vllm_version",
    "load_schema",
    "parse_argv",
    "parse_command_line",
    "read_argv",
    "read_command_line",
    "recordable_values",
    "schema_pending",
    "validate",
    "validation_warnings",
]
