"""A tiny Qwen2.5-VL whose semi-online rollouts earn varying rewards (not a test module).

`make_checkpoint` fits a randomly initialised tiny model, in process, to the expert response at step 0
of the first 2 MiniWob++ episodes (short thought + action, ~32 tokens, in the prompt the rollout
builds at --max-pixels 20000), with full-batch Adam (80 steps: ~0.03 nats per token). Sampled at
temperature 1 with >= 40 new tokens, its rollouts of those episodes sometimes match and sometimes not
(kept by dynamic sampling), while episodes it was not fitted to earn 0 everywhere (dropped, refilled).
"""
from pathlib import Path

import torch

import chat
import dataset
import gui
import utils
import vlm

REPO = Path(__file__).resolve().parents[1]


def make_checkpoint(out, n_episodes=2, steps=80, lr=5e-3, max_pixels=20000, seed=0):
    tok, ip = vlm.load_processor(max_pixels=max_pixels)
    eps = dataset.load_episodes(REPO / "data" / "miniwob" / "train.jsonl", limit=n_episodes)
    prompts, responses = [], []
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    for ep in eps:
        shot = dataset.load_screenshot(ep.steps[0])
        # the prompt semi_online_rollout builds at step 0 (the full system prompt: --system-prompt full)
        p = chat.step_prompt(tok, ip, chat.PromptSpec(max_pixels=max_pixels), goal=ep.goal, step=ep.steps[0],
                             screenshots=[shot], history=[])
        action = gui.scale_action(ep.steps[0].action, shot.size, p.resized_size)
        prompts.append(p)
        responses.append(tok(gui.format_response("I click it.", action)).input_ids + [stop])
    batch = vlm.collate_sequences(prompts, responses, tok.pad_token_id)
    model = vlm.load_model("tiny", seed=seed)
    policy = vlm.PolicyLogProb(model)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    for _ in range(steps):
        logp, _ = policy(batch)  # (N,) over every response token
        loss = -logp.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    vlm.save_checkpoint(out, model, tok, {"made_by": "tests/rl_checkpoint.py"}, extra={"step": steps})
    return utils.latest_checkpoint(out), loss.item()


if __name__ == "__main__":
    import sys
    import time
    t = time.time()
    print(make_checkpoint(sys.argv[1], steps=int(sys.argv[2])), time.time() - t)
