"""How a stage's typed config becomes its command line: `flag` declares a field, `config_parser`
builds the stage's parser from the fields and the presets, `parse_config` reads argv back into the
typed config."""
from __future__ import annotations

import argparse
import dataclasses

import cli

USAGE = "%(prog)s [-h] [--preset {quickstart,paper,release}] [--FLAG VALUE ...]"


def flag(default, help: str, group: str | None = None, **argparse_kw):
    """A field of a stage's typed config (a dataclass), made the flag --name-with-dashes by
    config_parser: its default, one line of help, its --help group (None: the first, the flags a user
    sets first) and add_argument's other keywords (flag="--name" where the name is not the field's)."""
    return dataclasses.field(default=default, metadata={"help": help, "group": group, **argparse_kw})


def config_parser(doc: str, config, groups: list[str], presets: dict[str, dict]) -> cli.Parser:
    """A stage's parser: the module docstring `doc` as description and examples, a flag per field of
    `config` in field order (the ungrouped first, then the titles of `groups` in order) and --preset's
    help listing each of `presets` as the flags it stands for."""
    parser = cli.make_parser(doc, usage=USAGE)
    made = {title: parser.add_argument_group(title) for title in groups}
    for f in dataclasses.fields(config):
        kw = dict(f.metadata)
        title, name = kw.pop("group"), kw.pop("flag", "--" + f.name.replace("_", "-"))
        (parser if title is None else made[title]).add_argument(name, dest=f.name, default=f.default, **kw)
    listed = "; ".join(f"{preset}: " + (" ".join(f"--{k.replace('_', '-')} {v}" for k, v in fields.items())
                                        or "the defaults") for preset, fields in presets.items())
    parser._option_string_actions["--preset"].help = f"named settings (a flag given overrides them): {listed}"
    return parser


def parse_config(parser: argparse.ArgumentParser, config, presets: dict[str, dict], argv=None):
    """argv -> (the typed config, a Namespace of the flags other modules define: chat's prompt
    contract). --preset NAME sets its fields unless a flag given on the command line does."""
    ns = parser.parse_args(argv)
    given = cli.explicit_flags(parser, argv) if ns.preset else set()
    for name, value in presets.get(ns.preset, {}).items():
        if name not in given:
            setattr(ns, name, value)
    own = {f.name for f in dataclasses.fields(config)}
    return (config(**{k: v for k, v in vars(ns).items() if k in own}),
            argparse.Namespace(**{k: v for k, v in vars(ns).items() if k not in own}))


class ReportTo(argparse.Action):
    """--report-to's action: checks the names and imports each tracker's package (extras/trackers.py)
    while parsing, so a missing package is the parser's one-line error. Stores a tuple of names."""

    def __call__(self, parser, namespace, values, option_string=None):
        from extras import trackers

        try:
            setattr(namespace, self.dest, trackers.check_names(values))
        except ValueError as e:
            parser.error(f"argument {option_string}: {e}")
