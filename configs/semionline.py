"""train_semionline.py's flags as one typed config (RLConfig: a field per flag with its type,
default, one line of help and its --help group) and its named presets (PRESETS). The prompt
contract's flags stay with chat.py."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import cli
import gui
import reward
import vlm
from advantage import EPISODE_FORMS, NORMS, RETURNS_FORMS
from configs.common import LORA, PERF, RUN, StageConfig
from configs.flags import flag
from kernels import LOSS_AGGS
from patch import PATCH_MODES
from rollout import HISTORY_MODES
from sampler import DECODE_MODES

# the flags' types (cli.py), named once
pos_int, nonneg_int, int_from = cli.positive_int, cli.non_negative_int, cli.int_at_least
pos_float, nonneg_float, fraction = cli.positive_float, cli.non_negative_float, cli.fraction
any_float, open_fraction = cli.finite_float(), cli.finite_float(0.0, 1.0, low_open=True)
in_file, in_dir = cli.arg_type(cli.input_file), cli.arg_type(cli.input_dir)
model_path, size = cli.arg_type(vlm.model_path), cli.arg_type(gui.parse_size)
DATA, ROLL = "data and models", "rollout (docs/method.md §5)"
ADV = "returns and advantages (docs/method.md §6)"
LOSS = "loss and optimisation (docs/method.md §7)"
HELDOUT = "held-out evaluation (extras/heldout.py)"
GROUPS = [DATA, ROLL, ADV, LOSS, RUN, HELDOUT, LORA, PERF]


@dataclass
class RLConfig(StageConfig):
    """Every flag of this script but the prompt contract's (chat.add_prompt_args). The fields
    without a group are the ones a user sets first (--help lists them first)."""
    data: str = flag("data/miniwob_click/train.jsonl", "episodes (UI-S1 JSONL or AndroidControl "
                     "native JSON)", type=in_file)
    image_root: str | None = flag(None, "screenshots' folder (default: the data's)", type=in_dir)
    model: str = flag("auto", "'tiny', a folder, or 'auto': the latest --sft-dir checkpoint, whose "
                      "args.json gives the prompt options not given", type=model_path)
    tasks_per_step: int = flag(4, "tasks per step, all ranks together (release: 8)", type=pos_int)
    n_rollouts: int = flag(4, "rollouts per task N (release: 8)", type=pos_int)
    max_new_tokens: int = flag(48, "response length limit (release: 512)", type=pos_int)
    temperature: float = flag(1.0, "sampling temperature (release: 1.0)", type=cli.temperature)
    history: str = flag("own", "own: semi-online RL; expert: offline RL", choices=HISTORY_MODES)
    patch_threshold: int = flag(2, "patches per rollout (0: none; -1: no limit)", type=int_from(-1))
    gamma: float = flag(0.5, "discount of step returns (0: each step's own reward)", type=fraction)
    returns_form: str = flag("paper", "release: reset the return chain at a wrong step (eq. 6.1')",
                             choices=RETURNS_FORMS)
    filter_std: float = flag(0.0, "dynamic sampling: drop tasks whose step-0 return std <= this "
                             "(<0 disables; 0 keeps those whose rollouts differ; 0.3 goes with "
                             "--returns-form release)", type=any_float)
    kl_coef: float = flag(1e-4, "k3 KL to the reference (0 disables it)", type=nonneg_float)
    lr: float = flag(2e-5, "AdamW learning rate, constant (7B: 1e-6)", type=pos_float)
    micro_batch_size: int = flag(8, "sequences per forward/backward", type=pos_int)
    max_steps: int = flag(12, "training steps", type=pos_int)
    out: str = flag("out/semionline", "output folder (checkpoints, metrics.jsonl, args.json)")
    resume: bool = flag(False, "continue from the latest checkpoint in --out", action="store_true")
    seed: int = flag(0, "seed of task order, sampling and the tiny model's init", type=nonneg_int)
    device: str = flag("auto", "where to run", choices=["auto", "cpu", "cuda"])
    blank_screens: tuple | None = flag(None, "WxH: blank screenshots if missing", DATA, type=size)
    max_episodes: int | None = flag(None, "use only the first N episodes", DATA, type=pos_int)
    sft_dir: str = flag("out/sft/ckpt", "where --model auto looks for a checkpoint", DATA)
    ref_model: str | None = flag(None, "reference: 'tiny' or a folder (default: the policy's "
                                 "initialisation)", DATA, type=model_path)
    ref_seed: int | None = flag(None, "a tiny reference's seed (default: --seed)", DATA,
                                type=nonneg_int)
    top_p: float = flag(1.0, "nucleus sampling (release: 1.0)", ROLL, type=open_fraction)
    patch_mode: str = flag("thought-free", "patch mode", ROLL, flag="--patch", choices=PATCH_MODES)
    match_rules: str = flag("strict", "match rules (reward.py)", ROLL, choices=reward.MATCH_RULES)
    episode_adv: str = flag("paper", "episode advantage (eq. 6.3; release: 6.3')", ADV,
                            choices=EPISODE_FORMS)
    w_episode: float = flag(1.0, "episode advantage weight (0: off)", ADV, type=nonneg_float)
    omega: float = flag(1.0, "step advantage weight (0: off)", ADV, type=nonneg_float)
    adv_norm: str = flag("mean_std", "group normalisation (mean: Dr.GRPO's)", ADV, choices=NORMS)
    overlong_buffer: int = flag(0, "DAPO's overlong penalty over the last N tokens before "
                                "--max-new-tokens (0 disables)", ADV, type=nonneg_int)
    max_resample: int = flag(2, "dynamic sampling's refill rounds (0: none)", ADV, type=nonneg_int)
    clip_low: float = flag(0.2, "PPO clip epsilon below 1, in (0, 1)", LOSS,
                           type=cli.finite_float(0.0, 1.0, low_open=True, high_open=True))
    clip_high: float = flag(0.2, "PPO clip epsilon above 1", LOSS, type=pos_float)
    clip_c: float = flag(3.0, "dual-clip constant for negative advantages (> 1)", LOSS,
                         type=cli.finite_float(1.0, low_open=True))
    loss_agg: str = flag("token-mean", "kernels.aggregate_loss's form", LOSS, choices=LOSS_AGGS)
    weight_decay: float = flag(0.01, "AdamW weight decay (0: none)", LOSS, type=nonneg_float)
    grad_clip: float = flag(1.0, "global grad-norm clip", LOSS, type=pos_float)
    ppo_mini_batches: int = flag(4, "optimizer steps per rollout batch", LOSS, type=pos_int)
    save_every: int = flag(0, "checkpoint every N steps (0: at the end only)", RUN, type=nonneg_int)
    keep_checkpoints: int = flag(2, "keep the newest N checkpoints (0: all)", RUN, type=nonneg_int)
    # a test hook, out of --help: exit after N steps without a final checkpoint, as a kill would
    stop_after: int | None = flag(None, argparse.SUPPRESS, RUN, type=pos_int)
    eval_data: str | None = flag(None, "held-out episodes (default: none)", HELDOUT, type=in_file)
    eval_every: int = flag(0, "steps between evaluations (0: start, end)", HELDOUT, type=nonneg_int)
    eval_episodes: int = flag(32, "the first N episodes of --eval-data", HELDOUT, type=pos_int)
    eval_samples: int = flag(4, "sampled responses per held-out step", HELDOUT, type=pos_int)
    decode: str = flag("auto", "sampler decode (auto: graph on CUDA)", PERF, choices=DECODE_MODES)
    old_logp: str = flag("auto", "pi_old: a policy forward or the sampler's log-probs (--top-p 1; "
                         "auto: on CPU)", PERF, choices=["auto", "recompute", "sampler"])
    share_prompts: str = flag("auto", "run a shared prompt once (auto: on CPU)", PERF,
                              choices=["auto", "on", "off"])
    gradient_checkpointing: bool = flag(False, "less memory, more compute", PERF,
                                        action="store_true")


# Named settings: plain dicts of fields, recorded in args.json as "preset"; a flag given overrides
# them. Each pairs the returns with the filter docs/method.md §6 defends, at the paper's 8-GPU 7B
# scale (§7); the prompt contract (e.g. --max-pixels) comes from the SFT checkpoint.
SCALE_7B = dict(tasks_per_step=8, n_rollouts=8, max_new_tokens=512, lr=1e-6, kl_coef=1e-4,
                ppo_mini_batches=4, patch_threshold=2, gamma=0.5)
PRESETS = {
    "quickstart": {},  # the README's main job: the defaults, sized for the tiny CPU model
    # the paper's text: returns (6.1), DAPO's filter dropping only groups that all agree (tau = 0)
    "paper": {**SCALE_7B, "returns_form": "paper", "filter_std": 0.0},
    # the release's script (runs/repro_main.py): returns cut at a wrong step (6.1') with tau = 0.3
    "release": {**SCALE_7B, "returns_form": "release", "filter_std": 0.3},
}
