"""What the two stages' configs share: --help group titles, the fields both trainers take
(`StageConfig`: --preset, LoRA's, --report-to), the LoRA flags' rule and the metrics logger."""
from __future__ import annotations

import re
from dataclasses import dataclass

import cli
import utils
from configs.flags import ReportTo, flag

RUN = "run: checkpoints, logs"
PERF = "performance (not the method: same results, different speed/memory)"
LORA = "LoRA (lora.py; --lora-r 0: full fine-tuning)"
PRESET_NAMES = ["quickstart", "paper", "release"]  # each stage's PRESETS: plain dicts of fields


@dataclass
class StageConfig:
    """The fields of both trainers (a stage's config adds its own after them)."""
    preset: str | None = flag(None, "PRESETS' name: sets its fields; a flag given overrides it",
                              choices=PRESET_NAMES)
    lora_r: int = flag(0, "LoRA rank (PEFT); 0: full fine-tuning", LORA, type=cli.non_negative_int)
    lora_alpha: float | None = flag(None, "scale numerator (default: 2 x --lora-r)", LORA,
                                    type=cli.positive_float)
    lora_dropout: float = flag(0.0, "dropout on the adapters' input (0: none)", LORA,
                               type=cli.finite_float(0.0, 1.0, high_open=True))
    lora_targets: str | None = flag(None, "comma list of the decoder layers' linear layers adapted (default: "
                                    "lora.DECODER_TARGETS)", LORA)
    lora_vision: bool = flag(False, "also adapt the vision blocks' linear layers", LORA, action="store_true")
    merge: bool = flag(False, "with --lora-r: also write OUT/merged, a plain Hugging Face folder", LORA,
                       action="store_true")
    report_to: tuple = flag(("none",), "also log the metrics to tensorboard, wandb and/or trackio "
                            "(extras/trackers.py; each needs its package)",
                            RUN, nargs="+", action=ReportTo, metavar="TRACKER")


def check_lora_args(cfg) -> str | None:
    """The message of a LoRA flag that parses but cannot run (--lora-targets no comma list of names,
    --merge without --lora-r), else None; the trainers raise it as utils.UsageError."""
    if cfg.lora_targets is not None and (not [t for t in cfg.lora_targets.split(",") if t.strip()]
                                         or not re.fullmatch(r"[\w,\s]+", cfg.lora_targets)):
        return f"--lora-targets {cfg.lora_targets!r}: expected comma-separated module names, e.g. q_proj,v_proj"
    if cfg.merge and cfg.lora_r == 0:
        return "--merge needs --lora-r (without LoRA the checkpoint already is a plain Hugging Face folder)"
    return None


def metrics_logger(path, report_to=("none",), config: dict | None = None, resume_step: int | None = None):
    """utils.MetricsLogger (metrics.jsonl); with --report-to naming trackers or a --resume,
    extras.trackers.TrackedLogger (imported only then). config: the run's args, for the trackers.
    resume_step: a --resume from the checkpoint of that step (0: none found), whose rows are kept."""
    if resume_step is None and all(name == "none" for name in report_to):
        return utils.MetricsLogger(path)
    from extras.trackers import TrackedLogger  # it keeps a resume's rows (trim_metrics)
    return TrackedLogger(path, report_to=report_to, config=config, resume_step=resume_step)
