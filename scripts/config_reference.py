"""Write the configuration reference, docs/reference/configuration.md, from the config dataclasses.

Every key of every command comes from the dataclasses that the commands register with Hydra
(`trajectory_transformer/cli/schemas.py` and the configs it composes): its type and default from
`dataclasses.fields`, its description from the attribute docstring that follows the field in
the class's source (read with `ast`), and its allowed range or choices from the class's own
checks, in their own words: each field is given values that a check may refuse, and the
`<key> must be ...` of the error is kept.

    python scripts/config_reference.py            # write the page
    python scripts/config_reference.py --check    # exit 1 if the page on disk differs

mkdocs runs it as a hook (`on_pre_build`, mkdocs.yml), so a built site always holds the page of
the code it was built from; tests/test_docs.py checks that the committed page is that one too.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib.resources
import inspect
import itertools
import math
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import yaml

from trajectory_transformer.cli import schemas

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "configuration.md"

# (command, its config file under configs/, its schema), in the order a user meets them.
COMMANDS = (
    ("tt-train", "train", schemas.TrainConfig),
    ("tt-eval", "eval", schemas.EvaluateConfig),
    ("tt-train-critic", "train_critic", schemas.TrainCriticConfig),
    ("tt-collect", "collect", schemas.CollectConfig),
    ("tt-compare", "compare", schemas.CompareConfig),
)


@dataclasses.dataclass
class Key:
    """One key as the command line spells it."""

    name: str  # dotted, e.g. trainer.batch_size
    type: str
    default: str
    allowed: str
    description: str
    value: object = None  # the default itself


@dataclasses.dataclass
class Group:
    """A dataclass reached from a command: a Hydra config group or a nested section."""

    title: str  # the dotted prefix, e.g. trainer, or compare.agents.<name>
    anchor: str
    schema: type
    source: type  # the class whose source documents the fields
    description: str
    presets: list[str]
    default_preset: str | None
    commands: list[str] = dataclasses.field(default_factory=list)
    keys: list[Key] = dataclasses.field(default_factory=list)


# --- reading the classes ------------------------------------------------------------------


@functools.cache
def _module_tree(module_name: str) -> ast.Module:
    return ast.parse(inspect.getsource(sys.modules[module_name]))


def _class_node(cls: type) -> ast.ClassDef | None:
    for node in ast.walk(_module_tree(cls.__module__)):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return node
    return None


def source_class(schema: type) -> type:
    """The class whose source documents `schema`'s fields: itself, or, for a schema that
    `schemas._schema` derived from a library config, that config (the class among those
    schemas.py imports whose fields include all of `schema`'s, with the fewest others)."""
    if _class_node(schema) is not None:
        return schema
    names = {f.name for f in dataclasses.fields(schema)}
    candidates = [
        value
        for value in vars(schemas).values()
        if isinstance(value, type)
        and dataclasses.is_dataclass(value)
        and value is not schema
        and _class_node(value) is not None
        and names <= {f.name for f in dataclasses.fields(value)}
    ]
    if not candidates:
        raise LookupError(f"no documented class holds the fields of {schema.__name__}")
    return min(candidates, key=lambda c: len(dataclasses.fields(c)))


def field_docstrings(cls: type) -> dict[str, str]:
    """Each field's attribute docstring: the string literal right after its annotation."""
    node = _class_node(cls)
    docs: dict[str, str] = {}
    if node is None:
        return docs
    body = node.body
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


def class_docstring(cls: type) -> str:
    node = _class_node(cls)
    doc = ast.get_docstring(node) if node is not None else None
    return inspect.cleandoc(doc) if doc else ""


def type_hints(cls: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))


def nested_dataclass(kind: typing.Any) -> type | None:
    """The dataclass a field holds, directly (a group) or as a dict's values (named entries)."""
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return kind
    if typing.get_origin(kind) is dict:
        value = typing.get_args(kind)[1]
        if isinstance(value, type) and dataclasses.is_dataclass(value):
            return value
    return None


def format_type(kind: typing.Any) -> str:
    if kind is type(None):
        return "null"
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return " | ".join(format_type(arg) for arg in typing.get_args(kind))
    origin = typing.get_origin(kind)
    if origin is not None:
        args = ", ".join("..." if a is Ellipsis else format_type(a) for a in typing.get_args(kind))
        return f"{origin.__name__}[{args}]"
    return getattr(kind, "__name__", str(kind))


def format_value(value: object) -> str:
    """A default as it would be written on the command line (YAML)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def default_of(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


# --- ranges and choices, from the classes' own checks -------------------------------------

_PROBES: dict[type, tuple[object, ...]] = {
    int: (-1, 0, 10**9),
    float: (-1.0, 0.0, 1.0, 2.0, 1e12, math.nan),
    str: ("\x00",),
    bool: (),
}
_SEQUENCE_PROBES: tuple[object, ...] = ((), (-1,), (2.0, 2.0), ("\x00",))


def _base_type(kind: typing.Any) -> typing.Any:
    """`int | None` -> int."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return args[0] if len(args) == 1 else kind
    return kind


def _example(cls: type, counter: Iterator[int]) -> object:
    """A valid instance of `cls`: its defaults, and a plain value for each field without one."""
    hints = type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if default_of(f) is not dataclasses.MISSING and default_of(f) != "???":
            continue
        kind = _base_type(hints[f.name])
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        if origin in (tuple, list) and args and dataclasses.is_dataclass(args[0]):
            values[f.name] = origin(_example(args[0], counter) for _ in range(2))
        elif kind is int:
            values[f.name] = 4
        elif kind is float:
            values[f.name] = 1.0
        else:
            values[f.name] = f"example{next(counter)}"
    return cls(**values)


def _refusals(instance: object, name: str, value: object) -> str | None:
    """What the class's checks say is allowed for `name`, when they refuse `value`."""
    try:
        changed = dataclasses.replace(instance, **{name: value})
        validate = getattr(changed, "validate", None)
        if callable(validate):
            validate()
    except ValueError as error:
        message = str(error).splitlines()[0] if str(error) else ""
        found = re.search(rf"(?:^|[\s.(]){re.escape(name)} must be (.+)[,;] got", message)
        if found:
            return found.group(1).strip()
    except Exception:  # a probe of the wrong type: not a statement of the range
        return None
    return None


def allowed_values(cls: type) -> dict[str, str]:
    """For each field that a check of `cls` bounds, the check's own words (`in [0, 1)`)."""
    instance = _example(cls, iter(range(1_000_000)))
    hints = type_hints(cls)
    allowed: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        kind = _base_type(hints[f.name])
        origin = typing.get_origin(kind)
        probes = _SEQUENCE_PROBES if origin in (tuple, list) else _PROBES.get(kind, ())
        said: list[str] = []
        for value in probes:
            text = _refusals(instance, f.name, value)
            if text is not None and text not in said:
                said.append(text)
        if len(said) > 1 and "a finite number" in said:  # NaN's refusal, beside the range
            said.remove("a finite number")
        if said:
            allowed[f.name] = "; ".join(said)
    return allowed


# --- the commands' groups and presets -----------------------------------------------------


def configs_dir() -> Path:
    return Path(str(importlib.resources.files("trajectory_transformer.configs")))


@functools.cache
def command_defaults(config_name: str) -> dict[str, str]:
    """The presets a command's config file picks: {group: preset}."""
    text = (configs_dir() / f"{config_name}.yaml").read_text()
    chosen: dict[str, str] = {}
    for entry in yaml.safe_load(text).get("defaults", []):
        if isinstance(entry, dict):
            for group, preset in entry.items():
                if "/" not in group and not group.startswith("override"):
                    chosen[group] = str(preset)
    return chosen


def presets(group: str) -> list[str]:
    folder = configs_dir() / group
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml"))


@functools.cache
def preset_values(group: str, preset: str) -> dict[str, object]:
    return yaml.safe_load((configs_dir() / group / f"{preset}.yaml").read_text()) or {}


def anchor_of(title: str, command: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", f"{command} {title}".lower()).strip("-")
    return slug


# --- collecting every key -----------------------------------------------------------------


def collect() -> tuple[dict[str, list[Key]], list[Group]]:
    """({command: its top-level keys}, the groups in the order first met)."""
    groups: dict[type, Group] = {}
    commands: dict[str, list[Key]] = {}
    for command, config_name, schema in COMMANDS:
        commands[command] = walk(command, config_name, schema, "", groups)
    return commands, list(groups.values())


def walk(
    command: str, config_name: str, schema: type, prefix: str, groups: dict[type, Group]
) -> list[Key]:
    """The keys of `schema` under `prefix`; nested dataclasses become groups (shared between
    commands that use the same class) and appear here as one key naming the group."""
    source = source_class(schema)
    docs = field_docstrings(source)
    hints = type_hints(schema)
    allowed = allowed_values(source)
    keys = []
    for f in dataclasses.fields(schema):
        name = f"{prefix}{f.name}"
        kind = hints[f.name]
        nested = nested_dataclass(kind)
        if nested is not None:
            title = name if typing.get_origin(kind) is not dict else f"{name}.<name>"
            group = groups.get(nested)
            if group is None:
                nested_source = source_class(nested)
                # a Hydra config group: the command's config file picks one of its presets
                chosen = command_defaults(config_name) if prefix == "" else {}
                group = Group(
                    title=title,
                    anchor=anchor_of(title, command),
                    schema=nested,
                    source=nested_source,
                    description=class_docstring(nested_source) or docs.get(f.name, ""),
                    presets=presets(f.name) if f.name in chosen else [],
                    default_preset=chosen.get(f.name),
                )
                groups[nested] = group
                group.keys = walk(command, config_name, nested, f"{title}.", groups)
            group.commands.append(command)
            preset_note = f"a preset of configs/{f.name}/" if group.presets else ""
            keys.append(
                Key(
                    name=title,
                    type=f"group: [{group.title}](#{group.anchor})",
                    default=group.default_preset or "",
                    allowed=preset_note,
                    description=docs.get(f.name) or group.description,
                )
            )
            continue
        default = default_of(f)
        if default is dataclasses.MISSING or default == "???":
            default_text = "required"
        else:
            default_text = f"`{format_value(default)}`"
        keys.append(
            Key(
                name=name,
                type=format_type(kind),
                default=default_text,
                allowed=allowed.get(f.name, ""),
                description=docs.get(f.name, ""),
                value=default,
            )
        )
    return keys


def same_value(preset: object, default: object) -> bool:
    """Whether a preset's value is the default (YAML reads `6e-4` as a string)."""
    if isinstance(preset, str) and isinstance(default, float):
        try:
            return float(preset) == default
        except ValueError:
            return False
    if isinstance(preset, list) and isinstance(default, tuple | list):
        return list(preset) == list(default)
    return preset == default


def global_presets(command: str) -> dict[str, dict]:
    """The presets of the global package (`# @package _global_`: `recipe=precise`) that a
    command's config file picks, in the order it applies them: {group=preset: their values}."""
    config_name = {name: config for name, config, _ in COMMANDS}[command]
    chosen = {}
    for group, preset in command_defaults(config_name).items():
        path = configs_dir() / group / f"{preset}.yaml"
        if path.is_file() and path.read_text().startswith("# @package _global_"):
            chosen[f"{group}={preset}"] = preset_values(group, preset)
    return chosen


def preset_notes(group: Group) -> dict[str, str]:
    """Where the command's default presets set a key to another value than the class: the
    group's own preset, or a global one that sets keys of several groups (the last wins)."""
    sources = {}
    if group.default_preset is not None:
        sources[f"{group.title}={group.default_preset}"] = preset_values(
            group.title, group.default_preset
        )
    for command in group.commands:
        for name, values in global_presets(command).items():
            if isinstance(values.get(group.title), dict):
                sources[name] = values[group.title]
    notes = {}
    for key in group.keys:
        short = key.name.removeprefix(f"{group.title}.")
        setting = [(name, values[short]) for name, values in sources.items() if short in values]
        if not setting:
            continue
        name, value = setting[-1]  # the value the command ends with
        text = format_value(value)
        if not same_value(value, key.value):
            if isinstance(value, str) and "${" in value:
                text = f"computed: {value}"
            notes[key.name] = f"`{text}` in `{name}`"
    return notes


# --- writing ------------------------------------------------------------------------------


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def key_table(keys: list[Key], notes: dict[str, str] | None = None) -> list[str]:
    notes = notes or {}
    lines = [
        "| key | type | default | allowed | description |",
        "|---|---|---|---|---|",
    ]
    for key in keys:
        default = key.default
        if key.name in notes:
            default = f"{default} ({notes[key.name]})"
        type_text = key.type if key.type.startswith("group:") else f"`{key.type}`"
        lines.append(
            f"| `{key.name}` | {cell(type_text)} | {cell(default)} | {cell(key.allowed)} "
            f"| {cell(key.description)} |"
        )
    return lines


HEADER = """\
# Configuration reference

<!-- Written by scripts/config_reference.py from the config dataclasses; do not edit by hand.
     `make docs` and every mkdocs build write it again. -->

Every key that the commands take, as it is written on the command line
(`tt-train trainer.batch_size=64`), generated from the dataclasses that define it:
`trajectory_transformer/cli/schemas.py` and the configs it composes (`GPTConfig` in
`model/gpt.py`, `TrainerConfig` in `training/trainer.py`, `PlannerConfig` in
`planning/config.py`, `CriticConfig` in `critic/training.py`, `AgentSpec` and `ComparisonSpec`
in `comparison/protocol.py`). **Default** is the class's default; where the preset that a
command picks by default sets another value, that value follows in brackets. **Allowed** is
what the code's own checks accept: a command refuses anything else with one line naming the
key (see [Troubleshooting](../troubleshooting.md)). A key of type `group` selects a preset
(`dataset=hopper-medium`, files under `configs/<group>/`) whose values its own keys then
override (`dataset.n_bins=64`). tt-train's `recipe` (`precise` by default, or `paper`:
`configs/recipe/`) sets keys of several groups at once: the model's inputs, its targets and
the learning rate.
"""


def render() -> str:
    commands, groups = collect()
    lines = [HEADER]
    lines.append("## Commands\n")
    for command, keys in commands.items():
        lines.append(f"### {command}\n")
        lines.extend(key_table(keys))
        lines.append("")
    lines.append("## Groups\n")
    for group in groups:
        used = ", ".join(group.commands)
        lines.append(f"### `{group.title}` {{ #{group.anchor} }}\n")
        intro = [f"Used by {used}."]
        if group.description:
            intro.insert(0, " ".join(group.description.split()))
        if group.presets:
            names = ", ".join(f"`{p}`" for p in group.presets)
            chosen = f" (default: `{group.default_preset}`)" if group.default_preset else ""
            intro.append(f"Presets{chosen}: {names}.")
        lines.append(textwrap.fill(" ".join(intro), width=100, break_on_hyphens=False))
        lines.append("")
        lines.extend(key_table(group.keys, preset_notes(group)))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def missing_descriptions() -> list[str]:
    """The keys, groups included, that have no description."""
    commands, groups = collect()
    missing = [k.name for keys in commands.values() for k in keys if not k.description.strip()]
    missing += [k.name for g in groups for k in g.keys if not k.description.strip()]
    return sorted(set(missing))


def write(page: Path = PAGE) -> bool:
    """Write the page if it differs; True when it changed."""
    text = render()
    if page.is_file() and page.read_text() == text:
        return False
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    return True


def on_pre_build(config: object, **kwargs: object) -> None:
    """mkdocs hook: the page of the code being built (written only when it changed, so that
    `mkdocs serve` does not rebuild for ever)."""
    write(Path(config["docs_dir"]) / "reference" / "configuration.md")  # type: ignore[index]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != render():
            print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/config_reference.py")
            return 1
        return 0
    changed = write()
    print(f"{PAGE.relative_to(ROOT)}: {'written' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
