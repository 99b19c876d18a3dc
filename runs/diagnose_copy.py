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
        that does not copy stays near 4 x 2.30 / 7 = 1.3 nats per target token. The digits sit at
        the start of the prompt, so a head can find them by position: no induction needed.

    python runs/diagnose_copy.py pages --elements 1 --lr 1e-3 --steps 150
        the click copy in the product's layout, text only: system prompt, a goal naming one
        element of a synthetic page of 1..--elements lines (`[k] type 'label' at (x,y) (box)`,
        labels from the training data), the expert thought and action as the target; fresh pages
        every step. Prints the NLL of the coordinate digits and of the other response tokens
        every 25 steps. Copying here needs an induction head (match ` at (` in the response with
        the same in the prompt, repeat what follows). --init CKPT starts from a checkpoint,
        --untie unties the tied embedding, --no-system drops the system prompt, --mix-induction K
        adds K repeated random-token sequences to every batch.

    python runs/diagnose_copy.py induction --steps 300 --save DIR
        repeated random tokens (24 ids below --vocab 2000, then the same 24): the classic task on
        which induction heads form; loss on the repeat every 25 steps (ln V / 24 once copied: the
        first token cannot be guessed). --vocab 30 (punctuation and digits) makes one token of
        context ambiguous, as digits are in a prompt.

    python runs/diagnose_copy.py embeddings CKPT
        the tied embedding's geometry: pairwise cosine of the ten digit embeddings, mean row
        norm and the norm of the mean row (a matrix whose rows share one direction has the two
        close). --save DIR (sanity, pages, induction) writes the trained model.

The last stdout line is one strict-JSON object with the figures.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import chat
import cli  # noqa: E402
import utils  # noqa: E402
import dataset
import gui  # noqa: E402
import train_sft  # noqa: E402 -- the copy warm-up's synthetic examples
import vlm
from extras import synthetic_pages  # noqa: E402
from vlm import PolicyLogProb, collate_sequences, pad_token_id  # noqa: E402


def digit_nll(model_name: str, data: str, max_episodes: int = 40, batch: int = 8) -> dict:
    """Teacher-forced NLL (nats per token, fp64 means) of the expert response at step 0 of each
    click episode among the first max_episodes of `data`, with the prompt the trainer builds
    (element list on, default pixel limits). Returns {"thought_digits", "action_digits", "other",
    "n_tokens" (per group), "n_episodes"}; the coordinate digits are split by order: the first half of the response's
    digit tokens belong to the thought, the rest to the action. Raises ValueError when the file
    has no click episode."""
    model = vlm.load_model(model_name)
    policy = PolicyLogProb(model).eval()
    tokenizer, image_processor = vlm.load_processor(model_name)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    digits = set(tokenizer.convert_tokens_to_ids(list("0123456789")))
    rows = []
    for ep in dataset.load_episodes(data, limit=max_episodes):
        step = ep.steps[0]
        if step.action.get("action") != "click":
            continue
        spec = chat.PromptSpec(**{**chat.fresh_defaults(model_name), **chat.checkpoint_spec(model_name)})
        prompt = chat.step_prompt(tokenizer, image_processor, spec, goal=ep.goal, step=step,
                                  screenshots=[dataset.load_screenshot(step)], history=[])
        target = gui.expert_response(step, dataset.original_size(step), thought=step.thought)
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


def _train(model, make_batch, steps: int, lr: float, score=None) -> list:
    """AdamW(lr, weight decay 0.01), grad-norm clip 1.0, the loss through PolicyLogProb and
    collate_sequences as in train_sft.py. make_batch() -> [(prompt ids, target ids)]; score(logp,
    batch) -> dict of extra means to log. Returns [[step, {"loss": .., **score}] every 25 steps and
    the last] (nats per target token; the score groups averaged over the 25 steps before)."""
    policy = PolicyLogProb(model).train()
    tokenizer, _ = vlm.load_processor("tiny")  # its pad id (the tiny presets share one tokenizer)
    pad = pad_token_id(tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    curve, acc = [], {}
    for step in range(steps):
        batch = make_batch()
        prompts = [SimpleNamespace(input_ids=torch.tensor(p), pixel_values=None, image_grid_thw=None) for p, _ in batch]
        logp, _ = policy(collate_sequences(prompts, [y for _, y in batch], pad))  # the SFT loss path
        loss = -logp.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for k, v in (score(logp.detach(), batch) if score else {}).items():
            acc.setdefault(k, []).extend(v)
        if step % 25 == 0 or step == steps - 1:
            row = {"loss": loss.item(), **{k: sum(v) / len(v) for k, v in acc.items() if v}}
            curve.append([step, row])
            acc = {}
            print(f"step {step}: " + " ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    return curve


def _fresh(model_name: str, seed: int, untie: bool = False):
    """load_model(model_name, seed=seed); with untie, a 'tiny' model gets its own lm_head (a copy
    of the embedding at init)."""
    model = vlm.load_model(model_name, seed=seed)
    if untie and model.lm_head.weight is model.get_input_embeddings().weight:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        model.config.tie_word_embeddings = False
        model.config.get_text_config().tie_word_embeddings = False
    return model


def copy_sanity(model_name: str = "tiny:128x4", lr: float = 1e-3, steps: int = 300, seed: int = 0,
                save: str | None = None) -> dict:
    """Train `model_name` (seed `seed`) on the text-only copy task of the module docstring, batch 8,
    for `steps` steps (_train). Returns {"loss": [[step, loss]] every 25 steps and the last,
    "steps", "lr"} (mean NLL per target token, nats); save: write the model there."""
    rng = random.Random(seed)
    model = _fresh(model_name, seed)
    tokenizer, _ = vlm.load_processor(model_name)
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    filler = enc("the quick brown fox jumps over the lazy dog " * 6)

    def make_batch():
        batch = []
        for _ in range(8):
            d = [rng.randint(0, 9) for _ in range(4)]
            prompt = enc(f"at ({d[0]}{d[1]},{d[2]}{d[3]})") + filler[:rng.randint(20, 50)] + enc(" answer: [")
            batch.append((prompt, enc(f"{d[0]}{d[1]}, {d[2]}{d[3]}]")))
        return batch

    curve = _train(model, make_batch, steps, lr)
    if save:
        model.save_pretrained(save)
    return {"loss": [[s, r["loss"]] for s, r in curve], "steps": steps, "lr": lr}


def _induction_rows(rng: random.Random, k: int, length: int = 24, vocab: int = 2000) -> list:
    """k (prompt, target) pairs: `length` random ids below `vocab`, then the same ids as target."""
    rows = []
    for _ in range(k):
        q = [rng.randrange(vocab) for _ in range(length)]
        rows.append((q, list(q)))
    return rows


def induction(model_name: str = "tiny:128x4", lr: float = 1e-3, steps: int = 300, seed: int = 0,
              save: str | None = None, vocab: int = 2000) -> dict:
    """Train on repeated random tokens (_induction_rows over ids below `vocab`, batch 8). With a
    small vocab (e.g. 30: punctuation and digits) one token of context is ambiguous, so copying
    needs a longer prefix match. Returns {"loss": [[step, loss]], "steps", "lr"}; save: write the
    model there."""
    rng = random.Random(seed)
    model = _fresh(model_name, seed)
    curve = _train(model, lambda: _induction_rows(rng, 8, vocab=vocab), steps, lr)
    if save:
        model.save_pretrained(save)
    return {"loss": [[s, r["loss"]] for s, r in curve], "steps": steps, "lr": lr}


def pages(model_name: str = "tiny:128x4", lr: float = 1e-3, steps: int = 150, seed: int = 0, *,
          elements: int = 1, data: str = "data/miniwob_click/train.jsonl", untie: bool = False,
          system: bool = True, mix_induction: int = 0, save: str | None = None) -> dict:
    """Train on synthetic pages (train_sft.synthetic_example, as the SFT copy warm-up but with a
    choice of page size and system prompt; batch 8 + mix_induction repeated
    random-token rows). Returns {"curve": [[step, {"loss", "digits", "other"}]], "steps", "lr"}:
    digits / other = mean NLL of the page rows' coordinate-digit tokens / remaining response
    tokens over the 25 steps before each entry; save: write the model there."""
    rng = random.Random(seed)
    labels = synthetic_pages.page_labels(dataset.load_episodes(data))
    if not labels:
        raise ValueError(f"{data}: no element labels")
    model = _fresh(model_name, seed, untie)
    tokenizer, _ = vlm.load_processor(model_name)
    digit_ids = set(tokenizer.convert_tokens_to_ids(list("0123456789")))

    def make_batch():
        batch = []
        for _ in range(8):
            prompt, target = train_sft.synthetic_example(rng, labels, tokenizer, max_elements=elements, system=system)
            batch.append((prompt.input_ids.tolist(), target))
        return batch + _induction_rows(rng, mix_induction)

    def score(logp, batch):
        ids = [t for _, y in batch[:8] for t in y]
        lp = logp[:len(ids)].tolist()
        return {"digits": [-v for v, t in zip(lp, ids) if t in digit_ids],
                "other": [-v for v, t in zip(lp, ids) if t not in digit_ids]}

    curve = _train(model, make_batch, steps, lr, score)
    if save:
        model.save_pretrained(save)
    return {"curve": curve, "steps": steps, "lr": lr}


def embeddings(model_name: str) -> dict:
    """Geometry of the input embedding E (V, H): {"digit_cos_mean", "digit_cos_min"} over the 45
    pairs of digit tokens 0-9, "row_norm" (mean |E_v|), "mean_row_norm" (|mean_v E_v|) and
    "digit_cos_to_mean_row" (mean over digits)."""
    model = vlm.load_model(model_name)
    tokenizer, _ = vlm.load_processor(model_name)
    E = model.get_input_embeddings().weight.detach().double()
    D = E[tokenizer.convert_tokens_to_ids(list("0123456789"))]
    unit = torch.nn.functional.normalize(D, dim=-1)
    cos = (unit @ unit.T)[~torch.eye(10, dtype=torch.bool)]
    mean_row = E.mean(0)
    return {"digit_cos_mean": cos.mean().item(), "digit_cos_min": cos.min().item(),
            "row_norm": E.norm(dim=-1).mean().item(), "mean_row_norm": mean_row.norm().item(),
            "digit_cos_to_mean_row": torch.nn.functional.cosine_similarity(D, mean_row[None]).mean().item()}


parser = cli.make_parser(__doc__)
sub = parser.add_subparsers(dest="cmd", required=True)
p_digits = sub.add_parser("digits", help="coordinate-digit NLL of a checkpoint", formatter_class=cli.HelpFormatter)
p_digits.add_argument("model", type=cli.arg_type(vlm.model_path), help="checkpoint folder, 'tiny' or 'tiny:HxL'")
p_digits.add_argument("--data", default="data/miniwob_click/test.jsonl", type=cli.arg_type(cli.input_file),
                      help="episodes whose step-0 clicks are scored")
p_digits.add_argument("--max-episodes", type=cli.positive_int, default=40, help="episodes read from --data")
p_emb = sub.add_parser("embeddings", help="digit-embedding cosines and the shared row direction of a checkpoint", formatter_class=cli.HelpFormatter)
p_emb.add_argument("model", type=cli.arg_type(vlm.model_path), help="checkpoint folder, 'tiny' or 'tiny:HxL'")
trainers = {}
for name, fn, steps, help_ in (("sanity", copy_sanity, 300, "the position copy alone, text only"),
                               ("pages", pages, 150, "the click copy on synthetic pages in the product's layout"),
                               ("induction", induction, 300, "repeated random tokens")):
    p = sub.add_parser(name, help=help_, formatter_class=cli.HelpFormatter)
    p.add_argument("--model", default="tiny:128x4", type=cli.arg_type(vlm.model_path),
                   help="'tiny:HxL' (trained from scratch) or a checkpoint folder to start from")
    p.add_argument("--lr", type=cli.positive_float, default=1e-3, help="AdamW learning rate")
    p.add_argument("--steps", type=cli.positive_int, default=steps, help="optimizer steps of 8 sequences")
    p.add_argument("--seed", type=cli.non_negative_int, default=0, help="seed of the data and the init")
    p.add_argument("--save", default=None, help="write the trained model to this folder")
    trainers[name] = (fn, p)
p_pages = trainers["pages"][1]
p_pages.add_argument("--elements", type=cli.positive_int, default=1, help="element lines per page: 1..N")
p_pages.add_argument("--data", default="data/miniwob_click/train.jsonl", type=cli.arg_type(cli.input_file),
                     help="episodes whose element labels the pages use")
p_pages.add_argument("--untie", action="store_true", help="give the model its own lm_head")
p_pages.add_argument("--no-system", dest="system", action="store_false", help="empty system prompt")
trainers["induction"][1].add_argument("--vocab", type=cli.positive_int, default=2000, help="token ids below this are drawn")
p_pages.add_argument("--mix-induction", type=cli.non_negative_int, default=0, help="repeated random-token rows added to each batch (0: none)")


def main(argv=None):
    args = parser.parse_args(argv)
    if args.cmd == "digits":
        out = digit_nll(args.model, args.data, args.max_episodes)
    elif args.cmd == "embeddings":
        out = embeddings(args.model)
    elif args.cmd == "pages":
        if args.elements < 1:
            parser.error("--elements must be >= 1")
        out = pages(args.model, args.lr, args.steps, args.seed, elements=args.elements, data=args.data,
                    untie=args.untie, system=args.system, mix_induction=args.mix_induction, save=args.save)
    elif args.cmd == "induction":
        if args.vocab < 2:
            parser.error("--vocab must be >= 2")
        out = induction(args.model, args.lr, args.steps, args.seed, save=args.save, vocab=args.vocab)
    else:
        out = copy_sanity(args.model, args.lr, args.steps, args.seed, save=args.save)
    print(utils.dumps({"cmd": args.cmd, **{k: v for k, v in vars(args).items() if k != "cmd"}, **out}))


if __name__ == "__main__":
    cli.run_script(main)
