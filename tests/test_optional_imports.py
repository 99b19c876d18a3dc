"""Optional features are imported only when asked (the issue's "with --lora-r 0 no LoRA or PEFT module
imported"): a seeded tiny SFT step and RL step, as a user runs them (CPU, the tests' smallest shapes, the
RL step from tests/rl_checkpoint.py's model so that it updates), in one fresh process, leave none of
NOT_ON_THE_PATH in sys.modules; with --lora-r 4 the LoRA module and PEFT are imported and the step
trains adapters. (--report-to's trackers, extras/trackers.py: tests/test_cli.py, with stand-in modules.)
"""
import json
import subprocess

from test_train import ENV, PY, REPO, RL, SFT, rl_ckpt  # noqa: F401 (fixture)

# modules a default run (--lora-r 0, --report-to none, strict rules, UI-S1 data, CPU) must not import.
# Not "triton" itself: transformers' torch._dynamo may import it while building a model; the project's
# Triton kernels (kernels/*_triton) are what must stay unloaded on CPU.
NOT_ON_THE_PATH = ["peft", "lora", "extras.trackers", "extras.release", "extras.android_control", "extras.resume",
                   "extras.heldout",
                   "kernels.logprob_triton", "kernels.ppo_loss_triton", "kernels.group_norm_triton"]

# one process: the SFT step, then the RL step; prints the watched modules it imported and the last rows
SCRIPT = """
import json, sys
import train_semionline, train_sft
sft = train_sft.main({sft!r})
rl = train_semionline.main({rl!r}) if {rl!r} else None
watched = {watched!r}
seen = sorted(m for m in sys.modules if any(m == w or m.startswith(w + ".") for w in watched))
print("RESULT " + json.dumps({{"seen": seen, "sft": sft, "rl": rl}}))
"""


def run(sft_argv, rl_argv, watched=NOT_ON_THE_PATH):
    """Run the SFT step (and the RL step, if rl_argv) in a fresh interpreter; returns its RESULT dict."""
    code = SCRIPT.format(sft=sft_argv, rl=rl_argv, watched=watched)
    res = subprocess.run([PY, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_default_sft_and_rl_steps_import_no_optional_feature(tmp_path, rl_ckpt):  # noqa: F811
    sft = SFT[1:] + ["--max-steps", "1", "--out", str(tmp_path / "sft")]
    rl = RL[1:] + rl_ckpt + ["--max-steps", "1", "--out", str(tmp_path / "rl")]
    got = run(sft, rl)
    assert got["seen"] == [], got["seen"]
    assert got["sft"]["step"] == 1 and got["sft"]["loss"] > 0
    # the RL step did its work: tasks kept, tokens trained on, a finite loss
    assert got["rl"]["step"] == 1 and got["rl"]["train_tokens"] > 0 and got["rl"]["loss"] is not None
    assert (tmp_path / "rl" / "ckpt" / "latest").is_file() and not list((tmp_path / "rl").rglob("adapter_*"))


def test_lora_is_imported_when_asked(tmp_path, rl_ckpt):  # noqa: F811
    """--lora-r 4: lora and PEFT load (the trackers do not), the RL step trains the adapters (its
    checkpoint holds them, not the model's weights)."""
    sft = SFT[1:] + ["--max-steps", "1", "--out", str(tmp_path / "sft")]
    rl = RL[1:] + rl_ckpt + ["--max-steps", "1", "--lora-r", "4", "--lr", "2e-3", "--out", str(tmp_path / "rl")]
    got = run(sft, rl)
    assert got["seen"] == ["lora"] + [m for m in got["seen"] if m.startswith("peft")], got["seen"]
    assert "peft" in got["seen"]
    assert got["rl"]["train_tokens"] > 0 and got["rl"]["loss"] is not None
    ckpt = (tmp_path / "rl" / "ckpt" / (tmp_path / "rl" / "ckpt" / "latest").read_text().strip())
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()


def test_lora_flags_are_config_fields_shown_in_help_and_checked(capsys):
    """The LoRA flags and --report-to are fields of both stage configs (configs.common.StageConfig):
    listed in --help (LoRA under its own title), parsed into the typed config, and the rule between
    them (configs.common.check_lora_args) holds without importing lora."""
    import torch

    import train_semionline
    import train_sft
    import utils
    from configs.common import check_lora_args

    for stage in (train_semionline, train_sft):
        cfg, other = stage.parse([])
        assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_targets, cfg.merge, cfg.report_to) == (0, None, None, False, ("none",))
        assert not {"lora_r", "report_to"} & set(vars(other))           # typed fields, not the bag
        help_text = stage.parser.format_help()
        assert "LoRA (lora.py; --lora-r 0: full fine-tuning):\n  --lora-r" in help_text
        assert "--report-to TRACKER" in help_text
        assert check_lora_args(cfg) is None
        assert check_lora_args(stage.parse(["--merge"])[0]).startswith("--merge needs --lora-r")
        assert "expected comma-separated" in check_lora_args(stage.parse(["--lora-r", "2", "--lora-targets", "q;v"])[0])
        assert stage.parse(["--lora-r", "4", "--merge"])[0].lora_r == 4
        for bad in (["--lora-r", "-1"], ["--lora-dropout", "1"], ["--lora-alpha", "0"]):
            try:
                stage.parse(bad)
                raise AssertionError(bad)
            except SystemExit as e:
                assert e.code == 2 and bad[0] in capsys.readouterr().err
    # the optimizer takes the parameters with requires_grad only (the adapters under LoRA)
    frozen, trained = torch.nn.Linear(2, 2).requires_grad_(False), torch.nn.Linear(2, 3)
    opt = utils.adamw(list(frozen.parameters()) + list(trained.parameters()), lr=1e-3)
    assert opt.param_groups[0]["params"] == list(trained.parameters())
