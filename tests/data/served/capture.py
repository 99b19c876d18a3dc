"""Capture a real server's chat-completion answers beside the in-process model's (not a test module).

Walks the first --limit episodes of --data with the expert's history (eval_sop's static walk: every
step is prompted) and, for each prompt, asks both the in-process checkpoint (sampler.Sampler, greedy)
and the server (the body evaluation.served.ServedSampler posts, --action-format uis1, temperature 0).
Writes one JSON file per prompt: the request's shape (messages with images shortened to their size),
the server's whole JSON answer as it came, and the in-process text. The walk follows the in-process text.

    python tests/data/served/capture.py --base-url http://127.0.0.1:PORT/v1 --served-model NAME \
        --model out/sft/ckpt --data data/miniwob_click/test.jsonl --limit 4 --tag auto --out tests/data/served
"""
import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import chat  # noqa: E402
import dataset  # noqa: E402
import policies  # noqa: E402
from evaluation.served import openai_messages  # noqa: E402
import vlm  # noqa: E402
from rollout import RolloutSpec, semi_online_rollout  # noqa: E402
from sampler import Sampler  # noqa: E402


def shorten(messages: list) -> list:
    """The request's messages with each data URL replaced by a short note (the fixture stays small)."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [{"type": "image_url",
                        "image_url": {"url": f"data:image/png;base64,... ({len(c['image_url']['url'])} chars)"}}
                       if c["type"] == "image_url" else c for c in content]
        out.append({**m, "content": content})
    return out


class Recorder:
    """A sampler for the rollout driver: the in-process answer drives the walk, the server's is recorded."""

    def __init__(self, inproc, base_url: str, model: str, max_new_tokens: int):
        self.inproc, self.url = inproc, base_url.rstrip("/") + "/chat/completions"
        self.model, self.max_new_tokens = model, max_new_tokens
        self.pairs = []

    def post(self, prompt) -> dict:
        body = {"model": self.model, "max_tokens": self.max_new_tokens, "temperature": 0.0,
                "messages": openai_messages(prompt.messages, policies.ADAPTERS["uis1"], prompt.resized_size)}
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return {"request": {**body, "messages": shorten(body["messages"])}, "response": json.loads(r.read())}

    def generate(self, prompts, n=1, greedy=True, seeds=None):
        outs = self.inproc.generate(prompts, n=n, greedy=True)
        for p, o in zip(prompts, outs):
            self.pairs.append({**self.post(p), "in_process_text": o[0].text, "resized_size": list(p.resized_size)})
        return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--served-model", required=True)
    ap.add_argument("--model", required=True,
                    help="the checkpoint the server serves (its args.json: the prompt contract)")
    ap.add_argument("--data", required=True)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tag", required=True, help="names the files: {tag}_{k:02d}.json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ckpt = vlm.model_path(args.model)
    spec = chat.resolve_spec(argparse.Namespace(), ckpt)
    tok, ip = vlm.load_processor(ckpt, min_pixels=spec.min_pixels, max_pixels=spec.max_pixels)
    model = vlm.load_model(ckpt, device="cpu").eval()
    rec = Recorder(Sampler(model, tok, max_new_tokens=args.max_new_tokens), args.base_url, args.served_model,
                   args.max_new_tokens)
    episodes = dataset.load_episodes(args.data, limit=args.limit)
    with vlm.sampling_mode(model):
        semi_online_rollout(rec, episodes, tok, ip, RolloutSpec(n_rollouts=1, patch_threshold=0, history_mode="expert",
                                                                greedy=True), spec=spec)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for k, pair in enumerate(rec.pairs):
        (Path(args.out) / f"{args.tag}_{k:02d}.json").write_text(json.dumps(pair, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(rec.pairs)} answers written to {args.out}/{args.tag}_*.json")


if __name__ == "__main__":
    main()
