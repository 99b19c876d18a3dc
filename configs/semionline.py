"""train_semionline.py's flags as one typed config (RLConfig: a field per flag with its type,
default, help and --help group) and its named presets (PRESETS). The stage generates its parser
from them (configs.flags.config_parser) and reads the parsed RLConfig; the prompt contract's flags
stay with chat.py."""
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

pos_int, nonneg_int, nonneg_float = cli.positive_int, cli.non_negative_int, cli.non_negative_float
DATA, ROLL = "data and models", "rollout (docs/method.md §5)"
ADV = "returns and advantages (docs/method.md §6)"
LOSS = "loss and optimisation (docs/method.md §7)"
HELDOUT = "held-out evaluation"
GROUPS = [DATA, ROLL, ADV, LOSS, RUN, HELDOUT, LORA, PERF]


@dataclass
class RLConfig(StageConfig):
    """Every flag of this script but the prompt contract's (chat.add_prompt_args): its type, default
    and help; --preset, LoRA's and --report-to come from StageConfig. The fields without a group are
    the ones a user sets first (--help lists them first)."""
    data: str = flag("data/miniwob_click/train.jsonl", "episodes (UI-S1 JSONL or AndroidControl "
                     "native JSON)", type=cli.arg_type(cli.input_file))
    image_root: str | None = flag(None, "folder screenshots are resolved against (default: the "
                                  "data file's folder)", type=cli.arg_type(cli.input_dir))
    model: str = flag("auto", "'tiny', a Hugging Face or checkpoint folder, or 'auto' (the latest "
                      "--sft-dir checkpoint; an error without one); prompt options not given "
                      "(--num-images, --min/max-pixels, --max-prompt-tokens) come from its "
                      "args.json", type=cli.arg_type(vlm.model_path))
    tasks_per_step: int = flag(4, "tasks per training step, all ranks together (release: 8)",
                               type=pos_int)
    n_rollouts: int = flag(4, "rollouts per task N (release: 8)", type=pos_int)
    max_new_tokens: int = flag(48, "response length limit (release: 512)", type=pos_int)
    temperature: float = flag(1.0, "sampling temperature (release: 1.0)", type=cli.temperature)
    history: str = flag("own", "own = semi-online RL; expert = offline-RL baseline",
                        choices=HISTORY_MODES)
    patch_threshold: int = flag(2, "patches per rollout: k at most k (0: none; -1: unlimited; "
                                "release: 2)", type=cli.int_at_least(-1))
    gamma: float = flag(0.5, "discount of step returns in [0, 1] (0: each step's own reward; "
                        "paper: 0.5)", type=cli.fraction)
    returns_form: str = flag("paper", "release: reset the return chain at a wrong step (eq. 6.1')",
                             choices=RETURNS_FORMS)
    filter_std: float = flag(0.0, "dynamic sampling: drop tasks whose step-0 return std <= this; "
                             "<0 disables (release: 0.3 with --returns-form release; 0 keeps every "
                             "task whose rollouts differ at all, which a tiny CPU model needs)",
                             type=cli.finite_float())
    kl_coef: float = flag(1e-4, "k3 KL to the frozen reference; 0 disables the reference model",
                          type=nonneg_float)
    lr: float = flag(2e-5, "AdamW learning rate, constant (the default suits the tiny model; the "
                     "paper's, 7B: 1e-6)", type=cli.positive_float)
    micro_batch_size: int = flag(8, "sequences per forward/backward", type=pos_int)
    max_steps: int = flag(12, "training steps", type=pos_int)
    out: str = flag("out/semionline", "output folder (checkpoints, metrics.jsonl, args.json)")
    resume: bool = flag(False, "continue from the latest checkpoint in --out", action="store_true")
    seed: int = flag(0, "seed of task order, sampling and the tiny model's init", type=nonneg_int)
    device: str = flag("auto", "where to run", choices=["auto", "cpu", "cuda"])
    # data and models
    blank_screens: str | None = flag(None, "WxH: use blank screenshots of this size when files are "
                                     "missing", DATA, type=cli.arg_type(gui.parse_size))
    max_episodes: int | None = flag(None, "use only the first N episodes", DATA, type=pos_int)
    sft_dir: str = flag("out/sft/ckpt", "where --model auto looks for an SFT checkpoint", DATA)
    ref_model: str | None = flag(None, "reference model: 'tiny' or a folder (default: the policy's "
                                 "initialisation)", DATA, type=cli.arg_type(vlm.model_path))
    ref_seed: int | None = flag(None, "init seed of a 'tiny' reference (default: --seed)",
                                DATA, type=nonneg_int)
    # rollout (docs/method.md §5)
    top_p: float = flag(1.0, "nucleus sampling (release: 1.0)",
                        ROLL, type=cli.finite_float(0.0, 1.0, low_open=True))
    patch_mode: str = flag("thought-free", "patch mode (docs/method.md §5)",
                           ROLL, flag="--patch", choices=PATCH_MODES)
    match_rules: str = flag("strict", "the match of the reward, patching and returns "
                            "(reward.action_match): strict, or the release's",
                            ROLL, choices=reward.MATCH_RULES)
    # returns and advantages (docs/method.md §6)
    episode_adv: str = flag("paper", "episode-level advantage form (eq. 6.3; release: 6.3')",
                            ADV, choices=EPISODE_FORMS)
    w_episode: float = flag(1.0, "weight of the episode-level advantage (0: off)",
                            ADV, type=nonneg_float)
    omega: float = flag(1.0, "weight of the step-level advantage (0: off)", ADV, type=nonneg_float)
    adv_norm: str = flag("mean_std", "group normalisation of both advantage levels: mean_std "
                         "(paper) or mean (Dr.GRPO: no std division)", ADV, choices=NORMS)
    overlong_buffer: int = flag(0, "DAPO's soft overlong penalty: a response within this many "
                                "tokens of --max-new-tokens loses up to 1 of reward, linearly "
                                "(reward.shaped_reward); 0 disables it. Off by default: under the "
                                "strict rules a response cut at the cap already scores 0",
                                ADV, type=nonneg_int)
    max_resample: int = flag(2, "refill rounds after the first (0: none) when dynamic sampling "
                             "dropped tasks; a batch still short is trained on as it is and "
                             "flagged 'partial' (release: up to 10 batches, then an error)",
                             ADV, type=nonneg_int)
    # loss and optimisation (docs/method.md §7)
    clip_low: float = flag(0.2, "PPO clip epsilon below 1, in (0, 1)",
                           LOSS, type=cli.finite_float(0.0, 1.0, low_open=True, high_open=True))
    clip_high: float = flag(0.2, "PPO clip epsilon above 1", LOSS, type=cli.positive_float)
    clip_c: float = flag(3.0, "dual-clip constant for negative advantages (> 1)",
                         LOSS, type=cli.finite_float(1.0, low_open=True))
    loss_agg: str = flag("token-mean", "how per-token losses become the mini-batch loss "
                         "(kernels.aggregate_loss; dr-grpo divides by sequences x "
                         "--max-new-tokens)", LOSS, choices=LOSS_AGGS)
    weight_decay: float = flag(0.01, "AdamW weight decay (0: none)", LOSS, type=nonneg_float)
    grad_clip: float = flag(1.0, "global grad-norm clip", LOSS, type=cli.positive_float)
    ppo_mini_batches: int = flag(4, "optimizer steps per rollout batch (1 PPO epoch)",
                                 LOSS, type=pos_int)
    # run
    save_every: int = flag(0, "checkpoint every N steps (0: at the end only)", RUN, type=nonneg_int)
    keep_checkpoints: int = flag(2, "keep the newest N checkpoints (0: every one, e.g. for a "
                                 "dose-response over the steps)", RUN, type=nonneg_int)
    # held-out evaluation
    eval_data: str | None = flag(None, "held-out episodes for heldout_* metrics (greedy and "
                                 "sampled static step accuracy, greedy SOP) every --eval-every "
                                 "steps and at the start; default: none",
                                 HELDOUT, type=cli.arg_type(cli.input_file))
    eval_every: int = flag(0, "steps between held-out evaluations (0: only with --eval-data, at "
                           "the start and end)", HELDOUT, type=nonneg_int)
    eval_episodes: int = flag(32, "held-out episodes used (the first N of --eval-data)",
                              HELDOUT, type=pos_int)
    eval_samples: int = flag(4, "sampled responses per held-out step (at --temperature, --top-p)",
                             HELDOUT, type=pos_int)
    # a test hook, kept out of --help: exit after this many steps without a final checkpoint, as a
    # killed run would (the resume test compares such a run resumed with an uninterrupted one)
    stop_after: int | None = flag(None, argparse.SUPPRESS, RUN, type=pos_int)
    # performance
    decode: str = flag("auto", "sampler decode: auto (graph on CUDA, else eager), eager (the "
                       "reference), static, graph (CUDA graphs)", PERF, choices=DECODE_MODES)
    old_logp: str = flag("auto", "pi_old of the ratio: a no-grad policy forward (recompute, the "
                         "release's) or the sampler's log-probs (same weights and temperature; "
                         "needs --top-p 1); auto: sampler on CPU (fp32: gap ~1e-5), else recompute",
                         PERF, choices=["auto", "recompute", "sampler"])
    share_prompts: str = flag("auto", "run the prompt head a micro-batch's rows share once in the "
                              "log-prob forwards (extras/shared_prompt.py; same log-probs, ~1e-5); "
                              "auto: on on CPU without --gradient-checkpointing (GPU: not "
                              "measured, off)", PERF, choices=["auto", "on", "off"])
    gradient_checkpointing: bool = flag(False, "recompute each decoder layer's and vision block's "
                                        "activations in the backward (less memory, ~1/3 more "
                                        "update compute)", PERF, action="store_true")


# Named settings (configs.common.PRESET_NAMES; plain dicts of fields, any flag's dest, recorded in
# args.json as "preset"; a flag given on the command line overrides them). docs/method.md §6 ties
# the filter to the returns: tau = 0.3 is on the scale of the release's returns (6.1'); under the paper's (6.1)
# it drops exactly the groups split by the step-0 decision. So each preset is one consistent
# combination, at the scale of the paper's 8-GPU 7B run (docs/method.md §7: 8 tasks x 8 rollouts,
# 512 new tokens, lr 1e-6, KL 1e-4, 4 PPO mini-batches, patch threshold 2, gamma 0.5). The prompt
# contract (e.g. --max-pixels) is not a preset's: it comes from the SFT checkpoint (train_sft.py's
# presets).
SCALE_7B = dict(tasks_per_step=8, n_rollouts=8, max_new_tokens=512, lr=1e-6, kl_coef=1e-4,
                ppo_mini_batches=4, patch_threshold=2, gamma=0.5)
PRESETS = {
    # the README's quick start: the defaults, sized for the tiny CPU model
    "quickstart": {},
    # the paper's text: discounted returns (6.1) and dynamic sampling as DAPO states it, dropping
    # only the groups whose rollouts all agree (tau = 0), the one threshold (6.1) can carry
    "paper": {**SCALE_7B, "returns_form": "paper", "filter_std": 0.0},
    # the release's training script: returns cut at a wrong step (6.1') with its filter tau = 0.3,
    # which belongs to them; the reproduction's combination (runs/repro_main.py)
    "release": {**SCALE_7B, "returns_form": "release", "filter_std": 0.3},
}
