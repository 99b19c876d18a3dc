"""eval_sop.py's command line: its flags, their types and help, grouped as --help shows them. The
checks between flags, and what each flag does, are eval_sop.py's."""
from __future__ import annotations

import argparse

import chat
import cli
import dataset
import gui
import policies
import vlm
from envs import miniwob_tasks  # the task names (no browser, not the miniwob package: only located)
from evaluation import protocols
from sampler import DECODE_MODES

size_arg = cli.arg_type(gui.parse_size)  # argparse type for 'WxH' -> (W, H)
input_file = cli.arg_type(cli.input_file)  # argparse type: a readable file
# prompt options that must agree with training: read from a checkpoint's args.json unless given


def sop_parser(description: str) -> argparse.ArgumentParser:
    """eval_sop.py's flags (its --help: `description`, eval_sop's docstring). Types check each value
    as it is parsed (cli); the rules between flags are eval_sop.check_flags'."""
    p = cli.make_parser(description)
    perf = p.add_argument_group(
        "performance (not the method: same results, different speed/memory)")
    # data
    p.add_argument("--data", nargs="*", default=[], type=input_file,
                   help="episode files (UI-S1 JSONL or AndroidControl native JSON); "
                   "may be empty with --online")
    p.add_argument("--limit", type=cli.positive_int, default=None,
                   help="first N episodes of each file (default: all)")
    p.add_argument("--per-task-limit", type=cli.positive_int, default=None,
                   help="first N episodes of each task (episode.meta['task'], else each file) "
                   "(default: all)")
    p.add_argument("--swipe-convention", choices=dataset.SWIPE_CONVENTIONS, default=None,
                   help="how the data files store swipes (default: declared per episode, or known "
                   "for the shipped files; a file with swipes and neither is an error)")
    p.add_argument("--match-rules", choices=protocols.MATCH_RULES, default="strict",
                   help="strict (ours; the reward's rules) or release (the UI-S1 release's SOP "
                   "scoring as it ran, for comparison with the paper: its parse and check, and an "
                   "episode with a response its code raised on gets progress 0; README 'Reward "
                   "rules and trivial-policy floors'); androidcontrol, aitw: published step "
                   "protocols' rules (evaluation/protocols.py)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--image-root", default=None, type=cli.arg_type(cli.input_dir),
                   help="folder holding the screenshots (default: paths as recorded)")
    g.add_argument("--blank-screens", type=size_arg, default=None,
                   help="WxH: blank images stand in for missing screenshots "
                   "(dry runs; AndroidControl phones are 1080x2400)")
    # prompt
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer directory (default: the model folder's; tiny: "
                   "assets/tiny_tokenizer; else the shipped Qwen2.5-VL tokenizer)")
    chat.add_prompt_args(p)  # the prompt contract; a model policy adopts its checkpoint's (and caps
    # the budget at its context minus --max-new-tokens, docs/method.md §10)
    # policy
    p.add_argument("--policy", choices=["expert", "model", "openai"], default="expert",
                   help="who acts: expert = replay the expert actions; model = greedy responses of "
                   "--model; openai = a model served behind an OpenAI-compatible endpoint "
                   "(--base-url, --served-model; policies.py)")
    p.add_argument("--model", default="tiny", type=cli.arg_type(vlm.model_path),
                   help="'tiny' (random, seeded by --seed), a Hugging Face folder, a checkpoint "
                   "folder, or a folder with a `latest` pointer (e.g. out/sft/ckpt); the prompt "
                   "contract's fields not given come from its args.json")
    p.add_argument("--max-new-tokens", type=cli.positive_int, default=512,
                   help="response length limit, as training's (docs/method.md §7); a response that "
                   "hits it is cut: under the strict rules a malformed, wrong step; result.json "
                   "counts them (responses_at_cap, truncated_rate)")
    perf.add_argument("--batch-size", type=cli.positive_int, default=32,
                      help="episodes walked together: prompts per generate call (at most)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where the model runs")
    perf.add_argument("--decode", default="auto", choices=DECODE_MODES,
                      help="sampler decode: auto (graph on CUDA, else eager), eager (the "
                      "reference), static, graph (CUDA graphs)")
    p.add_argument("--seed", type=cli.non_negative_int, default=0,
                   help="seed of the tiny model's init")
    # --base-url, --served-model, --action-format, --concurrency, --timeout, --retries
    policies.add_served_args(p)
    # protocols
    p.add_argument("--protocol", nargs="+", choices=["sop", "static", *policies.NAMED_PROTOCOLS],
                   default=["sop"],
                   help="offline protocols on --data: sop (own history) and/or static (expert "
                   "history); or a published step protocol by name, static under its rules: "
                   + policies.PROTOCOL_HELP)
    p.add_argument("--online", action="store_true",
                   help="also evaluate online in live MiniWob++ (chromium)")
    p.add_argument("--online-tasks", nargs="+", type=miniwob_tasks.miniwob_task, default=None,
                   help="MiniWob++ tasks (default: the tasks of --data, else every task with an "
                   "expert)")
    p.add_argument("--online-seeds", type=cli.positive_int, default=5,
                   help="held-out episodes per task (from --online-seed-base)")
    p.add_argument("--online-seed-base", type=cli.non_negative_int, default=None,
                   help="first online seed (default: 200000, fresh pages: the data files use 0+ "
                   "(train) and 100000+ (test))")
    p.add_argument("--online-max-steps", type=cli.positive_int, default=12,
                   help="step limit of an online episode")
    perf.add_argument("--online-batch", type=cli.positive_int, default=8,
                      help="online episodes played at once, one browser each; the model answers "
                      "them in one generate call (greedy answers do not depend on the batch)")
    p.add_argument("--samples", type=cli.non_negative_int, default=0,
                   help="K (0: none): also play every online episode K times sampled (same seeds, "
                   "same pages) and report greedy success, pass@K and the flippable fraction "
                   "(greedy fails, a sample succeeds); --policy model")
    p.add_argument("--temperature", type=cli.temperature, default=1.0,
                   help="sampling temperature of the --samples plays")
    p.add_argument("--sample-seed", type=cli.non_negative_int, default=0,
                   help="seed of the --samples plays (same seed and batch: same plays)")
    # output
    p.add_argument("--out", default=None,
                   help="output folder (result.json, episodes.jsonl, report.html, ...); "
                   "a path ending in .jsonl writes only the per-episode SOP lines there")
    p.add_argument("--resume", action="store_true",
                   help="continue the run stopped or killed in --out (its run.json is there, its "
                   "result.json absent or complete: false): the episodes its files hold are kept, "
                   "not played again; the same flags")
    p.add_argument("--overwrite", action="store_true",
                   help="--out may hold another run: its files (eval_sop's only) are deleted first "
                   "(default: a folder holding eval_sop's files is refused, exit 2)")
    p.add_argument("--max-server-error-share", type=cli.fraction, default=0.0,
                   help="0: any request without an answer makes the exit code 3; else 3 past this "
                   "share (such steps are the server's, counted apart from malformed answers and "
                   "scored wrong), 0 otherwise")
    p.add_argument("--report", default=None,
                   help="HTML report path (default: OUT/report.html when --out is a folder)")
    p.add_argument("--report-episodes", type=cli.non_negative_int, default=8,
                   help="episodes shown per protocol in the report (0: none)")
    p.add_argument("--json", action="store_true",
                   help="also print the full summary (result.json's, without the args) as one JSON "
                   "line, last on stdout")
    p.add_argument("--log-level", default="WARNING", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="logging level (budget warnings are WARNING)")
    return p


# -----------------------------------------------------------------------------
# Policies: samplers for greedy_rollouts (rollout.semi_online_rollout), as training's policy is
