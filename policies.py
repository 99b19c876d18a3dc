"""Policies eval_sop.py can score besides the in-process model: a model served behind any
OpenAI-compatible chat-completions endpoint (`vllm serve`, `transformers serve`, SGLang, a hosted
API), and the model-family adapters that translate between the evaluator's action format and each
family's own (`--action-format`).

The served policy is a sampler of the rollout driver (rollout.semi_online_rollout), as sampler.Sampler is:
it gets the chat.Prompt the in-process model would get (the prompt contract, chat.PromptSpec) and
sends its messages, each screenshot as a PNG data URL of the RESIZED image (smart_resize under the
contract's pixel limits; a Qwen2.5-VL server leaves such an image as it is, so the model sees the
pixels and the coordinate frame an in-process model sees). The answer is translated by the adapter
into the evaluator's response format (`<think>..</think><action>{json}</action>`, pixels of the
resized screenshot), which reward.score_response then judges like any response.

The families' adapters (ADAPTERS: system prompt, parser, writer; qwen25vl, uitars, uitars15, agentcpm,
uis1) are evaluation/families.py: earlier turns of the history (the evaluator's format) are rewritten into
the family's, in the current screenshot's frame.

The client (evaluation/served.py: ServedSampler, answer_text): the answer is read back from the
server's message as the model wrote it (a think block a server moved to `reasoning_content`, tool calls
moved to `tool_calls`), each request is bounded by --timeout in all and retried on a network error or
HTTP 429/5xx with capped backoff; a request that fails after its retries, or an answer the server's
filter withheld, is a wrong step whose episode records the server's error (never a malformed answer); an
answer the adapter cannot parse is passed on unparsed, a malformed and so wrong step. Every raw answer and
the server's message are kept for `eval_sop.py score --action-format` to re-score offline.

Also here: the trivial policies that never look at the screen (trivial_policies, run_baselines: the floor every
figure of eval_sop.py is printed beside), and eval_sop's flags of the served policy and its step protocols by name (NAMED_PROTOCOLS: the
static walk under evaluation/protocols.py's androidcontrol or aitw rules).
"""
from __future__ import annotations

import os
import random
import sys
from collections import Counter
from dataclasses import dataclass

import cli
import utils
import dataset
import gui
import reward
from evaluation import protocols
from evaluation.families import ADAPTERS
from evaluation.metrics import sop_metrics
from evaluation.served import ServedSampler


# -----------------------------------------------------------------------------
# the prompt of a policy that never reads one (eval_sop.ExpertSampler, the expert replay)

@dataclass
class StepPrompt:
    """What the rollout driver hands a sampler whose prompt_builder is StepPrompts, instead of a
    chat.Prompt: the step to act on and the sizes (W, H), orig_size of the screenshot, resized_size
    as the model would see it (gui.resized_size under the contract's min/max_pixels)."""
    step: dataset.Step
    step_idx: int
    orig_size: tuple[int, int]
    resized_size: tuple[int, int]


class StepPrompts:
    """A sampler's `prompt_builder` (rollout.semi_online_rollout) when it never reads its prompt: a
    StepPrompt per (task k, step t), no tokens built and no screenshot decoded."""

    def __init__(self, episodes, tokenizer, image_processor, spec, image_root, blank_screens):
        self.episodes, self.spec, self.image_root, self.blank_screens = episodes, spec, image_root, blank_screens

    def __call__(self, k: int, t: int, history, hint=None) -> StepPrompt:
        step = self.episodes[k].steps[t]
        orig = dataset.original_size(step, image_root=self.image_root, blank_screens=self.blank_screens)
        return StepPrompt(step, t, orig, gui.resized_size(orig, min_pixels=self.spec.min_pixels,
                                                          max_pixels=self.spec.max_pixels))


# -----------------------------------------------------------------------------
# trivial policies: what a policy that never looks at the screen scores under the match rules
# (docs/method.md §4); every figure of eval_sop.py is printed beside this floor (eval_sop.py baselines)


def trivial_policies(steps: list[tuple[dataset.Step, tuple[int, int]]], seed: int = 0) -> dict:
    """Trivial policies as {name: (action types it answers, fn(step, size) -> action in original
    pixels)}. Each answers with the step's own action type (an oracle for the type, so its rate
    isolates the arguments): clicks at the centre, uniformly at random, at the most frequent expert
    point (0.04 grid, read off the data); the constant texts "", "a", "e", "the", and each text
    type's most frequent content token (reward.content_tokens: stop words, which match nothing under
    the strict rules, left out) and text; each swipe direction; each system button. "most frequent
    type" answers every step with the data's most frequent action type and trivial arguments."""
    rng = random.Random(seed)
    point = gui.action_types("point")  # the types grounding accuracy counts: the click floors answer them
    kinds = Counter(s.action["action"] for s, _ in steps)
    pts = Counter((round(s.action["coordinate"][0] / w / 0.04), round(s.action["coordinate"][1] / h / 0.04))
                  for s, (w, h) in steps if s.action["action"] in point)
    mode = pts.most_common(1)[0][0] if pts else (12, 12)
    pol = {
        "click centre": (point, lambda s, z: {"action": s.action["action"], "coordinate": [z[0] / 2, z[1] / 2]}),
        "click uniform random": (point, lambda s, z: {"action": s.action["action"],
                                                                 "coordinate": [rng.uniform(0, z[0]), rng.uniform(0, z[1])]}),
        "click most frequent point": (point, lambda s, z: {"action": s.action["action"], "coordinate":
                                                                      [mode[0] * 0.04 * z[0], mode[1] * 0.04 * z[1]]}),
    }
    texts = {}
    for kind in gui.action_types("text"):
        vals = [s.action["text"] for s, _ in steps if s.action["action"] == kind]
        if vals:
            tok = Counter(t for v in vals for t in set(reward.content_tokens(v))).most_common(1)  # a stop word scores 0
            full = Counter(reward.normalize_text(v) for v in vals).most_common(1)
            texts[kind] = [c for c in (tok[0][0] if tok else None, full[0][0]) if c]
    for c in ("", "a", "e", "the"):
        pol[f"text {c!r}"] = (gui.action_types("text"), lambda s, z, c=c: {"action": s.action["action"], "text": c})
    for kind, cands in texts.items():
        for label, c in zip(("most frequent token", "most frequent text"), cands):
            pol[f"{kind} {label} {c!r}"] = ((kind,), lambda s, z, c=c: {"action": kind, "text": c})
    for d, (a, b) in {"up": ((0.5, 0.75), (0.5, 0.25)), "down": ((0.5, 0.25), (0.5, 0.75)),
                      "left": ((0.75, 0.5), (0.25, 0.5)), "right": ((0.25, 0.5), (0.75, 0.5))}.items():
        pol[f"swipe {d}"] = (gui.action_types("direction"), lambda s, z, a=a, b=b: {"action": s.action["action"], "coordinate":
                             [a[0] * z[0], a[1] * z[1]], "coordinate2": [b[0] * z[0], b[1] * z[1]]})
    pol["type alone (wait, terminate)"] = (gui.action_types("type"), lambda s, z: {"action": s.action["action"]})
    for btn in gui.SYSTEM_BUTTONS:
        pol[f"button {btn}"] = (gui.action_types("button"), lambda s, z, btn=btn: {"action": s.action["action"], "button": btn})
    top = kinds.most_common(1)[0][0] if kinds else "click"
    trivial_args = {"click": {"coordinate": None}, "long_press": {"coordinate": None}, "type": {"text": "the"},
                    "answer": {"text": "the"}, "key": {"text": "the"}, "open": {"text": "the"},
                    "system_button": {"button": "Back"}, "swipe": {"coordinate": None, "coordinate2": None}}

    def most_frequent(s, z):
        a = {"action": top, **trivial_args.get(top, {})}
        if "coordinate" in a:
            a["coordinate"] = [z[0] / 2, z[1] * (0.75 if top == "swipe" else 0.5)]
        if "coordinate2" in a:
            a["coordinate2"] = [z[0] / 2, z[1] * 0.25]
        return a
    pol[f"most frequent type ({top})"] = (gui.action_types(), most_frequent)
    return pol


def run_baselines(episodes: list[dataset.Episode], sizes: dict, rules: str = "strict", seed: int = 0) -> dict:
    """Match rates of trivial_policies on `episodes` (sizes: id(step) -> original (W, H)).
    Returns {"counts": steps per type, "rates": {policy: {type: rate}}, "floor": {...}} where floor
    is the best trivial policy per action type ("floor_by_type", with its name), the step success
    rate and SOP PG/TSR of the policy that uses that best one for every step of its type (a floor
    tuned on the data itself: an upper bound on what ignoring the screen can get), and the type
    accuracy of always answering the most frequent type."""
    steps = [(s, sizes[id(s)]) for ep in episodes for s in ep.steps]
    counts = Counter(s.action["action"] for s, _ in steps)
    pol = trivial_policies(steps, seed)
    hits = {name: Counter() for name in pol}
    per_step = {}  # (policy, id(step)) -> match, only for the types a policy answers
    for name, (types, fn) in pol.items():
        for s, z in steps:
            if s.action["action"] in types:
                ok = reward.action_match(fn(s, z), s.action, s.candidate_bbox, z, rules=protocols.rules_of(rules))[0]
                hits[name][s.action["action"]] += ok
                per_step[name, id(s)] = ok
    rates = {name: {k: hits[name][k] / counts[k] for k in counts if k in types}
             for name, (types, _) in pol.items()}
    best = {}
    for k in counts:
        cands = [(r[k], name) for name, r in rates.items() if k in r and not name.startswith("most frequent type")]
        best[k] = max(cands) if cands else (0.0, None)
    best_ok = {id(s): per_step.get((best[s.action["action"]][1], id(s)), False) for s, _ in steps}
    progress = []
    for ep in episodes:
        c = 0
        while c < len(ep.steps) and best_ok[id(ep.steps[c])]:
            c += 1
        progress.append((c, len(ep.steps)))
    sop = sop_metrics(progress)
    top = next(name for name in pol if name.startswith("most frequent type"))
    floor = {"floor_by_type": {k: {"rate": v[0], "policy": v[1]} for k, v in best.items()},
             "step_sr": sum(best_ok.values()) / max(len(steps), 1), "sop_pg": sop["pg"], "sop_tsr": sop["tsr"],
             "type_acc": counts.most_common(1)[0][1] / len(steps) if steps else 0.0,
             "most_frequent_type_step_sr": sum(hits[top].values()) / max(len(steps), 1)}
    return {"rules": rules, "steps": len(steps), "episodes": len(episodes), "counts": dict(counts),
            "rates": rates, "floor": floor}


def format_baselines(res: dict) -> str:
    """The rates of run_baselines as a plain-text table (percent), one row per policy."""
    kinds = list(res["counts"])
    head = f"{'policy':<44}" + "".join(f"{k:>14}" for k in kinds)
    lines = [f"trivial-policy match rates (%), rules={res['rules']}, {res['steps']} steps", head,
             f"{'(steps)':<44}" + "".join(f"{res['counts'][k]:>14}" for k in kinds)]
    for name, r in res["rates"].items():
        lines.append(f"{name[:44]:<44}" + "".join(f"{100 * r[k]:>14.1f}" if k in r else f"{'':>14}" for k in kinds))
    f = res["floor"]
    lines.append(f"floor (best trivial per type): step SR {100 * f['step_sr']:.1f}%, SOP PG {100 * f['sop_pg']:.1f}%, "
                 f"TSR {100 * f['sop_tsr']:.1f}%; most frequent type: type acc {100 * f['type_acc']:.1f}%")
    return "\n".join(lines)


def step_sizes(episodes: list[dataset.Episode], image_root=None, blank_screens=None) -> dict:
    """id(step) -> original (W, H) by dataset.original_size (headers only)."""
    return {id(s): dataset.original_size(s, image_root=image_root, blank_screens=blank_screens)
            for ep in episodes for s in ep.steps}


# -----------------------------------------------------------------------------
# eval_sop's flags and outputs for a served model, and the step protocols by name

# a published step protocol: eval_sop's static walk under (match rules, step instruction shown or None =
# as given), docs/method.md §8 and README "A served model, and the published step protocols"
NAMED_PROTOCOLS = {"androidcontrol-high": ("androidcontrol", False), "androidcontrol-low": ("androidcontrol", True),
                   "aitw": ("aitw", None)}
PROTOCOL_HELP = ("androidcontrol-high / -low: AndroidControl-High (goal only) / -Low (goal + step instruction), type "
                 "acc and step SR under --match-rules androidcontrol; aitw: the AITW 14%% rule (--match-rules aitw)")


def add_served_args(p) -> None:
    """eval_sop's flags of --policy openai (the API key comes from $OPENAI_API_KEY, never a flag)."""
    g = p.add_argument_group("served model (--policy openai; policies.py; the API key from $OPENAI_API_KEY)")
    g.add_argument("--base-url", default=None, help="the server's URL up to /v1, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--served-model", default=None, help="the model name the server serves (vllm serve's --served-model-name)")
    g.add_argument("--action-format", choices=list(ADAPTERS), default="uis1",
                   help="the served model's family (system prompt, answer format, coordinates): " +
                   "; ".join(f"{k}: {a.about}" for k, a in ADAPTERS.items()))
    g.add_argument("--concurrency", type=cli.positive_int, default=8, help="requests in flight at once")
    g.add_argument("--timeout", type=cli.positive_float, default=120.0,
                   help="seconds a request may take in all (connect, wait, every byte of the answer)")
    g.add_argument("--retries", type=cli.non_negative_int, default=3,
                   help="retries of a request after a network error, --timeout, HTTP 429 or 5xx (backoff 1, 2, 4 "
                   "... s or the server's Retry-After, at most 60 s; 0: none); then the step is a wrong step and its "
                   "episode records the server's error")
    g.add_argument("--prompt-from", default=None,
                   help="the checkpoint (or run folder) whose prompt contract the served model was trained with "
                   "(args.json; default: --served-model's, when it names such a local folder)")


def check_args(args, given: set) -> None:
    """eval_sop's served flags and named protocols: raises utils.UsageError on a bad combination; a named
    --protocol becomes `static` with its match rules and step-instruction setting (args.named_protocol:
    its name, else None). given: the flags on the command line (cli.explicit_flags)."""
    served = args.policy == "openai"
    if served != bool(args.base_url and args.served_model) or (not served and (args.base_url or args.served_model
                                                                               or args.prompt_from)):
        raise utils.UsageError("--policy openai needs --base-url and --served-model; only it takes them and "
                               "--prompt-from")
    if args.concurrency < 1 or args.retries < 0 or not args.timeout > 0:
        raise utils.UsageError(f"--concurrency {args.concurrency} / --retries {args.retries} / --timeout {args.timeout}: "
                             "need >= 1 / >= 0 / > 0")
    named = [p for p in args.protocol if p in NAMED_PROTOCOLS]
    args.named_protocol = named[0] if named else None
    if not named:
        return
    rules, instruction = NAMED_PROTOCOLS[named[0]]
    if len(named) > 1 or ("match_rules" in given and args.match_rules != rules) or \
            (instruction is not None and args.step_instruction not in (None, instruction)):
        raise utils.UsageError(f"--protocol {' '.join(named)}: one named protocol a run; it sets --match-rules {rules}" +
                             ("" if instruction is None else f" and --{'' if instruction else 'no-'}step-instruction"))
    args.match_rules = rules
    if instruction is not None:
        args.step_instruction = instruction
    args.protocol = list(dict.fromkeys("static" if p in NAMED_PROTOCOLS else p for p in args.protocol))


def served_sampler(args) -> ServedSampler:
    """The ServedSampler of eval_sop's flags, its API key from $OPENAI_API_KEY."""
    return ServedSampler(args.base_url, args.served_model, ADAPTERS[args.action_format],
                         api_key=os.environ.get("OPENAI_API_KEY") or None, max_new_tokens=args.max_new_tokens,
                         concurrency=args.concurrency, timeout=args.timeout, retries=args.retries,
                         temperature=args.temperature)


def raw_answer(sampler, prompt) -> dict:
    """{"raw": the served answer to `prompt`, "message": the server's message object} for a walk's row (and
    forgets them); {} for other samplers."""
    if not isinstance(sampler, ServedSampler):
        return {}
    return {"raw": sampler.raw.pop(id(prompt), ("", None))[0], "message": sampler.messages.pop(id(prompt), None)}


def served_summary(args, sampler: ServedSampler, steps_failed: int, sop_records) -> dict:
    """result.json's `served`: the server, requests, retries, failures and the SOP episodes a failure
    ended (each one's episodes.jsonl line says why: server_error); one stderr line when any failed."""
    failed = [r for r in sop_records or [] if r["server_error"]]
    if steps_failed:
        print(f"eval_sop: {steps_failed} steps got no answer from {args.base_url} after {args.retries} retries "
              f"(wrong steps; {len(failed)} SOP episodes ended by one): {failed[0]['server_error'] if failed else ''}",
              file=sys.stderr)
    return {"base_url": args.base_url, "served_model": args.served_model, "action_format": args.action_format,
            **sampler.stats, "steps_server_error": steps_failed, "episodes_server_error": len(failed),
            "prompt_from": args.prompt_from, "prompt_contract": args.prompt}


def write_responses(path: str, sop_records, static_records) -> None:
    """The raw answers as `eval_sop.py score --action-format` reads them: {episode_id, step, response,
    history ("expert": static, "own": SOP), truncated (static), message (the server's message object as it
    came, null when none did)} per line."""
    with open(path, "w", encoding="utf-8") as f:
        for r in static_records or []:
            f.write(utils.dumps({"episode_id": r["episode_id"], "step": r["t"], "response": r.get("raw", ""),
                               "truncated": r["truncated"], "history": "expert", "message": r.get("message")}) + "\n")
        for r in sop_records or []:
            for t, (raw, msg) in enumerate(zip(r.get("raw_responses", []), r.get("raw_messages", []))):
                f.write(utils.dumps({"episode_id": r["episode_id"], "step": t, "response": raw, "history": "own",
                                     "message": msg}) + "\n")
