"""How a stage's typed config becomes its command line: `flag` declares a field (default, one line of
help, its --help group, argparse's keywords), `config_parser` builds the stage's parser from the
config's fields and its presets, `parse_config` reads argv back into the typed config. The flags'
types (cli.positive_int, cli.finite_float, ...) are the ones every script shares."""
from __future__ import annotations

import argparse
import dataclasses

import cli

USAGE = "%(prog)s [-h] [--preset {quickstart,paper,release}] [--FLAG VALUE ...]"


def flag(default, help: str, group: str | None = None, **argparse_kw):
    """A field of a stage's typed config (a dataclass) that `add_config_flags` turns into its flag
    --name-with-dashes: the default, one line of help, the labelled --help group it is listed in (None:
    the first, the flags a user sets first) and add_argument's other keywords (type, choices, action;
    flag="--name" where the flag's name is not the field's)."""
    return dataclasses.field(default=default, metadata={"help": help, "group": group, **argparse_kw})


def add_config_flags(parser: argparse.ArgumentParser, config, groups: list[str]) -> dict:
    """One flag per field of the dataclass `config` (fields made by `flag`), in field order; a field
    with a group goes under that title. The titles of `groups` are created in that order, after the
    first group (argparse lists groups as created). Returns {title: the argparse group}."""
    made = {title: parser.add_argument_group(title) for title in groups}
    for f in dataclasses.fields(config):
        kw = dict(f.metadata)
        title, name = kw.pop("group"), kw.pop("flag", "--" + f.name.replace("_", "-"))
        (parser if title is None else made[title]).add_argument(name, dest=f.name, default=f.default, **kw)
    return made


def preset_help(presets: dict[str, dict]) -> str:
    """--preset's help: each preset's name and its fields as the flags they stand for."""
    return "; ".join(f"{name}: " + (" ".join(f"--{k.replace('_', '-')} {v}" for k, v in fields.items())
                                    or "the defaults") for name, fields in presets.items())


def config_parser(doc: str, config, groups: list[str], presets: dict[str, dict]) -> cli.Parser:
    """A stage's parser: the module docstring `doc` as description and examples, one flag per field of
    `config` (the ungrouped ones first, then `groups` in order) and --preset's help listing `presets`."""
    parser = cli.make_parser(doc, usage=USAGE)
    add_config_flags(parser, config, groups)
    parser._option_string_actions["--preset"].help = ("named settings (a flag given overrides them): "
                                                      + preset_help(presets))
    return parser


def parse_config(parser: argparse.ArgumentParser, config, presets: dict[str, dict], argv=None):
    """Parse argv into (the typed config, a Namespace of the flags other modules define: the prompt
    contract's, chat.add_prompt_args). --preset NAME first sets its fields (any flag's dest); a flag
    given on the command line overrides it. Errors as the parser's: one line, exit 2."""
    ns = parser.parse_args(argv)
    given = cli.explicit_flags(parser, argv) if ns.preset else set()
    for name, value in presets.get(ns.preset, {}).items():
        if name not in given:
            setattr(ns, name, value)
    own = {f.name for f in dataclasses.fields(config)}
    return (config(**{k: v for k, v in vars(ns).items() if k in own}),
            argparse.Namespace(**{k: v for k, v in vars(ns).items() if k not in own}))


class ReportTo(argparse.Action):
    """--report-to's action (nargs="+"): the names checked and each tracker's package imported while the
    flags are parsed (extras/trackers.py, loaded only when the flag is given), so a missing package is
    the parser's one-line error (exit 2) before any work starts. Stores a tuple of names."""

    def __call__(self, parser, namespace, values, option_string=None):
        from extras import trackers

        try:
            setattr(namespace, self.dest, trackers.check_names(values))
        except ValueError as e:
            parser.error(f"argument {option_string}: {e}")
