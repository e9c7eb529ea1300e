"""Command lines read back: ``vllm serve``, ``python -m vllm.entrypoints...`` and ``docker run``
lines (as written in blog posts: continuations, quotes, ``$VARS``) into a CommandLine."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

from engine.flags.flagset import _DOCKER_VALUE_OPTS, CommandLine, DockerRun, FlagSet
from engine.flags.schema import Schema, load_schema
from engine.flags.spec import FlagError, FlagValue, _looks_like_option, _norm

_PY_MODULES = {
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.api_server",
    "vllm.entrypoints.cli.main",
    "vllm.entrypoints.launchers.api_server",
}
# Unquoted |, ;, &, <, > would make the line a pipeline or a redirection.
_SHELL_OP = re.compile(r"[|;&<>]+")



# An unquoted "\ --flag": a pasted multi-line command whose newlines were lost.
_LOST_BREAK = re.compile(r"(?<!\\)\\ +-")


def _mask_quoted(text: str, *, escapes: bool = True) -> str:
    """``text`` with everything inside quotes (and backslash escapes, if ``escapes``)
    replaced by "_" (same length)."""
    out = list(text)
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"' and i + 1 < len(text):
                out[i] = out[i + 1] = "_"
                i += 2
                continue
            if ch == quote:
                quote = ""
            else:
                out[i] = "_"
        elif ch == "\\":
            if escapes:
                out[i : i + 2] = "_" * len(out[i : i + 2])
            i += 2
            continue
        elif ch in "'\"":
            quote = ch
        i += 1
    return "".join(out)


def _join_continuations(text: str) -> str:
    """Drop backslash-newline pairs as a POSIX shell does (not inside single quotes)."""
    out: list[str] = []
    quote = ""
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and quote != "'":
            nxt = text[i + 1 : i + 2]
            if nxt == "\n":
                i += 2
                continue
            if text[i + 1 : i + 3] == "\r\n":
                i += 3
                continue
            out.append(text[i : i + 2])
            i += 2
            continue
        if quote == "" and ch in "'\"":
            quote = ch
        elif quote and ch == quote:
            quote = ""
        out.append(ch)
        i += 1
    return "".join(out)


def _split(text: str) -> list[str]:
    lost = _LOST_BREAK.search(_mask_quoted(text, escapes=False))
    if lost:
        raise FlagError(
            "",
            "a backslash followed by a space: was the line break after '\\' lost?"
            " (write each continuation as backslash + newline)",
            token=text[lost.start() : lost.end() + 20].strip(),
        )
    op = _SHELL_OP.search(_mask_quoted(text))
    if op:
        raise FlagError("", "shell operators are not part of a vLLM command line", token=op.group(0))
    joined = _join_continuations(text)
    lex = shlex.shlex(joined, posix=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        tokens = list(lex)
    except ValueError as exc:
        at = _open_quote(joined)
        if at is not None:
            raise FlagError("", f"the quote {joined[at]} here is never closed", token=joined[at : at + 40],
                            hint=f"close it with a matching {joined[at]}") from None
        raise FlagError("", f"cannot split the line: {exc}", token=joined[-40:]) from None
    return tokens


def _open_quote(text: str) -> int | None:
    """Where the quote that is never closed opens (shell rules: no escapes inside '...')."""
    quote, start, i = "", 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "'":
            i += 2
            continue
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote, start = ch, i
        i += 1
    return start if quote else None


def parse_command_line(text: str, schema: Schema | None = None) -> FlagSet:
    """Read a ``vllm serve``, ``python -m vllm.entrypoints...`` or ``docker run`` line.

    Backslash-newline continuations, leading ``$ `` prompts, ``VAR=value`` prefixes,
    ``sudo``/``env`` and ``# comments`` are accepted. Raises FlagError naming the
    flag or the token that cannot be read. The flags only: read_command_line() keeps
    the docker options and says what changed.
    """
    return read_command_line(text, schema).flags


def read_command_line(text: str, schema: Schema | None = None) -> CommandLine:
    """Like parse_command_line(), keeping the docker part and the notes (see CommandLine)."""
    text = text.strip()
    if text.startswith("$ "):
        text = text[2:]
    tokens = _split(text)
    return read_argv(tokens, schema)


def parse_argv(tokens: Sequence[str], schema: Schema | None = None) -> FlagSet:
    """Like parse_command_line() for an already split argv (e.g. a process's cmdline)."""
    return read_argv(tokens, schema).flags


def read_argv(tokens: Sequence[str], schema: Schema | None = None) -> CommandLine:
    """Like read_command_line() for an already split argv."""
    sch = schema or load_schema()
    toks = list(tokens)
    while toks and (toks[0] in ("sudo", "env", "exec", "nohup") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", toks[0])):
        toks.pop(0)
    if not toks:
        raise FlagError("", "empty command line", token="")
    prog = PurePosixPath(toks[0]).name
    if prog in ("docker", "podman", "nvidia-docker"):
        if len(toks) < 2 or toks[1] != "run":
            raise FlagError("", f"only '{prog} run' lines can be read", token=" ".join(toks[:2]))
        return _parse_docker(toks[2:], sch, program=prog)
    if prog == "vllm":
        if len(toks) < 2 or toks[1] != "serve":
            raise FlagError("", "only 'vllm serve' lines can be read", token=" ".join(toks[:2]))
        return CommandLine(_parse_serve_args(toks[2:], sch, positional_model=True))
    if re.fullmatch(r"python[0-9.]*", prog):
        rest = toks[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest.pop(0)  # interpreter switches such as -u, -O
        if len(rest) >= 2 and rest[0] == "-m" and rest[1] in _PY_MODULES:
            args = rest[2:]
            if rest[1] == "vllm.entrypoints.cli.main":
                if not args or args[0] != "serve":
                    raise FlagError("", "only the 'serve' subcommand can be read", token=" ".join(args[:1]))
                args = args[1:]
            return CommandLine(_parse_serve_args(args, sch, positional_model=True), "module",
                               notes=(_MODULE_NOTES.get(rest[1], _MODULE_NOTE_DEFAULT).format(module=rest[1]),))
        raise FlagError(
            "",
            "expected 'python -m vllm.entrypoints.openai.api_server' (or vllm.entrypoints.api_server)",
            token=" ".join(toks[:3]),
        )
    raise FlagError(
        "",
        "expected a line starting with 'vllm serve', 'python -m vllm.entrypoints...' or 'docker run'",
        token=toks[0],
    )


def _parse_docker(toks: list[str], sch: Schema, *, program: str = "docker") -> CommandLine:
    options: list[tuple[str, str | None]] = []
    notes: list[str] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if not tok.startswith("-") or tok == "-":
            break
        opt, eq, val = tok.partition("=")
        value: str | None = val if eq else None
        if not tok.startswith("--") and len(tok) > 2 and tok[:2] in _DOCKER_VALUE_OPTS:
            opt, value, eq = tok[:2], tok[2:], "="  # glued short option: -p8000:8000, -eFOO=bar
        if opt in _DOCKER_VALUE_OPTS and not eq:
            if i + 1 >= len(toks):
                raise FlagError("", f"docker option {opt} needs a value", token=tok)
            value = toks[i + 1]
            i += 2
        elif opt.startswith("--") and not eq and opt not in _DOCKER_SWITCHES:
            raise FlagError(
                "", "unknown docker run option: cannot tell whether it takes a value", token=tok
            )
        else:
            i += 1
        if opt in ("-e", "--env") and value is not None and "=" in value:
            var = value.split("=", 1)[0]
            if _SECRET_ENV.search(var):
                # Its value would be in every export: keep the name, so docker passes it
                # from the environment it runs in.
                notes.append(f"-e {var}=... was read as -e {var}: its value is not kept or exported; "
                             f"set {var} in the environment that runs docker")
                value = var
        options.append((opt, value))
    if i >= len(toks):
        raise FlagError("", "no image found in the docker run line", token=" ".join(toks[-1:]))
    image, args = toks[i], toks[i + 1 :]
    docker = DockerRun(tuple(options), image, program)
    if args and (args[0] == "vllm" or PurePosixPath(args[0]).name.startswith("python")):
        inner = read_argv(args, sch)  # an image run with an explicit command
        fs, notes = inner.flags, [*notes, *inner.notes]
    elif "vllm" in image:
        fs = _parse_serve_args(args, sch, positional_model=True)
    else:
        raise FlagError(
            "", "the image is not vllm/vllm-openai and no 'vllm serve' command follows it", token=image
        )
    # Map the model path back from the container to the host folder it was mounted from.
    model = fs.model
    if model.startswith("/"):
        model = docker.host_path(model) or model
    return CommandLine(FlagSet(model, fs.values, fs.schema), "docker", docker, tuple(notes))


# An environment variable whose value must not be kept: tokens, keys, passwords.
_SECRET_ENV = re.compile(r"TOKEN|KEY|SECRET|PASSW", re.IGNORECASE)

_MODULE_NOTE_DEFAULT = "`python -m {module}` is the server `vllm serve` runs: exports write it as `vllm serve`"
_MODULE_NOTES = {
    "vllm.entrypoints.api_server": (
        "`python -m {module}` is vLLM's legacy demo server (POST /generate only, no OpenAI API); "
        "vtui runs and exports the OpenAI-compatible `vllm serve` with the same flags instead"
    ),
}


_DOCKER_SWITCHES = {
    "--rm", "--detach", "--interactive", "--tty", "--privileged", "--init", "--read-only",
    "--sig-proxy", "--no-healthcheck", "--oom-kill-disable", "--publish-all", "--disable-content-trust",
}


def _parse_serve_args(args: Sequence[str], sch: Schema, *, positional_model: bool) -> FlagSet:
    values: dict[str, FlagValue] = {}
    model: str | None = None
    i = 0
    n = len(args)
    while i < n:
        tok = args[i]
        if not tok.startswith("-") or tok in ("-", "--") or re.fullmatch(r"-\d+(\.\d*)?", tok):
            if tok == "--":
                i += 1
                continue
            if positional_model and model is None and "model" not in values:
                model = tok
                i += 1
                continue
            raise FlagError("", "unexpected positional argument (the model is already given)", token=tok)
        raw_name, has_eq, inline = tok.partition("=")
        name = _norm(raw_name)
        if not raw_name.startswith("--") and len(raw_name) > 2 and sch.get(raw_name[:2]) and not sch.get(name):
            # argparse's "-tp4"/"-O3" style: a short option glued to its value.
            has_eq, inline, raw_name = "=", raw_name[2:] + (("=" + inline) if has_eq else ""), raw_name[:2]
            name = _norm(raw_name)
        negated = False
        spec = sch.get(name)
        if spec is None and name.startswith("no-"):
            base = sch.get(name[3:])
            if base is not None and base.kind == "bool" and base.negatable:
                spec, negated = base, True
        if name == "model":
            if has_eq:
                value, i = inline, i + 1
            elif i + 1 < n:
                value, i = args[i + 1], i + 2
            else:
                raise FlagError("model", "needs a value", token=tok)
            if model is not None and model != value:
                raise FlagError("model", f"given twice: {model!r} and {value!r}", token=tok)
            model = value
            continue
        if "." in name and sch.get(name.split(".", 1)[0]):
            raise FlagError(
                name.split(".", 1)[0],
                "dotted sub-keys (--x.key value) are not supported; give the whole JSON value",
                token=tok,
            )
        if spec is None:
            # Unknown flag: keep it as given so validate() can name it (with a
            # "did you mean"). A following non-flag token is taken as its value.
            if has_eq:
                values[name] = inline
                i += 1
            elif i + 1 < n and not args[i + 1].startswith("-"):
                values[name] = args[i + 1]
                i += 2
            else:
                values[name] = True
                i += 1
            continue
        if spec.kind == "bool":
            if has_eq:
                raise FlagError(
                    spec.name,
                    f"takes no value; write --{spec.name} or"
                    + (f" --no-{spec.name}" if spec.negatable else " leave it out"),
                    token=tok,
                )
            values[spec.name] = not negated
            i += 1
            continue
        if spec.kind == "list" and not spec.append:
            items: list[str] = []
            if has_eq:
                items.append(inline)
                i += 1
            else:
                i += 1
                while i < n and not _looks_like_option(args[i]):
                    items.append(args[i])
                    i += 1
            if not items:
                raise FlagError(spec.name, "needs at least one value", token=tok)
            try:
                values[spec.name] = tuple(spec._parse_item(x) for x in items)
            except FlagError as exc:
                raise FlagError(exc.flag, exc.reason, token=" ".join(items)) from None
            continue
        if has_eq:
            text, i = inline, i + 1
        elif i + 1 < n and not _looks_like_option(args[i + 1]):
            text, i = args[i + 1], i + 2
        else:
            raise FlagError(spec.name, "needs a value", token=tok)
        if spec.kind == "list":  # append action: one item per occurrence
            item = spec._parse_item(text)
            before = values.get(spec.name)  # absent, or a tuple this branch wrote
            values[spec.name] = (*before, item) if isinstance(before, tuple) else (item,)
            continue
        try:
            typed = spec.parse(text)
        except FlagError as exc:
            raise FlagError(exc.flag, exc.reason, token=text, hint=exc.hint) from None
        if typed is None:
            values.pop(spec.name, None)
        else:
            values[spec.name] = typed
    return FlagSet(model or "", values, sch)


def parse_flag_args(argv: Iterable[str]) -> dict[str, bool | int | float | str]:
    """``["--max-num-seqs", "64", "--enable-chunked-prefill", "--no-x"]`` -> typed dict.

    Without a schema a value is typed by its look: int, float, else string.
    """
    items = list(argv)
    out: dict[str, bool | int | float | str] = {}
    i = 0
    while i < len(items):
        token = items[i]
        if not token.startswith("--"):
            raise FlagError("", "expected a --flag", token=token)
        name, eq, value = token[2:].partition("=")
        if eq:
            out[name] = _typed(value)
            i += 1
            continue
        if i + 1 < len(items) and not items[i + 1].startswith("--"):
            out[name] = _typed(items[i + 1])
            i += 2
            continue
        if name.startswith("no-"):
            out[name[3:]] = False
        else:
            out[name] = True
        i += 1
    return out


def parse_assignment(item: str, option: str, *, bare: bool = True) -> tuple[str, bool | int | float | str]:
    """``NAME=VALUE`` as given to ``option`` (``--flag``, ``--set``; with ``bare`` a lone ``NAME``
    is a switch turned on): the flag's name without dashes and its value, typed as
    :func:`parse_flag_args` types it. FlagError names the option and the item."""
    name, eq, text = item.partition("=")
    name = name.strip().lstrip("-")
    if not name or not (eq or bare):
        raise FlagError("", f"{option} {item!r}: expected FLAG=VALUE (e.g. {option} max-model-len=2048)", token=item)
    return name, parse_flag_args([f"--{name}={text}"] if eq else [f"--{name}"])[name]


def _typed(text: str) -> bool | int | float | str:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
