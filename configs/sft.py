"""train_sft.py's flags as one typed config (SFTConfig: a field per flag with its type, default,
help and --help group) and its named presets (PRESETS). The stage generates its parser from them
(configs.flags.config_parser) and reads the parsed SFTConfig; the prompt contract's flags stay
with chat.py."""
from __future__ import annotations

from dataclasses import dataclass

import cli
import gui
import vlm
from configs.common import LORA, PERF, RUN, StageConfig
from configs.flags import flag

pos_int, nonneg_int, nonneg_float = cli.positive_int, cli.non_negative_int, \
    cli.non_negative_float
DATA, OPT = "data", "optimisation"
WARM = "copy warm-up (models trained from scratch; the module docstring)"
GROUPS = [DATA, OPT, WARM, RUN, LORA, PERF]


@dataclass
class SFTConfig(StageConfig):
    """Every flag of this script but the prompt contract's (chat.add_prompt_args): its type, default
    and help; --preset, LoRA's and --report-to come from StageConfig. The fields without a group are
    the ones a user sets first (--help lists them first)."""
    data: str = flag("data/miniwob_click/train.jsonl", "expert episodes (UI-S1 JSONL or "
                     "AndroidControl native JSON)", type=cli.arg_type(cli.input_file))
    image_root: str | None = flag(None, "folder screenshots are resolved against (default: the "
                                  "data file's folder)", type=cli.arg_type(cli.input_dir))
    model: str = flag("tiny:128x4", "'tiny', a local Hugging Face folder, or a checkpoint folder "
                      "(a `latest` pointer is followed)", type=cli.arg_type(vlm.model_path))
    lr: float = flag(1e-3, "AdamW peak learning rate (the default suits the tiny model; the paper "
                     "preset's, 7B: 1e-5)", type=cli.positive_float)
    batch_size: int = flag(8, "examples per optimizer step, all ranks together", type=pos_int)
    micro_batch_size: int = flag(8, "examples per forward/backward", type=pos_int)
    max_steps: int = flag(200, "optimizer steps (0: the copy warm-up alone, saved as step 0: a "
                          "shared base)", type=nonneg_int)
    copy_warmup_steps: int | None = flag(None, "steps on synthetic pages before SFT (module "
                                         "docstring; 0: none; default: 1000 for a 'tiny' model "
                                         "trained from scratch, else 0)", type=nonneg_int)
    out: str = flag("out/sft", "output folder (ckpt/, metrics.jsonl, args.json)")
    resume: bool = flag(False, "continue from the latest checkpoint in --out/ckpt",
                        action="store_true")
    seed: int = flag(0, "seed of data order, split and the tiny model's init", type=nonneg_int)
    device: str = flag("auto", "where to run", choices=["auto", "cpu", "cuda"])
    # data
    blank_screens: str | None = flag(None, "WxH: blank screenshots of this size when files are "
                                     "missing", DATA, type=cli.arg_type(gui.parse_size))
    max_episodes: int | None = flag(None, "use only the first N episodes", DATA, type=pos_int)
    val_frac: float = flag(0.1, "share of episodes held out for validation loss (0: none)",
                           DATA, type=cli.finite_float(0.0, 1.0, high_open=True))
    # optimisation
    min_lr_frac: float = flag(0.1, "cosine decay floor, as a fraction of --lr (0: decay to 0)",
                              OPT, type=cli.fraction)
    warmup_steps: int = flag(20, "linear warm-up steps (0: none)", OPT, type=nonneg_int)
    weight_decay: float = flag(0.01, "AdamW weight decay (0: none)", OPT, type=nonneg_float)
    grad_clip: float = flag(1.0, "global grad-norm clip", OPT, type=cli.positive_float)
    # the copy warm-up
    copy_warmup_lr: float = flag(1e-3, "constant AdamW learning rate of the copy warm-up",
                                 WARM, type=cli.positive_float)
    copy_warmup_elements: int = flag(1, "elements per synthetic click page, at most (the target "
                                     "looked up among them)", WARM, type=pos_int)
    copy_warmup_type_frac: float = flag(0.25, "share of synthetic pages that ask to type a quoted "
                                        "text (0: click pages only)", WARM, type=cli.fraction)
    copy_warmup_code_frac: float = flag(0.0, "share of synthetic pages whose labels are fresh "
                                        "random codes (3-8 of A-Z, 0-9) instead of the training "
                                        "data's labels, so the copy learnt holds for strings never "
                                        "seen (0: training labels only)", WARM, type=cli.fraction)
    copy_warmup_save_at: tuple = flag((), "warm-up steps after which the warm-up's model is also "
                                      "saved, as OUT/warmup_ckpt/step_N: the base of an N-step warm-up "
                                      "(its learning rate is constant and its pages drawn step by step)",
                                      WARM, type=cli.positive_int, nargs="*")
    # run
    eval_every: int = flag(50, "validation loss every N steps (0: at the end only)",
                           RUN, type=nonneg_int)
    save_every: int = flag(0, "checkpoint every N steps (0: at the end only)", RUN, type=nonneg_int)
    keep_checkpoints: int = flag(2, "keep the newest N checkpoints (0: every one, e.g. for a "
                                 "dose-response over the steps)", RUN, type=nonneg_int)
    # performance
    gradient_checkpointing: bool = flag(False, "recompute each decoder layer's and vision block's "
                                        "activations in the backward (less memory, ~1/3 more "
                                        "compute)", PERF, action="store_true")


# Named settings (configs.common.PRESET_NAMES; plain dicts of fields, any flag's dest, recorded in
# args.json as "preset"; a flag given on the command line overrides them). SFT has no returns or filter, so the paper's
# and the release's SFT are one setting: the 7B run of the README (lr 1e-5, 64 examples per step)
# and the prompt contract the RL stage adopts from its checkpoint (--max-pixels 1003520:
# docs/method.md §3 the contract, §6 the presets).
PAPER = dict(lr=1e-5, batch_size=64, max_pixels=1003520)
PRESETS = {"quickstart": {},  # the README's quick start: the defaults, sized for the tiny CPU model
           "paper": PAPER, "release": PAPER}
