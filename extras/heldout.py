"""The RL run's held-out evaluation (train_semionline.py --eval-data; imported only then): greedy
vs sampled static step accuracy and greedy SOP on held-out episodes, logged as heldout_* metrics in
the row "step 0" (the starting model), every --eval-every steps and after the last step.

Why both: the reward sees sampled responses (the sampler's temperature and top-p) while evaluation
runs the greedy policy, and the two can move apart (RL that sharpens the sampled policy towards the
greedy one without moving the greedy one)."""
from __future__ import annotations

import chat
import utils
from rollout import RolloutSpec, semi_online_rollout, sop_progress
from vlm import sampling_mode


def greedy_vs_sampled(sampler, episodes, tokenizer, image_processor,
                      spec: chat.PromptSpec = chat.PromptSpec(), *,
                      samples: int = 4, seed: int = 0, image_root=None, blank_screens=None) -> dict:
    """Walks `episodes` three times with the rollout driver, patch threshold 0: static (the
    expert's history) greedily, static with `samples` samples per step, and SOP (own history,
    greedy). Returns counts (floats, to be summed over ranks): greedy_match, greedy_steps,
    sampled_match, sampled_steps, sop_pg_sum (sum of per-episode progress), sop_solved, episodes."""
    def walk(seed=None, **kw):
        how = RolloutSpec(patch_threshold=0, image_root=image_root, blank_screens=blank_screens,
                          **kw)
        return semi_online_rollout(sampler, episodes, tokenizer, image_processor, how, spec=spec,
                                   seed=seed) if episodes else []
    greedy = walk(n_rollouts=1, greedy=True, history_mode="expert")
    sampled = walk(n_rollouts=samples, greedy=False, history_mode="expert", seed=seed)
    sop = sop_progress(walk(n_rollouts=1, greedy=True, history_mode="own"),
                       {k: len(e.steps) for k, e in enumerate(episodes)})
    return {"greedy_match": float(sum(r.match for r in greedy)), "greedy_steps": float(len(greedy)),
            "sampled_match": float(sum(r.match for r in sampled)),
            "sampled_steps": float(len(sampled)),
            "sop_pg_sum": float(sum(c / n for c, n in sop.values())),
            "sop_solved": float(sum(c == n for c, n in sop.values())),
            "episodes": float(len(sop))}


def evaluate_heldout(run, step: int) -> dict:
    """The heldout_* metrics after `step` steps when an evaluation is due (step 0, every
    --eval-every steps, the last step), else {}: greedy_vs_sampled on this rank's share of
    run.heldout, summed over ranks. run: train_semionline.setup's state."""
    cfg, proc = run.cfg, run.proc
    if not (step == 0 or (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.max_steps):
        return {}
    with sampling_mode(run.policy):
        counts = greedy_vs_sampled(run.sampler, run.heldout[proc.rank::proc.world_size],
                                   run.tokenizer, run.image_processor, run.spec,
                                   samples=cfg.eval_samples, seed=cfg.seed + step,
                                   image_root=cfg.image_root,
                                   blank_screens=cfg.blank_screens)
    total = dict(zip(counts, utils.all_sum(list(counts.values()), proc)))
    return {"heldout_greedy_step_acc": total["greedy_match"] / max(total["greedy_steps"], 1),
            "heldout_sampled_step_acc": total["sampled_match"] / max(total["sampled_steps"], 1),
            "heldout_sop_pg": total["sop_pg_sum"] / max(total["episodes"], 1),
            "heldout_sop_tsr": total["sop_solved"] / max(total["episodes"], 1),
            "heldout_episodes": int(total["episodes"])}
