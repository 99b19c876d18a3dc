"""The stages' typed configs and named presets (train_sft.SFTConfig, train_semionline.RLConfig):

- every flag is a typed field; --help lists the flags a user sets first (<= 25), the rest in groups;
- a preset is a dict of fields: quickstart is exactly the defaults, paper and release each pair the
  returns with the filter docs/method.md §6 defends, an explicit flag overrides a preset, args.json
  records the preset's name; a preset's values are what its flags would parse to;
- the docs quote the presets: docs/method.md's preset table equals the dicts, and no command in the
  docs, the README or a trainer's --help pairs --filter-std 0.3 with the paper's returns;
- --temperature and --max-new-tokens reach the trainer by one route (the sampler), --gamma by one.
The numbers of a seeded run are unchanged by the rework: tests/test_train.py::test_semionline_metrics_as_before.
"""
import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import train_semionline as ts
import train_sft

REPO = Path(__file__).resolve().parents[1]
STAGES = {"train_semionline.py": ts, "train_sft.py": train_sft}
# values standing in for the docs' machine paths ($AC/train.jsonl, /models/...): the flags check that they exist
PATHS = {"--data": "data/miniwob/train.jsonl", "--image-root": "data", "--model": "tiny", "--ref-model": "tiny",
         "--eval-data": "data/miniwob/test.jsonl"}


def flags_of(stage, argv):
    """Every flag's value, the config's and the other modules' (LoRA, prompt, --report-to), as one dict."""
    cfg, other = stage.parse(argv)
    return {**vars(cfg), **vars(other)}


def as_argv(fields: dict) -> list[str]:
    """A preset's fields as the command-line flags they stand for."""
    argv = []
    for k, v in fields.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return argv


@pytest.mark.parametrize("stage", [ts, train_sft])
def test_presets_are_dicts_of_flags(stage):
    assert set(stage.PRESETS) == {"quickstart", "paper", "release"}
    default = flags_of(stage, [])
    # quickstart: the README's main job, i.e. the defaults exactly
    assert flags_of(stage, ["--preset", "quickstart"]) == {**default, "preset": "quickstart"}
    for name, fields in stage.PRESETS.items():
        assert set(fields) <= set(default), f"{name}: {set(fields) - set(default)} are no flags"
        got = flags_of(stage, ["--preset", name])
        # a preset sets what its flags written out would set (types included), and nothing else
        assert got == {**flags_of(stage, as_argv(fields)), "preset": name}
        assert {k for k in got if got[k] != default[k]} <= set(fields) | {"preset"}
    # an explicit flag overrides the preset, before or after it on the command line
    for argv in (["--preset", "paper", "--lr", "3e-3"], ["--lr", "3e-3", "--preset", "paper"]):
        got = flags_of(stage, argv)
        assert got["lr"] == 3e-3 and got["preset"] == "paper"
    assert flags_of(stage, ["--preset", "paper", "--lr", "1e-6"])["lr"] == 1e-6


def test_rl_presets_pair_returns_and_filter_as_the_method_doc():
    """docs/method.md §6: tau = 0.3 is on the scale of the release's returns (6.1'); under the paper's
    (6.1) it drops exactly the groups split by the step-0 decision. paper: (6.1) with tau 0; release:
    (6.1') with 0.3; both at the paper's 8 x 8 rollouts, 512 tokens, lr 1e-6 (the README's GPU command)."""
    paper, release = (flags_of(ts, ["--preset", p]) for p in ("paper", "release"))
    assert (paper["returns_form"], paper["filter_std"]) == ("paper", 0.0)
    assert (release["returns_form"], release["filter_std"]) == ("release", 0.3)
    for got in (paper, release):
        assert (got["tasks_per_step"], got["n_rollouts"], got["max_new_tokens"], got["lr"]) == (8, 8, 512, 1e-6)
        assert (got["gamma"], got["patch_threshold"], got["kl_coef"], got["temperature"]) == (0.5, 2, 1e-4, 1.0)
    sft = flags_of(train_sft, ["--preset", "paper"])
    assert (sft["lr"], sft["batch_size"], sft["max_pixels"]) == (1e-5, 64, 1003520)


def test_args_json_records_the_preset():
    cfg, other = ts.parse(["--preset", "release", "--n-rollouts", "4"])
    other.prompt = {}  # set by chat.resolve_spec before args.json is written
    record = ts.run_record(cfg, other)
    assert record["preset"] == "release" and record["n_rollouts"] == 4 and record["filter_std"] == 0.3
    assert {"lora_r", "report_to", "max_pixels", "prompt", "temperature"} <= set(record)


@pytest.mark.parametrize("script", sorted(STAGES))
def test_help_lists_the_first_flags_then_labelled_groups(script):
    out = subprocess.run([sys.executable, script, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    first = text[text.index("\noptions:\n"):].split("\n\n")[0]
    n_first = len(re.findall(r"^  -", first, flags=re.M))
    assert 10 <= n_first <= 25, first
    assert "--preset" in first and "--data" in first and "--lr" in first
    for name in ("quickstart", "paper", "release"):
        assert f"{name}:" in text  # the presets are printed with their flags
    assert "--returns-form release" in " ".join(text.split()) or script == "train_sft.py"
    groups = re.findall(r"^(\S[^\n]*):\n  -", text, flags=re.M)
    assert len(groups) >= 4 and "options" in groups, groups


@pytest.mark.parametrize("stage", [ts, train_sft])
def test_every_config_field_is_a_typed_flag_with_help(stage):
    import dataclasses
    config = ts.RLConfig if stage is ts else train_sft.SFTConfig
    dests = {a.dest for a in stage.parser._actions}
    for f in dataclasses.fields(config):
        assert f.name in dests and f.metadata["help"], f.name
        assert f.type not in ("", None), f.name
    # the old flag names stay (tests and runs/ call them): --patch is the field patch_mode
    if stage is ts:
        assert ts.parse(["--patch", "on-policy"])[0].patch_mode == "on-policy"


def _reads(tree, attr: str) -> list[str]:
    """The functions of `tree` that read `cfg.<attr>` (or args.<attr>), by name."""
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) \
                        and node.value.id in ("cfg", "args"):
                    found.append(fn.name)
    return found


def test_temperature_max_new_tokens_and_gamma_reach_the_code_by_one_route():
    """The sampler is built from --temperature and --max-new-tokens (build_models); the trainer's
    log-probs, the loss and the overlong penalty read them from it, never from the flags again.
    check_args only validates (--overlong-buffer <= --max-new-tokens). --gamma: advantages only."""
    tree = ast.parse((REPO / "train_semionline.py").read_text())
    assert _reads(tree, "temperature") == ["build_models"]
    assert sorted(set(_reads(tree, "max_new_tokens"))) == ["build_models", "check_args"]
    assert _reads(tree, "gamma") == ["advantages"]
    cfg, _ = ts.parse(["--temperature", "0.3", "--max-new-tokens", "7"])
    got = ts.loss_config(cfg, SimpleNamespace(temperature=0.7, max_new_tokens=64))
    assert (got["temperature"], got["max_len"]) == (0.7, 64)  # the sampler's, whatever the config holds


# -----------------------------------------------------------------------------
# the docs quote the presets


def commands(text: str) -> list[tuple[str, list[str]]]:
    """(script, argv) of every train_sft.py / train_semionline.py command run by python or torchrun in
    `text` (lines joined at a trailing backslash, commands split at &&)."""
    text = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in text.splitlines():
        for part in line.split("&&"):
            m = re.search(r"(?:python\S*|torchrun)\s(?:.*\s)?(train_sft\.py|train_semionline\.py)(.*)", part)
            if m and not m.group(2).startswith(("`", ":", ")", "'", ",")):
                words = shlex.split(m.group(2).split("`")[0].split("#")[0])
                found.append((m.group(1), words))
    return found


def quoted(argv: list[str]) -> list[str]:
    """argv with the machine paths of the docs replaced by paths of this repository."""
    out = list(argv)
    for i, w in enumerate(out[:-1]):
        if w in PATHS:
            out[i + 1] = PATHS[w]
    return out


# every trainer command the docs and the README quote
DOCS = ["docs/method.md", "docs/android_control.md", "README.md"]


def doc_texts() -> dict[str, str]:
    texts = {d: (REPO / d).read_text(encoding="utf-8") for d in DOCS}
    texts.update({f"{s} --help": m.__doc__ for s, m in STAGES.items()})
    return texts


def test_docs_commands_parse_and_pair_the_filter_with_the_release_returns():
    """Every trainer command quoted in the docs and the trainers' --help parses; none runs the filter of
    the release (--filter-std 0.3) on the paper's returns (docs/method.md §6 argues against it)."""
    seen = 0
    for doc, text in doc_texts().items():
        for script, argv in commands(text):
            stage = STAGES[script]
            try:
                got = flags_of(stage, quoted(argv))
            except SystemExit:
                pytest.fail(f"{doc}: {script} {' '.join(argv)}: does not parse")
            seen += 1
            if script == "train_semionline.py" and got["filter_std"] > 0:
                assert got["returns_form"] == "release", f"{doc}: {script} {' '.join(argv)}"
    assert seen >= 6


def test_android_control_and_docstring_gpu_commands_use_presets():
    text = (REPO / "docs" / "android_control.md").read_text(encoding="utf-8")
    gpu = [(s, a) for s, a in commands(text) if "--preset" in a]
    assert {s for s, _ in gpu} == {"train_sft.py", "train_semionline.py"}
    assert any("--preset" in a for s, a in commands(ts.__doc__) if s == "train_semionline.py")


def test_method_doc_preset_table_is_the_presets():
    """docs/method.md's table after `<!-- presets -->`: one row per preset and stage, its flags as
    written, which must set exactly the preset's fields."""
    text = (REPO / "docs" / "method.md").read_text(encoding="utf-8")
    start = text.index("<!-- presets -->")
    rows = []
    for line in text[start:].splitlines()[3:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    table = {}
    for preset, script, flags, *_ in rows:
        table[(preset.strip("`"), script.strip("`"))] = shlex.split(flags.strip("`")) if flags != "(the defaults)" else []
    for script, stage in STAGES.items():
        for name, fields in stage.PRESETS.items():
            assert (name, script) in table, (name, script)
            argv = table[(name, script)]
            assert flags_of(stage, argv) == flags_of(stage, as_argv(fields)), (name, script, argv)
            assert len(argv) == 2 * len(fields), (name, script, argv)  # no flag more than the preset's


def test_stage_files_keep_lines_within_100_characters():
    for f in STAGES:
        long = [i + 1 for i, line in enumerate((REPO / f).read_text().splitlines()) if len(line) > 100]
        assert not long, f"{f}: lines over 100 characters: {long}"
