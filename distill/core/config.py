"""The one config system: every stage's options are a typed dataclass, read from YAML files and flags.

jsonargparse does the typing (``int | None``, ``Literal``, lists, nested dataclasses), ``--config`` files and
``--print_config``; this module adds what a user needs on top of it:

- every mistake is an :class:`~distill.core.schema.InputError` of one line that names the file (or the flag)
  and the key: an unknown or misspelt key (with the closest known one), a wrong type, a missing option;
- flags are written as the YAML keys (``--max_queries 3``); ``--max-queries`` is accepted too, and a list
  option takes ``--scores cis,upr``, ``--run a.trec b.trec`` or ``--scores '[cis, upr]'`` (and, where its field is
  marked :data:`REPEATABLE`, ``--model a --model b``); a bool flag alone (``--fp16``) means true.

Defaults live in the dataclasses and nowhere else. ``distill train`` is LightningCLI, which is jsonargparse too.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from distill.core.schema import InputError

C = TypeVar("C")


def read_yaml_file(path: str | Path) -> Any:
    """The value in the YAML file at ``path`` (None for an empty file).

    Raises:
        InputError: the file is missing, or cannot be parsed: one line, ``<path>:<line>:<column>: malformed YAML:
            <what is wrong>``.
    """
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not a YAML file") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        context = getattr(e, "context", None)
        detail = f"{problem} ({context})" if context else problem
        raise InputError(f"{where}: malformed YAML: {' '.join(detail.split())}") from None


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file at ``path`` (empty for an empty file).

    Raises:
        InputError: as :func:`read_yaml_file`, or the file is not a mapping.
    """
    loaded = read_yaml_file(path) or {}
    if not isinstance(loaded, dict):
        raise InputError(f"{path}: a config must be a mapping of option: value")
    return loaded


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _args(hint: Any) -> tuple[Any, ...]:
    return typing.get_args(hint)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _strip_optional(hint: Any) -> Any:
    if _is_union(hint):
        rest = [a for a in _args(hint) if a is not type(None)]
        return rest[0] if len(rest) == 1 else hint
    return hint


def _is_list(hint: Any) -> bool:
    return typing.get_origin(_strip_optional(hint)) in (list, Sequence)


def _is_bool(hint: Any) -> bool:
    return _strip_optional(hint) is bool


def _nested(hint: Any) -> type | None:
    """The dataclass of a nested section, if ``hint`` is one."""
    inner = _strip_optional(hint)
    return inner if dataclasses.is_dataclass(inner) else None


def _type_name(hint: Any) -> str:
    if hint is type(None):
        return "null"
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    if typing.get_origin(hint) is typing.Literal:
        return " | ".join(repr(a) for a in _args(hint))
    if _is_union(hint):
        return " | ".join(_type_name(a) for a in _args(hint))
    return str(hint).replace("typing.", "")


def check_keys(cls: type, mapping: dict[str, Any], where: str, prefix: str = "") -> None:
    """Every key of ``mapping`` (and of its nested sections) is a field of ``cls``.

    Raises:
        InputError: ``<where>: <prefix><key>: unknown option (did you mean ...?)``.
    """
    hints = _hints(cls)
    for key, value in mapping.items():
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(hints)}"
            raise InputError(f"{where}: {prefix}{key}: unknown option ({hint})")
        nested = _nested(hints[key])
        if nested is not None and isinstance(value, dict):
            check_keys(nested, value, where, f"{prefix}{key}.")


SPHINX_ROLE = re.compile(r":[a-z]+:`(?:([^`<]*?)\s*<[^`>]*>|~[\w.]*?([\w]+)|([^`]*))`")
"""A Sphinx cross-reference in a docstring: ``:class:`text <target>```, ``:func:`~a.b.c``` or ``:mod:`a.b```."""


def plain_text(text: str) -> str:
    """``text``, a docstring, without its Sphinx markup, as ``--help`` shows it: a cross-reference as its text (the
    last name of a ``~`` one), a literal without its double backquotes."""
    text = SPHINX_ROLE.sub(lambda m: next(g for g in m.groups() if g is not None), text)
    return text.replace("``", "")


def help_formatter() -> type:
    """jsonargparse's help formatter, each option's help, each description and each group's title in
    :func:`plain_text`: the ``formatter_class`` of every command's parser (LightningCLI's too). Made on the first
    call (jsonargparse is imported then) and kept as this module's ``PlainHelpFormatter``, where pickle finds it:
    ``--trainer.strategy ddp_spawn`` pickles the parser that holds it into each process."""
    made = globals().get("PlainHelpFormatter")
    if made is not None:
        return made
    from jsonargparse import DefaultHelpFormatter

    class PlainHelpFormatter(DefaultHelpFormatter):
        def _format_text(self, text: str) -> str:
            return super()._format_text(plain_text(text))

        def _expand_help(self, action: Any) -> str:
            return plain_text(super()._expand_help(action))

        def start_section(self, heading: str | None) -> None:  # an option group's title
            super().start_section(heading and plain_text(heading))

    PlainHelpFormatter.__qualname__ = PlainHelpFormatter.__name__
    globals()["PlainHelpFormatter"] = PlainHelpFormatter
    return PlainHelpFormatter


def __getattr__(name: str) -> Any:
    """``PlainHelpFormatter``, made on first use (:func:`help_formatter`): a process that unpickles a parser (a
    ``ddp_spawn`` worker) looks it up here before anything made it."""
    if name == "PlainHelpFormatter":
        return help_formatter()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _parser(cls: type, prog: str) -> Any:
    from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(
        prog=prog, description=cls.__doc__, exit_on_error=False, allow_abbrev=False, formatter_class=help_formatter()
    )
    if "config" not in _hints(cls):  # a config whose own option is named config (distill run) has no files
        parser.add_argument("--config", action=ActionConfigFile, help="a YAML file of options; flags override it")
    parser.add_class_arguments(_with_resolved_init(cls), as_group=False)
    return parser


def _with_resolved_init(cls: type) -> type:
    """``cls`` with the annotations of its dataclass ``__init__`` resolved to types.

    A config that inherits fields from a dataclass of another module (``TeachConfig`` from ``InputOptions``) gets an
    ``__init__`` whose postponed annotations name types imported only there. jsonargparse evaluates them in ``cls``'s
    module, and where one name fails it validates none of the options: ``--overwrite maybe`` would pass as true."""
    hints = _hints(cls)
    init = cls.__init__
    init.__annotations__ = {name: hints.get(name, hint) for name, hint in init.__annotations__.items()}
    return cls


def _field_of(cls: type, dotted: str) -> Any:
    """The type hint of a (dotted) key of ``cls``, or None."""
    hint: Any = cls
    for part in dotted.split("."):
        nested = _nested(hint) if hint is not cls else cls
        if nested is None or part not in _hints(nested):
            return None
        hint = _hints(nested)[part]
    return hint


def argument_error(
    error: Exception | str,
    where: str = "",
    origin: Callable[[str], tuple[str, Any]] | None = None,
    expected: Callable[[str], str | None] | None = None,
) -> InputError:
    """jsonargparse's (multi-line) error as one line naming where the key was set, the key, what it expects and the
    value given: the one translator of parse errors, for this module's configs and for ``distill train``'s
    LightningCLI.

    Args:
        error: the parser's error (or its text).
        where: the file or command the arguments came from ("" when the message needs no place).
        origin: ``origin(key)`` -> where a (dotted) key was set (a file, or its flag) and the value given there;
            None: ``where``, and the value the message quotes.
        expected: ``expected(key)`` -> the key's type as a reader writes it (``int | None``); None, or None for a
            key: the types the message lists.
    """
    text = str(error)

    def at(place: str) -> str:
        return f"{place}: " if place else ""

    if match := re.search(r'Parser key "([^"]+)"', text):
        key = match.group(1)
        if origin is not None:
            place, value = origin(key)
            given: str | None = repr(value)
        else:
            place, quoted = where, re.search(r"(?:Given value|Got value): (.*)", text)
            given = repr(quoted.group(1).strip()) if quoted else None
        if choices := re.search(r"(.*) not among choices \[(.*)\]", text):  # an argument's choices, in a file
            named = ", ".join(c.strip().strip("'") for c in choices.group(2).split(","))
            value = given or choices.group(1).split(":", 1)[-1].strip()
            return InputError(f"{at(place)}{key}: {value} is not one of {named}")
        listed = re.search(r"Subtypes: \[(.*)\]", text) or re.search(r"Expected an? (.*?)\.? Got", text)
        what = (expected and expected(key)) or (_type_names(listed.group(1)) if listed else "another type")
        named = place if place == f"--{key}" else f"{at(place)}{key}"
        return InputError(f"{named}: expected {what}" + (f", got {given}" if given else ""))
    if match := re.search(r"arguments are required: (.+)", text):
        keys = ", ".join(k.strip().lstrip("-") for k in match.group(1).split(","))
        return InputError(f"{at(where)}missing required option(s): {keys}")
    if match := re.search(r"Option '([^']+)' is not accepted", text):
        return InputError(f"{at(where)}{match.group(1)}: unknown option")
    if match := re.search(r"Group '([^']+)' does not accept option '([^']+)'", text):
        return InputError(f"{at(where)}{match.group(1)}.{match.group(2)}: unknown option")
    return InputError(f"{at(where)}{' '.join(text.split())}")


def _type_names(text: str) -> str:
    """``<class 'int'>, <class 'NoneType'>`` -> ``int | None``."""
    names = re.findall(r"<class '([^']+)'>|(typing\.Literal\[[^\]]*\])", text)
    parts = [cls.rsplit(".", 1)[-1] or literal.removeprefix("typing.") for cls, literal in names]
    return " | ".join("None" if p == "NoneType" else p for p in parts) or text


def _expected_of(cls: type) -> Callable[[str], str | None]:
    """A key's type name in ``cls`` (None for a key it does not have)."""

    def expected(key: str) -> str | None:
        hint = _field_of(cls, key)
        return _type_name(hint) if hint is not None else None

    return expected


def _lookup(mapping: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    value: Any = mapping
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _instantiate(cls: type[C], values: dict[str, Any]) -> C:
    hints = _hints(cls)
    kwargs = {}
    for key, value in values.items():
        nested = _nested(hints[key])
        kwargs[key] = _instantiate(nested, value) if nested is not None and isinstance(value, dict) else value
    return cls(**kwargs)


def _listify(cls: type, mapping: dict[str, Any]) -> dict[str, Any]:
    """``mapping`` with a lone value given for a list option made a one-item list (``input: a.json``)."""
    hints = _hints(cls)
    out = {}
    for key, value in mapping.items():
        hint = hints.get(key)
        nested = _nested(hint) if hint is not None else None
        if nested is not None and isinstance(value, dict):
            value = _listify(nested, value)
        elif hint is not None and _is_list(hint) and isinstance(value, str | int | float):
            value = [value]
        out[key] = value
    return out


def _validated(cls: type, mapping: dict[str, Any], where: str) -> dict[str, Any]:
    """``mapping`` checked against ``cls``: known keys, right types (lone values of list options listified)."""
    if not isinstance(mapping, dict):
        raise InputError(f"{where}: expected a mapping of option: value, got {mapping!r}")
    check_keys(cls, mapping, where)
    mapping = _listify(cls, mapping)
    try:
        _parser(cls, where).parse_object(mapping)
    except Exception as e:  # jsonargparse raises ArgumentError (and, for nested types, ValueError)
        raise argument_error(e, where, lambda key: (where, _lookup(mapping, key)[1]), _expected_of(cls)) from None
    return mapping


def load_section(cls: type[C], mapping: dict[str, Any] | None, where: str) -> C:
    """``cls`` from a mapping (a pipeline section, say): unknown keys, wrong types and the values ``cls`` refuses
    name ``where`` and the key; an absent section (None) takes every default."""
    mapping = _validated(cls, mapping or {}, where)
    try:
        return _instantiate(cls, _fields_only(cls, {**_defaults(cls), **mapping}))
    except InputError as e:  # "teach: input is required ..." -> "pipeline.yaml: teach: input is required ..."
        section = where.rsplit(": ", 1)[-1] + ": "
        raise type(e)(f"{where}: {str(e).removeprefix(section)}") from None


def _defaults(cls: type) -> dict[str, Any]:
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }


def _fields_only(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The parsed values of ``cls``'s fields (without ``config`` files and jsonargparse's ``__path__``)."""
    hints = _hints(cls)
    return {key: value for key, value in values.items() if key in hints}


REPEATABLE = "repeatable"
"""A list field's metadata key: its flag given again adds to its items (``--model a --model b``). Any other list
flag given again is refused (whether it should add or replace is anyone's guess), and a scalar flag given again
replaces its value."""


def _repeatable(cls: type, name: str) -> bool:
    """Whether ``cls``'s field ``name`` (not dotted) is marked :data:`REPEATABLE`."""
    found = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    return name in found and bool(found[name].metadata.get(REPEATABLE))


def normalize_flags(cls: type, argv: Sequence[str]) -> list[str]:
    """Flags as jsonargparse takes them: ``--a-b`` -> ``--a_b``; a list option's values (``--x a,b`` or ``--x a b``,
    and ``--x a --x b`` where it is :data:`REPEATABLE`) -> one list; a bool flag with no value -> ``true``.

    Raises:
        InputError: a list flag that is not :data:`REPEATABLE` given twice; a ``config`` option of ``cls`` itself
            given twice (the files of ``--config`` compose, but not where ``cls`` takes the option).
    """
    out: list[str] = []
    lists: dict[str, int] = {}  # a list option's index in out, for its items given again
    given: set[str] = set()
    i = 0
    argv = list(argv)
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--") or arg == "--print_config" or arg.startswith("--print_config="):
            out.append(arg)
            continue
        name, eq, inline = arg[2:].partition("=")
        name = name.replace("-", "_")
        hint = _field_of(cls, name)
        if hint is None:
            out.append(f"--{name}{eq}{inline}")
            continue
        values = [inline] if eq else []
        if not eq:
            while i < len(argv) and not argv[i].startswith("--") and (_is_list(hint) or not values):
                values.append(argv[i])
                i += 1
        if _is_bool(hint) and not values:
            values = ["true"]
        if _is_list(hint) and name in given and not _repeatable(cls, name):
            raise InputError(f"--{name} given twice: give all its items once (--{name} a b, or a,b)")
        if name == "config" and name in given:  # an option of the config itself (distill run's pipeline YAML)
            raise InputError("--config given twice: it names one file here, not YAML files to compose")
        given.add(name)
        if _is_list(hint) and values and not (len(values) == 1 and values[0].lstrip().startswith("[")):
            items = [item.strip() for value in values for item in value.split(",") if item.strip()]
            if name in lists:  # a repeatable option given again: its items accumulate
                out[lists[name]] = json.dumps([*json.loads(out[lists[name]]), *items])
                continue
            values = [json.dumps(items)]
            if _repeatable(cls, name):
                lists[name] = len(out) + 1
        out += [f"--{name}", *values]
    return out


def parse_config(cls: type[C], argv: Sequence[str], prog: str) -> C:
    """``cls`` from ``--config`` files (applied in order) and flags (applied last).

    ``--help`` and ``--print_config`` print and raise ``SystemExit(0)``.

    Raises:
        InputError: one line naming the file or the flag, and the key.
    """
    argv = normalize_flags(cls, argv)
    flags: list[str] = []
    values: dict[str, Any] = {}
    takes_files = "config" not in _hints(cls)
    i = 0
    while i < len(argv):
        if takes_files and argv[i] == "--config" and i + 1 < len(argv):
            values.update(_validated(cls, read_yaml_mapping(argv[i + 1]), argv[i + 1]))
            i += 2
        else:
            flags.append(argv[i])
            i += 1
    parser = _parser(cls, prog)
    parser.set_defaults(values)
    try:
        namespace = parser.parse_args(flags)
    except Exception as e:  # jsonargparse raises ArgumentError

        def origin(key: str) -> tuple[str, Any]:
            flag = f"--{key}"
            if key and flag in flags[:-1]:
                return flag, flags[flags.index(flag) + 1]
            return prog, None

        raise argument_error(e, prog, origin, _expected_of(cls)) from None
    return _instantiate(cls, _fields_only(cls, namespace.as_dict()))


def options_of(cls: type[C], config: object) -> C:
    """The options class ``cls`` (a dataclass) built from ``config``'s fields of the same names: the options alone,
    out of a config that extends them with fields of its own."""
    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})
