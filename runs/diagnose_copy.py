"""Why a small model trained from scratch clicks in the wrong place: does it copy coordinates?

On MiniWob++ with the element list in the prompt, a correct click is a copy: the element line
says `[5] button 'okay' at (24,73)`, the expert thought says `Click button 'okay' at (24,73).` and
the action repeats the point. This script measures, teacher-forced, how well a checkpoint
predicts those digits (the rest of the response is template, action type and label):

    python runs/diagnose_copy.py digits out/sft/ckpt
        mean NLL per token (nats) over the first step of the test file's click episodes, split into
        the thought's coordinate digits, the action's coordinate digits and every other response
        token. A uniform guess over 0-9 is ln 10 = 2.30 nats; a model that copies is near 0.

    python runs/diagnose_copy.py sanity --lr 1e-3 --steps 300
        the copy skill alone, text only: the same tiny model learns to repeat 4 random digits
        written 20-50 tokens earlier (`at (ab,cd) <filler> answer: [` -> `ab, cd]`), batch 8,
        AdamW with the given lr, the loss through PolicyLogProb as in train_sft.py; prints the training loss every 25 steps. The loss of a model
        that does not copy stays near 4 x 2.30 / 7 = 1.3 nats per target token.

The last stdout line is one strict-JSON object with the figures.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import cli  # noqa: E402
import gui  # noqa: E402
import utils  # noqa: E402
from kernels.policy_logprob import PolicyLogProb, collate_sequences, pad_token_id  # noqa: E402


def digit_nll(model_name: str, data: str, max_episodes: int = 40, batch: int = 8) -> dict:
    """Teacher-forced NLL (nats per token, fp64 means) of the expert response at step 0 of each
    click episode among the first max_episodes of `data`, with the prompt the trainer builds
    (element list on, default pixel limits). Returns {"thought_digits", "action_digits", "other",
    "n_tokens" (per group), "n_episodes"}; the coordinate digits are split by order: the first half of the response's
    digit tokens belong to the thought, the rest to the action. Raises ValueError when the file
    has no click episode."""
    model = utils.load_model(model_name)
    policy = PolicyLogProb(model).eval()
    tokenizer, image_processor = utils.load_processor()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    digits = set(tokenizer.convert_tokens_to_ids(list("0123456789")))
    rows = []
    for ep in gui.load_episodes(data, limit=max_episodes):
        step = ep.steps[0]
        if step.action.get("action") != "click":
            continue
        prompt = gui.build_prompt(tokenizer, image_processor, goal=ep.goal, screenshots=[gui.load_screenshot(step)],
                                  history=[], elements=step.elements)
        target = gui.expert_response(step, gui.original_size(step), thought=step.thought)
        rows.append((prompt, tokenizer(target, add_special_tokens=False)["input_ids"] + [im_end]))
    if not rows:
        raise ValueError(f"{data}: no episode starting with a click among the first {max_episodes}")
    nll = {"thought_digits": [], "action_digits": [], "other": []}
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            chunk = rows[i:i + batch]
            logp, _ = policy(collate_sequences([p for p, _ in chunk], [y for _, y in chunk], pad_token_id(tokenizer)))
            start = 0
            for _, y in chunk:
                lp = logp[start:start + len(y)].tolist()  # (len(y),) log-probs of this response
                start += len(y)
                pos = [j for j, t in enumerate(y) if t in digits]
                thought = set(pos[:len(pos) // 2])
                for j, v in enumerate(lp):
                    key = "thought_digits" if j in thought else "action_digits" if j in pos else "other"
                    nll[key].append(-v)
    out = {k: sum(v) / len(v) if v else None for k, v in nll.items()}
    out["n_tokens"] = {k: len(v) for k, v in nll.items()}
    out["n_episodes"] = len(rows)
    return out


def copy_sanity(model_name: str = "tiny:128x4", lr: float = 1e-3, steps: int = 300, seed: int = 0) -> dict:
    """Train `model_name` (fresh, seed `seed`) on the text-only copy task of the module docstring
    with AdamW(lr, weight decay 0.01), grad-norm clip 1.0, batch 8, for `steps` steps. Returns
    {"loss": [loss every 25 steps and the last], "steps", "lr"} (mean NLL per target token,
    nats)."""
    rng = random.Random(seed)
    model = utils.load_model(model_name, seed=seed)
    policy = PolicyLogProb(model).train()
    tokenizer, _ = utils.load_processor()
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    filler = enc("the quick brown fox jumps over the lazy dog " * 6)
    pad = pad_token_id(tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    curve = []
    for step in range(steps):
        batch = []
        for _ in range(8):
            d = [rng.randint(0, 9) for _ in range(4)]
            prompt = enc(f"at ({d[0]}{d[1]},{d[2]}{d[3]})") + filler[:rng.randint(20, 50)] + enc(" answer: [")
            batch.append((prompt, enc(f"{d[0]}{d[1]}, {d[2]}{d[3]}]")))
        prompts = [SimpleNamespace(input_ids=torch.tensor(p), pixel_values=None, image_grid_thw=None) for p, _ in batch]
        logp, _ = policy(collate_sequences(prompts, [y for _, y in batch], pad))  # the SFT loss path
        loss = -logp.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == steps - 1:
            curve.append([step, loss.item()])
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    return {"loss": curve, "steps": steps, "lr": lr}


parser = cli.make_parser(__doc__)
sub = parser.add_subparsers(dest="cmd", required=True)
p_digits = sub.add_parser("digits", help="coordinate-digit NLL of a checkpoint")
p_digits.add_argument("model", type=cli.arg_type(cli.model_path), help="checkpoint folder, 'tiny' or 'tiny:HxL'")
p_digits.add_argument("--data", default="data/miniwob_click/test.jsonl", type=cli.arg_type(cli.input_file),
                      help="episodes whose step-0 clicks are scored")
p_digits.add_argument("--max-episodes", type=int, default=40, help="episodes read from --data")
p_sanity = sub.add_parser("sanity", help="the copy task alone, text only")
p_sanity.add_argument("--model", default="tiny:128x4", type=cli.arg_type(cli.model_path), help="'tiny:HxL' (trained from scratch)")
p_sanity.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
p_sanity.add_argument("--steps", type=int, default=300, help="optimizer steps of 8 sequences")
p_sanity.add_argument("--seed", type=int, default=0, help="seed of the data and the init")


def main(argv=None):
    args = parser.parse_args(argv)
    if args.cmd == "digits":
        out = digit_nll(args.model, args.data, args.max_episodes)
    else:
        out = copy_sanity(args.model, args.lr, args.steps, args.seed)
    print(cli.dumps({"cmd": args.cmd, **{k: v for k, v in vars(args).items() if k != "cmd"}, **out}))


if __name__ == "__main__":
    cli.cli(main)
