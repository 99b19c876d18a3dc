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
The paper's scale (8 GPUs, Qwen2.5-VL-7B-Instruct; docs/method.md §6 lists the presets' flags):
    torchrun --nproc_per_node=8 train_sft.py --preset paper \\
        --model /models/Qwen2.5-VL-7B-Instruct --image-root /data/ac \\
        --data data/android_control/android_control_train_example_uis1.jsonl
AndroidControl without screenshots (dry run on blank 1080x2400 phones):
    python train_sft.py --data data/android_control/android_control_train_example_uis1.jsonl \\
        --blank-screens 1080x2400 --max-pixels 200704
Short of memory: add --gradient-checkpointing (activations recomputed per decoder layer), or train
LoRA adapters only (--lora-r 16 --merge: lora.py; OUT/merged: the plain adapted model).
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

import argparse
import dataclasses
import math
import random
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm import tqdm

import chat
import cli
import dataset
import gui
import patch
import utils
import vlm
from configs.common import check_lora_args, metrics_logger
from configs.flags import config_parser, parse_config
from configs.sft import GROUPS, PRESETS, SFTConfig
from vlm import (PolicyLogProb, apply_fsdp, checkpoint_activations, collate_sequences, pad_token_id,
                 to_device)

# -----------------------------------------------------------------------------
# config: the flags made from configs.sft.SFTConfig (typed fields) and its PRESETS

parser = config_parser(__doc__, SFTConfig, GROUPS, PRESETS)
chat.add_prompt_args(parser)  # --num-images, --min/max-pixels, --max-prompt-tokens, ...


def parse(argv=None) -> tuple[SFTConfig, argparse.Namespace]:
    """The flags: (the typed config with --preset applied, the Namespace of the prompt's flags, as
    chat.resolve_spec reads them). Bad flags: exit 2."""
    return parse_config(parser, SFTConfig, PRESETS, argv)


# -----------------------------------------------------------------------------
# the SFT examples, and the copy warm-up's (its pages: extras/synthetic_pages.py)

def sft_example(ep, t: int, tokenizer, image_processor, spec: chat.PromptSpec, *, image_root=None,
                blank_screens=None) -> tuple:
    """(prompt, target ids) of step t of episode `ep` (dataset.Episode): the prompt under the
    contract `spec` (chat.step_prompt, as the rollout builds it) with the EXPERT's earlier responses
    as history, the target the expert's response at t (coordinates in pixels of the resized
    screenshot) followed by <|im_end|> (docs/method.md §2-§3)."""
    shots = [dataset.load_screenshot(s, image_root=image_root, blank_screens=blank_screens)
             for s in ep.steps[:t + 1]]
    responses, specials = [], chat.special_tokens(tokenizer)
    for s in ep.steps[:t + 1]:
        orig = dataset.original_size(s, image_root=image_root, blank_screens=blank_screens)
        # the target is tokenized as is
        thought = patch.clean_thought(chat.strip_special(s.thought or "", specials))
        responses.append(gui.expert_response(s, orig, thought=thought, min_pixels=spec.min_pixels,
                                             max_pixels=spec.max_pixels))
    prompt = chat.step_prompt(tokenizer, image_processor, spec, goal=ep.goal, step=ep.steps[t],
                              screenshots=shots, history=responses[:t])
    target = tokenizer(responses[t], add_special_tokens=False)["input_ids"]
    return prompt, target + [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def copy_warmup_default(model) -> int:
    """--copy-warmup-steps when not given: 1000 for a 'tiny' / 'tiny:HxL' model (random init), 0
    for a model folder (pretrained or a checkpoint: it has the skill or has been warmed up)."""
    return 1000 if utils.is_tiny(model) else 0


def page_prompt(tokenizer, goal: str, elements: str, system: bool = True) -> list[int]:
    """Token ids of chat.build_prompt's layout for a first step without the screenshot (and with
    an empty system prompt when system is False)."""
    messages = [{"role": "system",
                 "content": [{"type": "text", "text": chat.FULL_SYSTEM_PROMPT if system else ""}]},
                {"role": "user", "content": [{"type": "text", "text": f"Task goal: {goal}\n"},
                                             {"type": "text", "text": "Step 1 screenshot:"},
                                             {"type": "text",
                                              "text": f"\nUI elements on screen:\n{elements}"}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


CODE_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def synthetic_example(rng: random.Random, labels: list[str], tokenizer, *, max_elements: int = 1,
                      system: bool = False, type_frac: float = 0.0,
                      code_frac: float = 0.0) -> tuple[SimpleNamespace, list[int]]:
    """(prompt with input_ids (T,) int64 and no image, target ids ending in <|im_end|>) of one
    synthetic page, ready for collate_sequences: a type page (synthetic_pages.synthetic_type_page)
    with probability type_frac, else a click page of 1..max_elements elements (synthetic_page).
    With probability code_frac the page's labels are fresh random codes (3-8 characters of
    CODE_CHARS) instead of `labels`: a model warmed up on the training labels alone recalls those
    labels instead of copying a new one (the memory tasks' codes, results/LOG.md 2026-12-06)."""
    if code_frac > 0 and rng.random() < code_frac:
        codes: set[str] = set()
        while len(codes) < max(max_elements, 1):
            codes.add("".join(rng.choices(CODE_CHARS, k=rng.randint(3, 8))))
        labels = sorted(codes)
    from extras import synthetic_pages  # the copy warm-up's, and its diagnostics' (runs/)

    if type_frac > 0 and rng.random() < type_frac:
        goal, lines, action, thought = synthetic_pages.synthetic_type_page(rng, labels)
    else:
        goal, lines, action, thought = synthetic_pages.synthetic_page(rng, labels, max_elements)
    target = tokenizer.encode(gui.format_response(thought, action), add_special_tokens=False)
    prompt = SimpleNamespace(input_ids=torch.tensor(page_prompt(tokenizer, goal, lines, system)),
                             pixel_values=None, image_grid_thw=None)
    return prompt, target + [tokenizer.convert_tokens_to_ids("<|im_end|>")]


# -----------------------------------------------------------------------------
# the run: processes, data, the model, a resume (main, at the bottom, runs the two training loops)


def setup(cfg: SFTConfig, other: argparse.Namespace, spec: chat.PromptSpec) -> SimpleNamespace:
    """Processes, seeds and the data: one example per (episode, step), split into train and
    validation episodes; prompts are built lazily (images are big). Read and checked before anything
    is written to --out: a run that fails here leaves a finished run's records as they were. Then
    the model (build_model). `other`: LoRA's, the prompt's and --report-to's flags (parse). Returns
    the run's state, which the loops below read."""
    proc = utils.init_distributed(cfg.device)
    utils.seed_everything(cfg.seed)
    if cfg.batch_size % (cfg.micro_batch_size * proc.world_size):
        raise utils.UsageError(f"--batch-size {cfg.batch_size} must be a multiple of "
                               f"micro-batch-size x world size ({cfg.micro_batch_size} x "
                               f"{proc.world_size})")
    blank = gui.parse_size(cfg.blank_screens) if cfg.blank_screens else None
    episodes = dataset.load_episodes(cfg.data, limit=cfg.max_episodes)
    order = list(range(len(episodes)))
    random.Random(cfg.seed).shuffle(order)
    n_val = int(round(len(episodes) * cfg.val_frac)) if len(episodes) > 1 else 0
    val_eps, train_eps = [episodes[i] for i in order[:n_val]], [episodes[i] for i in order[n_val:]]
    train_ex = [(e, t) for e in train_eps for t in range(len(e.steps))]
    val_ex = [(e, t) for e in val_eps for t in range(len(e.steps))]
    per_rank = len(train_ex) // proc.world_size
    if cfg.max_steps > 0 and per_rank < cfg.micro_batch_size:
        raise utils.UsageError(f"the train split has {len(train_ex)} examples ({len(train_eps)} "
                               f"episodes of {cfg.data} after --val-frac {cfg.val_frac:g} held out "
                               f"{len(val_eps)}): {per_rank} per rank on {proc.world_size} "
                               f"rank(s), fewer than --micro-batch-size {cfg.micro_batch_size}; "
                               "lower it or --val-frac, or add data")
    tokenizer, image_processor = vlm.load_processor(cfg.model, min_pixels=spec.min_pixels,
                                                    max_pixels=spec.max_pixels)
    utils.print0(f"{len(train_eps)} train / {len(val_eps)} val episodes, {len(train_ex)} / "
                 f"{len(val_ex)} examples")
    run = SimpleNamespace(cfg=cfg, other=other, proc=proc, gpu=proc.device.type == "cuda",
                          out=Path(cfg.out), spec=spec, blank=blank, train_eps=train_eps,
                          train_ex=train_ex, val_ex=val_ex, tokenizer=tokenizer,
                          image_processor=image_processor, pad_id=pad_token_id(tokenizer))
    build_model(run)
    return run


def build_model(run) -> None:
    """The policy (FSDP2; LoRA adapters with --lora-r) and its optimizer, into `run`; with --resume
    the latest checkpoint in --out; then the first write to --out (args.json) and the metrics file.
    """
    cfg, proc, out = run.cfg, run.proc, run.out
    run.model = model = vlm.load_model(cfg.model, dtype=torch.float32, device=proc.device,
                                       seed=cfg.seed)
    run.adapter = None  # the PeftModel with --lora-r (lora.py, imported only then)
    if cfg.lora_r:
        import lora
        run.adapter = lora.apply_lora(model, cfg, base=cfg.model, seed=cfg.seed)
    if cfg.gradient_checkpointing:
        checkpoint_activations(model)
    run.policy = apply_fsdp(model, PolicyLogProb(model), proc, mixed_precision=run.gpu)
    run.optimizer = utils.adamw(run.policy.parameters(), lr=cfg.lr,
                                weight_decay=cfg.weight_decay)
    run.start_step = 0
    if cfg.resume:
        ckpt = utils.latest_checkpoint(out / "ckpt")
        if ckpt is not None:
            from extras.resume import load_checkpoint_state
            state = load_checkpoint_state(ckpt, run.policy, run.optimizer)
            run.start_step = int(state.get("step", 0))
            utils.print0(f"resumed from {ckpt} at step {run.start_step}")
    # the first write to --out: the flags, the data and a resume's checkpoint are checked by now
    # args.json: every flag's value as the run used it (--preset applied), the prompt contract
    # ("prompt")
    run.record = {**dataclasses.asdict(cfg), **vars(run.other)}
    if proc.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "args.json").write_text(utils.dumps(run.record, indent=2))
    # a resume keeps the rows up to its checkpoint: the redone steps are logged once (trackers too)
    run.metrics = metrics_logger(out / "metrics.jsonl", report_to=cfg.report_to, config=run.record,
                                 resume_step=run.start_step if cfg.resume else None)


def example(run, ep, t: int) -> tuple:
    """sft_example of step t of `ep` under the run's prompt contract."""
    return sft_example(ep, t, run.tokenizer, run.image_processor, run.spec,
                       image_root=run.cfg.image_root,
                       blank_screens=run.blank)


def batches(run, examples, size, seed, split="train"):
    """Endless shuffled micro-batches of this rank's share. Raises utils.UsageError naming the split
    and the sizes when the share holds fewer than `size` examples (it would never yield)."""
    proc = run.proc
    if len(examples[proc.rank::proc.world_size]) < size:
        raise utils.UsageError(f"the {split} split: {len(examples)} examples, "
                               f"{len(examples[proc.rank::proc.world_size])} on rank {proc.rank} "
                               f"of {proc.world_size}, fewer than a micro-batch of {size}")
    epoch = 0
    while True:
        idx = list(range(len(examples)))
        random.Random(seed + epoch).shuffle(idx)
        idx = idx[proc.rank::proc.world_size]
        for i in range(0, len(idx) - size + 1, size):
            yield [examples[j] for j in idx[i:i + size]]
        epoch += 1


def lr_at(cfg, step: int) -> float:
    """The learning rate of `step`: linear warm-up over --warmup-steps, then cosine down to
    --min-lr-frac."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cosine)


def nll(run, built):
    """Summed NLL (fp32 scalar, with grad) and token count of built (prompt, target) pairs."""
    prompts, targets = zip(*built)
    batch = to_device(collate_sequences(list(prompts), list(targets), run.pad_id), run.proc.device)
    logp, _ = run.policy(batch)
    return -logp.sum(), logp.numel()


@torch.no_grad()
def val_loss(run) -> float:
    """Token-mean validation NLL over all ranks (every rank runs the same number of chunks)."""
    cfg, proc, val_ex = run.cfg, run.proc, run.val_ex
    run.policy.eval()
    mine = val_ex[proc.rank::proc.world_size]
    n_chunks = torch.tensor([math.ceil(len(mine) / cfg.micro_batch_size)], dtype=torch.float64)
    if proc.world_size > 1:
        torch.distributed.all_reduce(n_chunks, op=torch.distributed.ReduceOp.MAX)
    tot = torch.zeros(2, dtype=torch.float64)
    for c in range(int(n_chunks.item())):
        chunk = mine[c * cfg.micro_batch_size:(c + 1) * cfg.micro_batch_size]
        loss, n = nll(run, [example(run, e, t) for e, t in (chunk or val_ex[:1])])
        if chunk:
            tot += torch.tensor([loss.item(), n], dtype=torch.float64)
    utils.all_reduce_sum(tot)
    run.policy.train()
    return (tot[0] / tot[1].clamp(min=1)).item() if tot[1] > 0 else float("nan")


# -----------------------------------------------------------------------------
# the two training loops: the copy warm-up (models trained from scratch), then SFT


def copy_warmup(run) -> None:
    """The copy warm-up (module docstring), on a fresh run only: --copy-warmup-steps steps on
    synthetic pages with their own AdamW; with --max-steps 0 its model is the run's checkpoint (a
    base to start from)."""
    cfg, proc, out, policy = run.cfg, run.proc, run.out, run.policy
    warm_steps = cfg.copy_warmup_steps
    if warm_steps <= 0 or run.start_step != 0:
        return
    from extras import synthetic_pages

    labels = synthetic_pages.page_labels(run.train_eps)
    if not labels:
        utils.print0(f"copy warm-up skipped: no element labels in {cfg.data}")
        return
    rng = random.Random(cfg.seed * 1_000_003 + proc.rank)
    digit_ids = set(run.tokenizer.convert_tokens_to_ids(list("0123456789")))
    warm_opt = utils.adamw(policy.parameters(), lr=cfg.copy_warmup_lr,
                           weight_decay=cfg.weight_decay)
    warm_log = utils.MetricsLogger(out / "copy_warmup.jsonl")
    per_rank = max(1, cfg.batch_size // proc.world_size)
    policy.train()
    bar = tqdm(range(warm_steps), desc="copy warm-up", disable=not proc.is_main)
    for step in bar:
        built = [synthetic_example(rng, labels, run.tokenizer,
                                   max_elements=cfg.copy_warmup_elements,
                                   type_frac=cfg.copy_warmup_type_frac,
                                   code_frac=cfg.copy_warmup_code_frac)
                 for _ in range(per_rank)]
        batch = to_device(collate_sequences([p for p, _ in built], [y for _, y in built],
                                            run.pad_id), proc.device)
        logp, _ = policy(batch)
        loss = -logp.mean()
        warm_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        warm_opt.step()
        is_digit = torch.tensor([t in digit_ids for _, y in built for t in y])
        row = torch.tensor([loss.item(), -logp.detach().cpu()[is_digit].mean().item()],
                           dtype=torch.float64) / proc.world_size
        utils.all_reduce_sum(row)
        warm_log.log({"step": step + 1, "loss": row[0].item(), "digit_nll": row[1].item()})
        if step + 1 in cfg.copy_warmup_save_at:  # a shorter warm-up's base, from the same run
            vlm.save_checkpoint(out / "warmup_ckpt", policy, run.tokenizer, run.record,
                                extra={"step": step + 1}, keep=0, adapter=run.adapter)
        bar.set_postfix(loss=f"{row[0].item():.3f}", digits=f"{row[1].item():.3f}")
    utils.print0(f"copy warm-up: {warm_steps} steps, last loss {row[0].item():.3f}, coordinate "
                 f"digits {row[1].item():.3f} nats/token (no copy: ~2.2; log "
                 f"{out / 'copy_warmup.jsonl'})")
    del warm_opt
    # the warm-up alone: a base model that SFT runs start from (--model BASE)
    if cfg.max_steps == 0:
        vlm.save_checkpoint(out / "ckpt", policy, run.tokenizer, run.record, extra={"step": 0},
                            adapter=run.adapter)


def sft(run) -> dict:
    """SFT proper: --max-steps optimizer steps of --batch-size examples (token-mean NLL over the
    global batch, gradient accumulation over micro-batches), a resumed run continuing the same data
    order; validation every --eval-every steps and at the end; checkpoints. Returns the last step's
    metrics."""
    cfg, proc, policy, optimizer = run.cfg, run.proc, run.policy, run.optimizer
    accum = cfg.batch_size // (cfg.micro_batch_size * proc.world_size)
    stream = batches(run, run.train_ex, cfg.micro_batch_size, cfg.seed)
    for _ in range(run.start_step * accum):  # a resumed run continues the same data order
        next(stream)
    last = {}
    policy.train()
    bar = tqdm(range(run.start_step, cfg.max_steps), desc="SFT", disable=not proc.is_main)
    for step in bar:
        t0 = time.time()
        if run.gpu:
            torch.cuda.reset_peak_memory_stats(proc.device)
        for g in optimizer.param_groups:
            g["lr"] = lr_at(cfg, step)
        # build the micro-batches first: the token-mean needs the global target token count
        built = [[example(run, e, t) for e, t in next(stream)] for _ in range(accum)]
        n_tok = torch.tensor([float(sum(len(y) for mb in built for _, y in mb))],
                             dtype=torch.float64)
        utils.all_reduce_sum(n_tok)
        loss_sum, tok_local = 0.0, 0
        optimizer.zero_grad(set_to_none=True)
        for mb in built:
            loss, n = nll(run, mb)
            # FSDP averages gradients over ranks; * world_size makes this the global token mean
            (loss / n_tok.item() * proc.world_size).backward()
            loss_sum += loss.item()
            tok_local += n
        gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        optimizer.step()
        tot = torch.tensor([loss_sum, tok_local], dtype=torch.float64)
        utils.all_reduce_sum(tot)
        dt = time.time() - t0
        last = {"step": step + 1, "loss": (tot[0] / tot[1]).item(), "lr": lr_at(cfg, step),
                "grad_norm": float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn),
                "tokens": int(tot[1].item()), "tok_s": tot[1].item() / dt, "time_s": dt,
                # this rank: the step's (CUDA) or the run's (CPU)
                "peak_mem_bytes": utils.peak_memory_bytes(proc.device)}
        if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or step + 1 == cfg.max_steps:
            last["val_loss"] = val_loss(run)
        run.metrics.log(last)
        bar.set_postfix(loss=f"{last['loss']:.3f}",
                        **({"val": f"{last['val_loss']:.3f}"} if "val_loss" in last else {}))
        if "val_loss" in last:
            utils.print0(f"step {step + 1:5d} | loss {last['loss']:.4f} "
                         f"| val {last['val_loss']:.4f} "
                         f"| lr {last['lr']:.2e} | gnorm {last['grad_norm']:.2f} "
                         f"| {last['tok_s']:.0f} tok/s")
        if step + 1 == cfg.max_steps or (cfg.save_every and (step + 1) % cfg.save_every == 0):
            vlm.save_checkpoint(run.out / "ckpt", policy, run.tokenizer, run.record,
                                optimizer=optimizer, extra={"step": step + 1}, adapter=run.adapter,
                                keep=cfg.keep_checkpoints)
    return last


def finish(run, last: dict) -> None:
    """Close the metrics and the process group; rank 0 merges LoRA adapters (--merge) and prints
    where the checkpoint is, the commands to plot, evaluate and go on with it, and the last row as
    JSON."""
    cfg, out = run.cfg, run.out
    run.metrics.close()
    utils.cleanup_distributed()
    if run.proc.is_main and cfg.merge:  # the adapted model as a plain Hugging Face folder
        from extras.merge import merge_checkpoint
        merged = merge_checkpoint(utils.latest_checkpoint(out / "ckpt"), out / "merged")
        utils.print0(f"merged: {merged}")
    if run.proc.is_main:
        lora_flags = ""
        if cfg.lora_r:  # a LoRA SFT: the RL stage trains adapters too
            import lora
            lora_flags = lora.next_stage_flags(cfg)
        utils.print_next_steps(out, cfg.data, "out/eval/sft",
                               "next stage: torchrun --nproc_per_node=2 train_semionline.py "
                               f"--sft-dir {out / 'ckpt'}" + lora_flags)
        print(utils.dumps(last), flush=True)


def main(argv=None):
    # the typed config (--preset applied); LoRA's, the prompt's, --report-to
    cfg, other = parse(argv)
    if cfg.copy_warmup_steps is None:   # resolved here so that args.json records the number
        cfg.copy_warmup_steps = copy_warmup_default(cfg.model)
    if any(n > cfg.copy_warmup_steps for n in cfg.copy_warmup_save_at):
        raise utils.UsageError(f"--copy-warmup-save-at {list(cfg.copy_warmup_save_at)}: every step "
                               f"must be <= --copy-warmup-steps {cfg.copy_warmup_steps}")
    spec = chat.resolve_spec(other, cfg.model, say=utils.print0)
    if check_lora_args(cfg):
        raise utils.UsageError(check_lora_args(cfg))
    if cfg.resume:  # a LoRA checkpoint's adapters must be this run's: checked before --out is made
        from extras.resume import check_flags
        check_flags(cfg)
    run = setup(cfg, other, spec)
    copy_warmup(run)  # models trained from scratch: copy a point (or a string) first
    last = sft(run)
    finish(run, last)
    return last


if __name__ == "__main__":
    cli.run_script(main)
