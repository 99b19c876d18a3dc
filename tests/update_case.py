"""A PPO update case shared by tests/test_train_update.py and its torchrun worker (not a test module).

Real records (a tiny Qwen2.5-VL rolled through two MiniWob++ episodes, so prompts carry images and
3-D mrope positions), given NON-ZERO advantages of both signs and old / reference log-probs moved
away from the policy's, so the PPO clip, the dual clip and the k3 KL are all active. `reference_grads`
is an independent autograd computation of the same objective: one sequence at a time, no padding,
logits through lm_head + log_softmax (not the fused kernel), the per-token loss written out from the
paper's formulas, the aggregation over the whole mini-batch written out directly.
"""
from pathlib import Path

import torch

import chat
import dataset
import vlm
from rollout import RolloutSpec, semi_online_rollout
from sampler import Sampler
from train_semionline import TrainItem

REPO = Path(__file__).resolve().parents[1]
ARGV = ["--clip-low", "0.2", "--clip-high", "0.25", "--clip-c", "3.0", "--kl-coef", "0.3", "--grad-clip", "1e9",
        "--temperature", "1.0"]


def make_records(model):
    """The trainer's items (train_semionline.TrainItem) of 2 tasks x 3 rollouts (6-token responses),
    with adv, old_logp, ref_logp set."""
    tok, ip = vlm.load_processor(max_pixels=20000)
    eps = dataset.load_episodes(REPO / "data" / "miniwob" / "train.jsonl", limit=2)
    sampler = Sampler(model, tok, max_new_tokens=6, temperature=1.0)
    with torch.no_grad():
        recs = semi_online_rollout(sampler, eps, tok, ip, RolloutSpec(n_rollouts=3, patch_threshold=1), seed=[11, 12],
                                   spec=chat.PromptSpec(max_pixels=20000))
    g = torch.Generator().manual_seed(5)
    pol = vlm.PolicyLogProb(model)
    items = []
    for j, rec in enumerate(recs):
        r = TrainItem(rec, adv=(1.0 + j % 3) * (1.0 if j % 2 else -1.0))  # non-zero, both signs, several sizes
        items.append(r)
        with torch.no_grad():
            logp, _ = pol(vlm.collate_sequences([r.prompt], [r.response_ids], tok.pad_token_id))
        # old: up to +-0.6 nats away, so ratios leave [1 - 0.2, 1 + 0.25] and the dual clip (ratio > 3) fires
        r.old_logp = logp + (torch.rand(len(logp), generator=g) * 2.4 - 1.2)
        r.ref_logp = logp + (torch.rand(len(logp), generator=g) - 0.5)
    return items, tok.pad_token_id


def reference_loss(model, records, args):
    """The mini-batch objective, built independently of train_semionline (see module docstring)."""
    per_seq = []
    for r in records:
        p = r.prompt
        ids = torch.cat([p.input_ids.long(), torch.tensor(r.response_ids)])[None]  # (1, T)
        out = model.model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=p.pixel_values,
                          image_grid_thw=p.image_grid_thw,
                          mm_token_type_ids=(ids == model.config.image_token_id).int(), use_cache=False)
        P, L = len(p.input_ids), len(r.response_ids)
        h = out.last_hidden_state[0, P - 1:P - 1 + L]  # (L, H): the positions that predict the response
        logp = torch.log_softmax(model.lm_head(h).float() / args.temperature, -1)  # (L, V)
        logp = logp.gather(1, torch.tensor(r.response_ids)[:, None])[:, 0]  # (L,)
        A = torch.full_like(logp, r.adv)
        ratio = torch.exp(torch.clamp(logp - r.old_logp, -20, 20))
        pg = torch.maximum(-A * ratio, -A * torch.clamp(ratio, 1 - args.clip_low, 1 + args.clip_high))
        pg = torch.where(A < 0, torch.minimum(pg, -A * args.clip_c), pg)
        dlt = r.ref_logp - logp
        kl = torch.clamp(torch.exp(dlt) - dlt - 1, -10, 10)
        per_seq.append(pg + args.kl_coef * kl)  # (L,)
    if args.loss_agg == "token-mean":
        return torch.cat(per_seq).sum() / sum(len(x) for x in per_seq)
    if args.loss_agg == "seq-mean-token-mean":
        return sum(x.mean() for x in per_seq) / len(per_seq)
    if args.loss_agg == "dr-grpo":  # Dr.GRPO: token sums over (sequences x the generation budget)
        return sum(x.sum() for x in per_seq) / (len(per_seq) * args.max_new_tokens)
    return sum(x.sum() for x in per_seq) / len(per_seq)


def reference_grads(model, records, args) -> dict:
    model.zero_grad(set_to_none=True)
    reference_loss(model, records, args).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
