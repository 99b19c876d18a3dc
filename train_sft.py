"""Supervised fine-tuning on expert demonstrations: the starting point of UI-S1 (SFT, then
semi-online RL). One top-down training script, the same FSDP2 loop style as
train_semionline.py.

Every step t of every expert episode is one example: the prompt holds the goal, the
screenshots (the last --num-images as images) and the EXPERT's earlier responses as
history; the target is the expert's response at t, `<think>thought</think><action>json
</action>` with coordinates in pixels of the resized screenshot, followed by <|im_end|>.
The loss is the token-mean negative log-likelihood of the response tokens only, through
the fused lm_head log-prob kernel (kernels.fused_logprob), so [tokens x vocab] logits are
never materialised.

Single process:
    python train_sft.py --max-steps 50
Several processes (FSDP2; gloo on CPU, nccl on GPU):
    torchrun --nproc_per_node=2 train_sft.py
AndroidControl without screenshots (dry run on blank 1080x2400 phones):
    python train_sft.py --data data/android_control/android_control_train_example_uis1.jsonl \\
        --blank-screens 1080x2400 --max-pixels 200704
Short of memory: add --gradient-checkpointing (activations recomputed per decoder layer), or train
LoRA adapters only (--lora-r 16 --merge: lora.py; OUT/merged is then the plain adapted model).
Checkpoints land in --out/ckpt/step_XXXXXX (Hugging Face layout, safetensors);
train_semionline.py --model auto starts from the latest one.

Copy warm-up (models trained from scratch only; `--copy-warmup-steps`, default: 1000 for a
'tiny' model, 0 otherwise). A correct click copies the target's point from the element list, and a
correct type copies a quoted text from the goal: both take an induction head (at the response's
` at (`, find the same pair in the prompt and repeat the digits after it). A pretrained VLM has
one; a randomly initialised model does not form one on the expert data, where only ~10 % of the
target tokens are digits (their NLL stays at ~2.2 nats, a uniform guess is 2.30: results/LOG.md).
So it first trains on synthetic text-only pages in the product's layout (no system prompt, no
screenshot): 1..--copy-warmup-elements element lines `[k] kind 'label' at (x,y) (box)` with labels
from the training data, the expert-style thought and click on the target, and, one page in four
(--copy-warmup-type-frac), an input box to type a quoted label into; a share of the pages
(--copy-warmup-code-frac) with fresh random codes as labels; fresh pages every step, own
AdamW at --copy-warmup-lr; then SFT proper starts with a fresh optimizer. `--max-steps 0` saves the
warm-up alone: a base every SFT run can start from (runs/repro_main.py trains it once).
"""
from __future__ import annotations

import math
import random
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm import tqdm

import chat
import dataset
import gui
import lora
import patch
import utils
import vlm
from vlm import PolicyLogProb, apply_fsdp, checkpoint_activations, collate_sequences, pad_token_id, to_device

# -----------------------------------------------------------------------------
# config

parser = utils.make_parser(__doc__)
perf = parser.add_argument_group("performance (not the method: same results, different speed/memory)")
# data
parser.add_argument("--data", default="data/miniwob_click/train.jsonl", type=utils.arg_type(utils.input_file), help="expert episodes (UI-S1 JSONL or AndroidControl native JSON)")
parser.add_argument("--image-root", default=None, type=utils.arg_type(utils.input_dir), help="folder screenshots are resolved against (default: the data file's folder)")
parser.add_argument("--blank-screens", default=None, type=utils.arg_type(gui.parse_size), help="WxH: blank screenshots of this size when files are missing")
parser.add_argument("--max-episodes", type=utils.positive_int, default=None, help="use only the first N episodes")
parser.add_argument("--val-frac", type=utils.finite_float(0.0, 1.0, high_open=True), default=0.1, help="share of episodes held out for validation loss (0: none)")
# model
parser.add_argument("--model", default="tiny:128x4", type=utils.arg_type(vlm.model_path),
                    help="'tiny', a local Hugging Face folder, or a checkpoint folder (a `latest` pointer is followed)")
lora.add_lora_args(parser)  # --lora-r (0: full fine-tuning), --lora-alpha, --lora-dropout, --lora-targets, --lora-vision, --merge
# optimisation
parser.add_argument("--lr", type=utils.positive_float, default=1e-3, help="AdamW peak learning rate (the default suits the tiny model; the README's 7B command: 1e-5)")
parser.add_argument("--min-lr-frac", type=utils.fraction, default=0.1, help="cosine decay floor, as a fraction of --lr (0: decay to 0)")
parser.add_argument("--warmup-steps", type=utils.non_negative_int, default=20, help="linear warm-up steps (0: none)")
parser.add_argument("--weight-decay", type=utils.non_negative_float, default=0.01, help="AdamW weight decay (0: none)")
parser.add_argument("--grad-clip", type=utils.positive_float, default=1.0, help="global grad-norm clip")
parser.add_argument("--batch-size", type=utils.positive_int, default=8, help="examples per optimizer step, all ranks together")
parser.add_argument("--micro-batch-size", type=utils.positive_int, default=8, help="examples per forward/backward")
perf.add_argument("--gradient-checkpointing", action="store_true",
                  help="recompute each decoder layer's and vision block's activations in the backward (less memory, ~1/3 more compute)")
parser.add_argument("--copy-warmup-steps", type=utils.non_negative_int, default=None,
                    help="steps on synthetic pages before SFT (module docstring; 0: none; default: 1000 for a 'tiny' model trained from scratch, else 0)")
parser.add_argument("--copy-warmup-lr", type=utils.positive_float, default=1e-3, help="constant AdamW learning rate of the copy warm-up")
parser.add_argument("--copy-warmup-elements", type=utils.positive_int, default=1, help="elements per synthetic click page, at most (the target looked up among them)")
parser.add_argument("--copy-warmup-type-frac", type=utils.fraction, default=0.25, help="share of synthetic pages that ask to type a quoted text (0: click pages only)")
parser.add_argument("--copy-warmup-code-frac", type=utils.fraction, default=0.0, help="share of synthetic pages whose labels are fresh random codes (3-8 of A-Z, 0-9) instead of the training data's labels, so the copy learnt holds for strings never seen (0: training labels only)")
parser.add_argument("--copy-warmup-save-at", type=utils.positive_int, nargs="*", default=[],
                    help="warm-up steps after which the warm-up's model is also saved, as OUT/warmup_ckpt/step_N: the base "
                         "of an N-step warm-up (its learning rate is constant and its pages drawn step by step, so N steps "
                         "of a longer warm-up are an N-step warm-up)")
chat.add_prompt_args(parser)  # --num-images, --min/max-pixels, --max-prompt-tokens, --step-instruction, --elements, --system-prompt
# run
parser.add_argument("--max-steps", type=utils.non_negative_int, default=200, help="optimizer steps (0: the copy warm-up alone, saved as step 0: a shared base)")
parser.add_argument("--eval-every", type=utils.non_negative_int, default=50, help="validation loss every N steps (0: at the end only)")
parser.add_argument("--out", default="out/sft", help="output folder (ckpt/, metrics.jsonl, args.json)")
utils.add_report_to_arg(parser)  # --report-to none | tensorboard wandb trackio (utils.MetricsLogger)
parser.add_argument("--save-every", type=utils.non_negative_int, default=0, help="checkpoint every N steps (0: at the end only)")
parser.add_argument("--keep-checkpoints", type=utils.non_negative_int, default=2,
                    help="keep the newest N checkpoints (0: every one, e.g. for a dose-response over the steps)")
parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out/ckpt")
parser.add_argument("--seed", type=utils.non_negative_int, default=0, help="seed of data order, split and the tiny model's init")
parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to run")


# -----------------------------------------------------------------------------
# the SFT examples, and the copy warm-up's (its pages: dataset.synthetic_page)

def sft_example(ep, t: int, tokenizer, image_processor, spec: chat.PromptSpec, *, image_root=None,
                blank_screens=None) -> tuple:
    """(prompt, target ids) of step t of episode `ep` (dataset.Episode): the prompt under the
    contract `spec` (chat.step_prompt, as the rollout builds it) with the EXPERT's earlier responses
    as history, the target the expert's response at t (coordinates in pixels of the resized
    screenshot) followed by <|im_end|> (docs/method.md §2-§3)."""
    shots = [dataset.load_screenshot(s, image_root=image_root, blank_screens=blank_screens) for s in ep.steps[:t + 1]]
    responses, specials = [], chat.special_tokens(tokenizer)
    for s in ep.steps[:t + 1]:
        orig = dataset.original_size(s, image_root=image_root, blank_screens=blank_screens)
        thought = patch.clean_thought(chat.strip_special(s.thought or "", specials))  # the target is tokenized as is
        responses.append(gui.expert_response(s, orig, thought=thought, min_pixels=spec.min_pixels,
                                             max_pixels=spec.max_pixels))
    prompt = chat.step_prompt(tokenizer, image_processor, spec, goal=ep.goal, step=ep.steps[t], screenshots=shots,
                              history=responses[:t])
    return prompt, tokenizer(responses[t], add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def copy_warmup_default(model) -> int:
    """--copy-warmup-steps when not given: 1000 for a 'tiny' / 'tiny:HxL' model (random init), 0
    for a model folder (pretrained or a checkpoint: it has the skill or has been warmed up)."""
    return 1000 if vlm.parse_tiny(str(model)) is not None else 0


def page_prompt(tokenizer, goal: str, elements: str, system: bool = True) -> list[int]:
    """Token ids of chat.build_prompt's layout for a first step without the screenshot (and with
    an empty system prompt when system is False)."""
    messages = [{"role": "system", "content": [{"type": "text", "text": chat.SYSTEM_PROMPT if system else ""}]},
                {"role": "user", "content": [{"type": "text", "text": f"Task goal: {goal}\n"},
                                             {"type": "text", "text": "Step 1 screenshot:"},
                                             {"type": "text", "text": f"\nUI elements on screen:\n{elements}"}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


CODE_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def synthetic_example(rng: random.Random, labels: list[str], tokenizer, *, max_elements: int = 1,
                      system: bool = False, type_frac: float = 0.0,
                      code_frac: float = 0.0) -> tuple[SimpleNamespace, list[int]]:
    """(prompt with input_ids (T,) int64 and no image, target ids ending in <|im_end|>) of one
    synthetic page, ready for collate_sequences: a type page (dataset.synthetic_type_page) with probability
    type_frac, else a click page of 1..max_elements elements (dataset.synthetic_page). With probability
    code_frac the page's labels are fresh random codes (3-8 characters of CODE_CHARS) instead of `labels`:
    a model warmed up on the training labels alone recalls those labels instead of copying a new one
    (the memory tasks' codes, results/LOG.md 2026-12-06)."""
    if code_frac > 0 and rng.random() < code_frac:
        codes: set[str] = set()
        while len(codes) < max(max_elements, 1):
            codes.add("".join(rng.choices(CODE_CHARS, k=rng.randint(3, 8))))
        labels = sorted(codes)
    if type_frac > 0 and rng.random() < type_frac:
        goal, lines, action, thought = dataset.synthetic_type_page(rng, labels)
    else:
        goal, lines, action, thought = dataset.synthetic_page(rng, labels, max_elements)
    target = tokenizer.encode(gui.format_response(thought, action), add_special_tokens=False)
    prompt = SimpleNamespace(input_ids=torch.tensor(page_prompt(tokenizer, goal, lines, system)),
                             pixel_values=None, image_grid_thw=None)
    return prompt, target + [tokenizer.convert_tokens_to_ids("<|im_end|>")]


# -----------------------------------------------------------------------------
# the run: processes, data, the model, a resume (main, at the bottom, runs the two training loops)


def setup(args, spec: chat.PromptSpec) -> SimpleNamespace:
    """Processes, seeds and the data: one example per (episode, step), split into train and validation
    episodes; prompts are built lazily (images are big). Read and checked before anything is written to
    --out: a run that fails here leaves a finished run's records as they were. Then the model (build_model).
    Returns the run's state, which the loops below read."""
    proc = utils.init_distributed(args.device)
    utils.seed_everything(args.seed)
    if args.batch_size % (args.micro_batch_size * proc.world_size):
        raise utils.UsageError(f"--batch-size {args.batch_size} must be a multiple of micro-batch-size x world size "
                               f"({args.micro_batch_size} x {proc.world_size})")
    blank = gui.parse_size(args.blank_screens) if args.blank_screens else None
    episodes = dataset.load_episodes(args.data, limit=args.max_episodes)
    order = list(range(len(episodes)))
    random.Random(args.seed).shuffle(order)
    n_val = int(round(len(episodes) * args.val_frac)) if len(episodes) > 1 else 0
    val_eps, train_eps = [episodes[i] for i in order[:n_val]], [episodes[i] for i in order[n_val:]]
    train_ex = [(e, t) for e in train_eps for t in range(len(e.steps))]
    val_ex = [(e, t) for e in val_eps for t in range(len(e.steps))]
    per_rank = len(train_ex) // proc.world_size
    if args.max_steps > 0 and per_rank < args.micro_batch_size:
        raise utils.UsageError(f"the train split has {len(train_ex)} examples ({len(train_eps)} episodes of {args.data} after "
                               f"--val-frac {args.val_frac:g} held out {len(val_eps)}): {per_rank} per rank on {proc.world_size} "
                               f"rank(s), fewer than --micro-batch-size {args.micro_batch_size}; lower it or --val-frac, or add data")
    tokenizer, image_processor = vlm.load_processor(args.model, min_pixels=spec.min_pixels, max_pixels=spec.max_pixels)
    utils.print0(f"{len(train_eps)} train / {len(val_eps)} val episodes, {len(train_ex)} / {len(val_ex)} examples")
    run = SimpleNamespace(args=args, proc=proc, gpu=proc.device.type == "cuda", out=Path(args.out), spec=spec,
                          blank=blank, train_eps=train_eps, train_ex=train_ex, val_ex=val_ex, tokenizer=tokenizer,
                          image_processor=image_processor, pad_id=pad_token_id(tokenizer))
    build_model(run)
    return run


def build_model(run) -> None:
    """The policy (FSDP2; LoRA adapters with --lora-r) and its optimizer, into `run`; with --resume the
    latest checkpoint in --out; then the first write to --out (args.json) and the metrics file."""
    args, proc, out = run.args, run.proc, run.out
    run.model = model = vlm.load_model(args.model, dtype=torch.float32, device=proc.device, seed=args.seed)
    run.adapter = lora.apply_lora(model, args, base=args.model, seed=args.seed)  # None without --lora-r
    if args.gradient_checkpointing:
        checkpoint_activations(model)
    run.policy = apply_fsdp(model, PolicyLogProb(model), proc, mixed_precision=run.gpu)
    run.optimizer = utils.adamw(lora.trainable(run.policy), lr=args.lr, weight_decay=args.weight_decay)
    run.start_step = 0
    if args.resume:
        ckpt = utils.latest_checkpoint(out / "ckpt")
        if ckpt is not None:
            run.start_step = int(vlm.load_checkpoint_state(ckpt, run.policy, run.optimizer).get("step", 0))
            utils.print0(f"resumed from {ckpt} at step {run.start_step}")
    # the first write to --out: the flags, the data and a resume's checkpoint are checked by now
    if proc.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "args.json").write_text(utils.dumps(vars(args), indent=2))
    run.metrics = utils.MetricsLogger(out / "metrics.jsonl", append=args.resume, report_to=args.report_to,
                                      config=vars(args))
    if args.resume:
        run.metrics.resume_at(run.start_step)  # the steps redone after the checkpoint are logged once


def example(run, ep, t: int) -> tuple:
    """sft_example of step t of `ep` under the run's prompt contract."""
    return sft_example(ep, t, run.tokenizer, run.image_processor, run.spec, image_root=run.args.image_root,
                       blank_screens=run.blank)


def batches(run, examples, size, seed, split="train"):
    """Endless shuffled micro-batches of this rank's share. Raises utils.UsageError naming the split
    and the sizes when the share holds fewer than `size` examples (it would never yield)."""
    proc = run.proc
    if len(examples[proc.rank::proc.world_size]) < size:
        raise utils.UsageError(f"the {split} split: {len(examples)} examples, {len(examples[proc.rank::proc.world_size])} "
                               f"on rank {proc.rank} of {proc.world_size}, fewer than a micro-batch of {size}")
    epoch = 0
    while True:
        idx = list(range(len(examples)))
        random.Random(seed + epoch).shuffle(idx)
        idx = idx[proc.rank::proc.world_size]
        for i in range(0, len(idx) - size + 1, size):
            yield [examples[j] for j in idx[i:i + size]]
        epoch += 1


def lr_at(args, step: int) -> float:
    """The learning rate of `step`: linear warm-up over --warmup-steps, then cosine down to --min-lr-frac."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    frac = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def nll(run, built):
    """Summed NLL (fp32 scalar, with grad) and token count of built (prompt, target) pairs."""
    prompts, targets = zip(*built)
    batch = to_device(collate_sequences(list(prompts), list(targets), run.pad_id), run.proc.device)
    logp, _ = run.policy(batch)
    return -logp.sum(), logp.numel()


@torch.no_grad()
def val_loss(run) -> float:
    """Token-mean validation NLL over all ranks (every rank runs the same number of chunks)."""
    args, proc, val_ex = run.args, run.proc, run.val_ex
    run.policy.eval()
    mine = val_ex[proc.rank::proc.world_size]
    n_chunks = torch.tensor([math.ceil(len(mine) / args.micro_batch_size)], dtype=torch.float64)
    if proc.world_size > 1:
        torch.distributed.all_reduce(n_chunks, op=torch.distributed.ReduceOp.MAX)
    tot = torch.zeros(2, dtype=torch.float64)
    for c in range(int(n_chunks.item())):
        chunk = mine[c * args.micro_batch_size:(c + 1) * args.micro_batch_size]
        loss, n = nll(run, [example(run, e, t) for e, t in (chunk or val_ex[:1])])
        if chunk:
            tot += torch.tensor([loss.item(), n], dtype=torch.float64)
    utils.all_reduce_sum(tot)
    run.policy.train()
    return (tot[0] / tot[1].clamp(min=1)).item() if tot[1] > 0 else float("nan")


# -----------------------------------------------------------------------------
# the two training loops: the copy warm-up (models trained from scratch), then SFT


def copy_warmup(run) -> None:
    """The copy warm-up (module docstring), on a fresh run only: --copy-warmup-steps steps on synthetic
    pages with their own AdamW; with --max-steps 0 its model is the run's checkpoint (a base to start from)."""
    args, proc, out, policy = run.args, run.proc, run.out, run.policy
    warm_steps = args.copy_warmup_steps
    labels = dataset.page_labels(run.train_eps) if warm_steps > 0 and run.start_step == 0 else []
    if warm_steps > 0 and run.start_step == 0 and not labels:
        utils.print0(f"copy warm-up skipped: no element labels in {args.data}")
    if not labels:
        return
    rng = random.Random(args.seed * 1_000_003 + proc.rank)
    digit_ids = set(run.tokenizer.convert_tokens_to_ids(list("0123456789")))
    warm_opt = utils.adamw(lora.trainable(policy), lr=args.copy_warmup_lr, weight_decay=args.weight_decay)
    warm_log = utils.MetricsLogger(out / "copy_warmup.jsonl")
    per_rank = max(1, args.batch_size // proc.world_size)
    policy.train()
    bar = tqdm(range(warm_steps), desc="copy warm-up", disable=not proc.is_main)
    for step in bar:
        built = [synthetic_example(rng, labels, run.tokenizer, max_elements=args.copy_warmup_elements,
                                   type_frac=args.copy_warmup_type_frac, code_frac=args.copy_warmup_code_frac)
                 for _ in range(per_rank)]
        batch = to_device(collate_sequences([p for p, _ in built], [y for _, y in built], run.pad_id), proc.device)
        logp, _ = policy(batch)
        loss = -logp.mean()
        warm_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), args.grad_clip)
        warm_opt.step()
        is_digit = torch.tensor([t in digit_ids for _, y in built for t in y])
        row = torch.tensor([loss.item(), -logp.detach().cpu()[is_digit].mean().item()], dtype=torch.float64) / proc.world_size
        utils.all_reduce_sum(row)
        warm_log.log({"step": step + 1, "loss": row[0].item(), "digit_nll": row[1].item()})
        if step + 1 in args.copy_warmup_save_at:  # a shorter warm-up's base, from the same run
            vlm.save_checkpoint(out / "warmup_ckpt", policy, run.tokenizer, vars(args), extra={"step": step + 1},
                                keep=0, adapter=run.adapter)
        bar.set_postfix(loss=f"{row[0].item():.3f}", digits=f"{row[1].item():.3f}")
    utils.print0(f"copy warm-up: {warm_steps} steps, last loss {row[0].item():.3f}, coordinate digits "
                 f"{row[1].item():.3f} nats/token (no copy: ~2.2; log {out / 'copy_warmup.jsonl'})")
    del warm_opt
    if args.max_steps == 0:  # the warm-up alone: a base model that SFT runs start from (--model BASE)
        vlm.save_checkpoint(out / "ckpt", policy, run.tokenizer, vars(args), extra={"step": 0}, adapter=run.adapter)


def sft(run) -> dict:
    """SFT proper: --max-steps optimizer steps of --batch-size examples (token-mean NLL over the global
    batch, gradient accumulation over micro-batches), a resumed run continuing the same data order;
    validation every --eval-every steps and at the end; checkpoints. Returns the last step's metrics."""
    args, proc, policy, optimizer = run.args, run.proc, run.policy, run.optimizer
    accum = args.batch_size // (args.micro_batch_size * proc.world_size)
    stream = batches(run, run.train_ex, args.micro_batch_size, args.seed)
    for _ in range(run.start_step * accum):  # a resumed run continues the same data order
        next(stream)
    last = {}
    policy.train()
    bar = tqdm(range(run.start_step, args.max_steps), desc="SFT", disable=not proc.is_main)
    for step in bar:
        t0 = time.time()
        if run.gpu:
            torch.cuda.reset_peak_memory_stats(proc.device)
        for g in optimizer.param_groups:
            g["lr"] = lr_at(args, step)
        # build the micro-batches first: the token-mean needs the global target token count
        built = [[example(run, e, t) for e, t in next(stream)] for _ in range(accum)]
        n_tok = torch.tensor([float(sum(len(y) for mb in built for _, y in mb))], dtype=torch.float64)
        utils.all_reduce_sum(n_tok)
        loss_sum, tok_local = 0.0, 0
        optimizer.zero_grad(set_to_none=True)
        for mb in built:
            loss, n = nll(run, mb)
            # FSDP averages gradients over ranks; * world_size makes this the global token mean
            (loss / n_tok.item() * proc.world_size).backward()
            loss_sum += loss.item()
            tok_local += n
        gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.grad_clip)
        optimizer.step()
        tot = torch.tensor([loss_sum, tok_local], dtype=torch.float64)
        utils.all_reduce_sum(tot)
        dt = time.time() - t0
        last = {"step": step + 1, "loss": (tot[0] / tot[1]).item(), "lr": lr_at(args, step),
                "grad_norm": float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn),
                "tokens": int(tot[1].item()), "tok_s": tot[1].item() / dt, "time_s": dt,
                "peak_mem_bytes": utils.peak_memory_bytes(proc.device)}  # this rank: the step's (CUDA) or the run's (CPU)
        if (args.eval_every and (step + 1) % args.eval_every == 0) or step + 1 == args.max_steps:
            last["val_loss"] = val_loss(run)
        run.metrics.log(last)
        bar.set_postfix(loss=f"{last['loss']:.3f}", **({"val": f"{last['val_loss']:.3f}"} if "val_loss" in last else {}))
        if "val_loss" in last:
            utils.print0(f"step {step + 1:5d} | loss {last['loss']:.4f} | val {last['val_loss']:.4f} | lr {last['lr']:.2e} "
                         f"| gnorm {last['grad_norm']:.2f} | {last['tok_s']:.0f} tok/s")
        if step + 1 == args.max_steps or (args.save_every and (step + 1) % args.save_every == 0):
            vlm.save_checkpoint(run.out / "ckpt", policy, run.tokenizer, vars(args), optimizer=optimizer,
                                extra={"step": step + 1}, adapter=run.adapter, keep=args.keep_checkpoints)
    return last


def finish(run, last: dict) -> None:
    """Close the metrics and the process group; rank 0 merges LoRA adapters (--merge) and prints where the
    checkpoint is, the commands to plot, evaluate and go on with it, and the last row as JSON."""
    args, out = run.args, run.out
    run.metrics.close()
    utils.cleanup_distributed()
    if run.proc.is_main and args.merge:  # the adapted model as a plain Hugging Face folder
        utils.print0(f"merged: {vlm.merge_checkpoint(utils.latest_checkpoint(out / 'ckpt'), out / 'merged')}")
    if run.proc.is_main:
        utils.print_next_steps(out, args.data, "out/eval/sft",
                               f"next stage: torchrun --nproc_per_node=2 train_semionline.py --sft-dir {out / 'ckpt'}")
        print(utils.dumps(last), flush=True)


def main(argv=None):
    args = parser.parse_args(argv)
    if args.copy_warmup_steps is None:   # resolved here so that args.json records the number
        args.copy_warmup_steps = copy_warmup_default(args.model)
    if any(n > args.copy_warmup_steps for n in args.copy_warmup_save_at):
        raise utils.UsageError(f"--copy-warmup-save-at {args.copy_warmup_save_at}: every step must be <= "
                               f"--copy-warmup-steps {args.copy_warmup_steps}")
    spec = chat.resolve_spec(args, args.model, say=utils.print0)
    if lora.check_lora_args(args):
        raise utils.UsageError(lora.check_lora_args(args))
    run = setup(args, spec)
    copy_warmup(run)  # models trained from scratch: copy a point (or a string) first
    last = sft(run)
    finish(run, last)
    return last


if __name__ == "__main__":
    utils.run_script(main)
