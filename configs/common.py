"""What the two stages' configs share: the --help group titles, the fields both trainers take (--preset,
LoRA's, --report-to: `StageConfig`, the base of RLConfig and SFTConfig) and the LoRA flags' rule.
LoRA itself (PEFT, the adapters, their checkpoints) is lora.py, imported only with --lora-r > 0
or a LoRA checkpoint; --lora-r 0, the default, is full fine-tuning."""
from __future__ import annotations

import re
from dataclasses import dataclass

import cli
import utils
from configs.flags import ReportTo, flag

# --help's group titles both stages use (each stage adds its own: data, rollout, optimisation, ...)
RUN = "run: checkpoints, logs"
PERF = "performance (not the method: same results, different speed/memory)"
LORA = "LoRA (lora.py; --lora-r 0: full fine-tuning)"
PRESET_NAMES = ["quickstart", "paper", "release"]  # each stage's PRESETS: plain dicts of fields


@dataclass
class StageConfig:
    """The fields of both trainers: --preset (the first flag of --help), LoRA's (their group) and
    --report-to (the run group). A stage's config adds its own after them."""
    preset: str | None = flag(None, "PRESETS' name: sets its fields; a flag given overrides it",
                              choices=PRESET_NAMES)
    lora_r: int = flag(0, "LoRA rank (PEFT); 0: full fine-tuning", LORA, type=cli.non_negative_int)
    lora_alpha: float | None = flag(None, "LoRA scale numerator (default: 2 x --lora-r)", LORA,
                                    type=cli.positive_float)
    lora_dropout: float = flag(0.0, "dropout on the adapters' input (0: none, PEFT's default)", LORA,
                               type=cli.finite_float(0.0, 1.0, high_open=True))
    lora_targets: str | None = flag(None, "comma-separated linear-layer names adapted in every "
                                    "decoder layer (default: all seven, lora.DECODER_TARGETS)", LORA)
    lora_vision: bool = flag(False, "also adapt the vision blocks' linear layers (qkv, proj, MLP); "
                             "frozen otherwise", LORA, action="store_true")
    merge: bool = flag(False, "with --lora-r: at the end also write OUT/merged, the adapted model as a "
                       "plain Hugging Face folder", LORA, action="store_true")
    report_to: tuple = flag(("none",), "also log the metrics to: none, or one or more of tensorboard "
                            "(OUT/tensorboard), wandb, trackio (project: $WANDB_PROJECT / "
                            "$TRACKIO_PROJECT, else ui-s1; run: the --out folder's name), as "
                            "transformers' report_to names them; each needs its package installed",
                            RUN, nargs="+", action=ReportTo, metavar="TRACKER")


def check_lora_args(cfg) -> str | None:
    """The message of a LoRA flag that parses but cannot run, else None (the trainers raise it as
    utils.UsageError): a --lora-targets that is no comma list of names, --merge without --lora-r."""
    if cfg.lora_targets is not None and (not [t for t in cfg.lora_targets.split(",") if t.strip()]
                                         or not re.fullmatch(r"[\w,\s]+", cfg.lora_targets)):
        return f"--lora-targets {cfg.lora_targets!r}: expected comma-separated module names, e.g. q_proj,v_proj"
    if cfg.merge and cfg.lora_r == 0:
        return "--merge needs --lora-r (without LoRA the checkpoint already is a plain Hugging Face folder)"
    return None


def metrics_logger(path, report_to=("none",), config: dict | None = None, resume_step: int | None = None):
    """The trainers' metrics logger: utils.MetricsLogger (metrics.jsonl), or with --report-to naming
    trackers extras.trackers.TrackedLogger (the file, and the trackers; imported only then). config:
    the run's args, for the trackers; resume_step: as utils.MetricsLogger's."""
    if all(name == "none" for name in report_to):
        return utils.MetricsLogger(path, resume_step=resume_step)
    from extras.trackers import TrackedLogger
    return TrackedLogger(path, report_to=report_to, config=config, resume_step=resume_step)
