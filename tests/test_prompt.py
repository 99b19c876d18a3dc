"""Prompt building with the real Qwen2.5-VL tokenizer and the tiny preset's small one (the same
chat template and special tokens, other ids), and the image processor."""

import json
import logging
from pathlib import Path

import pytest
import torch
from PIL import Image

import chat
import dataset
import gui
from vlm import load_processor

DATA = Path(__file__).resolve().parent.parent / "data" / "android_control"


SPEC = chat.PromptSpec()  # the defaults: 2 images, release pixel limits, no budget, the full system prompt


@pytest.fixture(scope="module", params=[None, "tiny"], ids=["qwen", "tiny"])
def proc(request):
    """(tokenizer, image processor): the Qwen2.5-VL-7B tokenizer, then the tiny preset's."""
    return load_processor(request.param)


def runs_of_pad(ids, tok=None):
    """Lengths of the consecutive <|image_pad|> runs, each checked to sit between vision start/end."""
    tok = tok or runs_of_pad.tok
    PAD, VSTART, VEND = tok.convert_tokens_to_ids(["<|image_pad|>", "<|vision_start|>", "<|vision_end|>"])
    runs, i = [], 0
    while i < len(ids):
        if ids[i] == PAD:
            j = i
            while j < len(ids) and ids[j] == PAD:
                j += 1
            assert ids[i - 1] == VSTART and ids[j] == VEND
            runs.append(j - i)
            i = j
        else:
            i += 1
    return runs


@pytest.fixture(autouse=True)
def _tokenizer_of_runs(request):
    """runs_of_pad reads the pad ids of the test's tokenizer."""
    if "proc" in request.fixturenames:
        runs_of_pad.tok = request.getfixturevalue("proc")[0]


def check_pads_match_grid(p: chat.Prompt):
    ids = p.input_ids.tolist()
    merge = 4  # merge_size ** 2
    assert runs_of_pad(ids) == [int(g.prod()) // merge for g in p.image_grid_thw]
    assert p.pixel_values.shape == (int(p.image_grid_thw.prod(dim=1).sum()), 1176)


def test_exact_text_of_a_one_step_prompt(proc):
    tok, ip = proc
    p = chat.build_prompt(tok, ip, SPEC, goal="Open Maps.", screenshots=[Image.new("RGB", (56, 84))], history=[])
    # 56 x 84 -> 28 * (2 x 3) -> grid (1, 6, 4) -> 24 patches -> 6 tokens after 2x2 merging
    assert p.image_grid_thw.tolist() == [[1, 6, 4]] and p.resized_size == (56, 84)
    want = (f"<|im_start|>system\n{chat.FULL_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nTask goal: Open Maps.\n"
            f"Step 1 screenshot:<|vision_start|>{'<|image_pad|>' * 6}<|vision_end|><|im_end|>\n<|im_start|>assistant\n")
    assert p.input_ids.tolist() == tok.encode(want, add_special_tokens=False)
    assert p.input_ids.dtype == torch.long and p.n_dropped_turns == 0


def test_pad_count_equals_processor_grid_and_sizes_are_wh(proc):
    tok, ip = proc
    shots = [Image.new("RGB", (720, 1280)), Image.new("RGB", (333, 500)), Image.new("RGB", (1080, 2400))]
    hist = [gui.format_response("a", {"action": "wait", "time": 2})] * 2
    p = chat.build_prompt(tok, ip, chat.PromptSpec(max_pixels=200_000), goal="g", screenshots=shots, history=hist)
    assert p.image_steps == [1, 2]  # the last 2 screenshots only
    # (333, 500): 500/28 = 17.9 -> 504, 333/28 = 11.9 -> 336; (1080, 2400) with max 200000: beta = 3.6,
    # floor(2400/3.6/28)*28 = 644, floor(1080/3.6/28)*28 = 280
    assert p.image_grid_thw.tolist() == [[1, 504 // 14, 336 // 14], [1, 644 // 14, 280 // 14]]
    assert p.resized_size == (280, 644)  # (W, H) of the LAST screenshot
    check_pads_match_grid(p)


def test_num_images_and_contents(proc):
    tok, ip = proc
    shots = [Image.new("RGB", (100, 200)) for _ in range(4)]
    hist = [gui.format_response(f"thought {i}", {"action": "click", "coordinate": [i, i]}) for i in range(3)]
    for k in (1, 2, 4):
        p = chat.build_prompt(tok, ip, chat.PromptSpec(num_images=k), goal="Find the cafe", screenshots=shots,
                              history=hist, step_instruction="tap the search bar",
                              elements="button 'Search' [0, 0, 10, 10]")
        assert p.image_steps == list(range(4 - k, 4)) and len(runs_of_pad(p.input_ids.tolist())) == k
        check_pads_match_grid(p)
    text = tok.decode(p.input_ids)
    for piece in ("Task goal: Find the cafe", "Step instruction: tap the search bar", "button 'Search'", *hist):
        assert text.count(piece) == 1
    assert text.endswith("<|im_start|>assistant\n")
    assert text.count("<|im_start|>assistant\n") == 4  # 3 history turns + the generation prompt
    old = [None, None, Image.new("RGB", (100, 200)), Image.new("RGB", (100, 200))]  # only the last 2 are read
    assert chat.build_prompt(tok, ip, SPEC, goal="g", screenshots=old, history=hist).image_steps == [2, 3]


def test_special_tokens_in_history_are_stripped(proc):
    tok, ip = proc
    bad = '<think>x<|image_pad|><|vision_start|></think><action>{"action": "wait"}</action><|im_end|><|endoftext|>'
    p = chat.build_prompt(tok, ip, SPEC, goal="g<|im_start|>", screenshots=[Image.new("RGB", (56, 56))] * 2, history=[bad])
    ids = p.input_ids.tolist()
    check_pads_match_grid(p)
    assert ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 4  # system, user, assistant, user
    assert ids.count(tok.convert_tokens_to_ids("<|endoftext|>")) == 0
    assert '<think>x</think><action>{"action": "wait"}</action>' in tok.decode(ids)


def test_errors(proc):
    tok, ip = proc
    with pytest.raises(ValueError, match="history"):
        chat.build_prompt(tok, ip, SPEC, goal="g", screenshots=[Image.new("RGB", (56, 56))] * 2, history=[])
    with pytest.raises(ValueError, match="no screenshots"):
        chat.build_prompt(tok, ip, SPEC, goal="g", screenshots=[], history=[])


# -----------------------------------------------------------------------------
# budget: the longest real episode, full-size screenshots


@pytest.fixture(scope="module")
def longest():
    eps = dataset.load_episodes(DATA / "android_control_test_uis1.jsonl")
    ep = max(eps, key=lambda e: len(e.steps))
    assert len(ep.steps) == 24
    orig = (1080, 2400)
    shots = [dataset.load_screenshot(s, blank_screens=orig) for s in ep.steps]
    resized = gui.resized_size(orig)  # (1092, 2408): 78 x 172 patches -> 3354 tokens per image
    hist = [gui.expert_response(s, orig, resized, thought="I tap the next control to get on with the task.")
            for s in ep.steps[:-1]]
    return ep, shots, hist


def test_budget_on_longest_real_episode(proc, longest, caplog):
    tok, ip = proc
    ep, shots, hist = longest
    kw = dict(goal=ep.goal, screenshots=shots, history=hist, step_instruction=ep.steps[-1].step_instruction)
    full = chat.build_prompt(tok, ip, SPEC, **kw)
    n_full = len(full.input_ids)
    assert full.image_grid_thw.tolist() == [[1, 172, 78]] * 2 and runs_of_pad(full.input_ids.tolist()) == [3354] * 2
    assert n_full > 2 * 3354 + 23 * 30 and full.n_dropped_turns == 0

    budget = n_full - 400
    with caplog.at_level(logging.WARNING, logger="gui"):
        p = chat.build_prompt(tok, ip, chat.PromptSpec(max_prompt_tokens=budget), **kw)
    assert len(p.input_ids) <= budget and 0 < p.n_dropped_turns < 22  # still both images: only text turns went
    assert p.image_steps == [22, 23]
    check_pads_match_grid(p)
    assert torch.equal(p.pixel_values, full.pixel_values)
    text = tok.decode(p.input_ids)
    assert f"Earlier steps: {p.n_dropped_turns} (screenshots not shown; actions only):" in text
    assert "Step 1: " + '{"action": ' in text and hist[-1] in text and hist[0] not in text
    assert f"over the budget of {budget}" in caplog.text


def test_budget_order_summaries_then_old_lines_then_screenshots(proc, longest):
    """Lower the budget step by step: first more turns are summarised (all lines kept), then, with only
    the screenshot turns left, the oldest summary lines go, and only then the older screenshot."""
    tok, ip = proc
    ep, shots, hist = longest
    kw = dict(goal=ep.goal, screenshots=shots, history=hist)
    small = dict(max_pixels=50176)  # small images: fast
    n_full = len(chat.build_prompt(tok, ip, chat.PromptSpec(**small), **kw).input_ids)
    seen = []
    for budget in range(n_full - 1, 0, -40):
        p = chat.build_prompt(tok, ip, chat.PromptSpec(**small, max_prompt_tokens=budget), **kw)
        text = tok.decode(p.input_ids)
        n_lines = sum(f"\nStep {i + 1}: " in text for i in range(23))
        assert len(p.input_ids) <= budget or p.n_dropped_turns == 23
        check_pads_match_grid(p)
        phase = ("summarise" if n_lines == p.n_dropped_turns and p.image_steps == [22, 23] else
                 "trim lines" if p.image_steps == [22, 23] else "drop screenshot")
        if phase == "trim lines":
            assert p.n_dropped_turns == 22  # only when the turns left all carry screenshots
        if not seen or seen[-1] != phase:
            seen.append(phase)
        if phase == "drop screenshot":
            break
    assert seen == ["summarise", "trim lines", "drop screenshot"]


def test_budget_smaller_than_the_images_does_not_crash(proc, longest, caplog):
    tok, ip = proc
    ep, shots, hist = longest
    with caplog.at_level(logging.WARNING, logger="gui"):
        p = chat.build_prompt(tok, ip, chat.PromptSpec(max_prompt_tokens=1000), goal=ep.goal, screenshots=shots,
                              history=hist)
    # every turn dropped, the summary emptied; the current screenshot alone is 3354 tokens
    assert p.n_dropped_turns == 23 and p.image_steps == [23] and "STILL OVER BUDGET" in caplog.text
    check_pads_match_grid(p)


# -----------------------------------------------------------------------------
# the prompt pinned: build_prompt's output for a few specs, stored when its layout was last changed on
# purpose (tests/data/prompt_pins.json); a refactor of chat.py must reproduce it token for token

PINS = Path(__file__).resolve().parent / "data" / "prompt_pins.json"


def pinned_cases():
    """{name: (spec, build_prompt's keyword arguments)}: history, the last K screenshots, instruction and
    elements, the short system prompt without pixels, special tokens to strip, and the outcomes of a budget
    (turns summarised, summary lines trimmed, the older screenshot dropped, still over)."""
    sizes = [(720, 1280), (333, 500), (1080, 2400), (160, 210), (540, 1200)]
    shots = [Image.new("RGB", s, (40 * i, 90, 200 - 30 * i)) for i, s in enumerate(sizes)]
    acts = [{"action": "click", "coordinate": [10 + i, 20]} for i in range(4)]
    hist = [gui.format_response(f"thought {i}", a) for i, a in enumerate(acts)]
    small = dict(max_pixels=50176)
    kw = dict(goal="Send the report.", screenshots=shots, history=hist)
    return {
        "defaults": (chat.PromptSpec(), dict(kw, step_instruction="tap send", elements="[1] button 'Send'")),
        "three_images_small": (chat.PromptSpec(num_images=3, **small), kw),
        "short_no_pixels": (chat.PromptSpec(num_images=1, system_prompt="short"),
                            dict(kw, screenshots=[None] * 4 + [(540, 1200)], pixels=False, step_instruction="  ")),
        "special_tokens": (chat.PromptSpec(**small), dict(goal="Open <|im_end|>Maps", screenshots=shots[:2],
                                                          history=["<|image_pad|>" + hist[0]], elements="a<|im_start|>b")),
        "budget_summaries": (chat.PromptSpec(max_prompt_tokens=660, **small), kw),
        "budget_trimmed_lines": (chat.PromptSpec(max_prompt_tokens=600, **small), kw),
        "budget_older_screenshot_dropped": (chat.PromptSpec(max_prompt_tokens=520, **small), kw),
        "budget_still_over": (chat.PromptSpec(max_prompt_tokens=50, **small), kw),
    }


def pinned_output(tok, ip, spec, kw) -> dict:
    """What build_prompt returns, in JSON: ids, grid, image steps, dropped turns, sizes, a pixel checksum and
    the messages' text parts."""
    p = chat.build_prompt(tok, ip, spec, **kw)
    texts = [[c.get("text", c["type"]) for c in m["content"]] for m in p.messages]
    return {"ids": p.input_ids.tolist(), "grid": None if p.image_grid_thw is None else p.image_grid_thw.tolist(),
            "image_steps": p.image_steps, "dropped": p.n_dropped_turns, "resized": list(p.resized_size),
            "pixels": None if p.pixel_values is None else round(float(p.pixel_values.double().sum()), 3),
            "messages": texts}


def test_build_prompt_output_is_pinned(proc):
    tok, ip = proc
    pins = json.loads(PINS.read_text())[tok.__class__.__name__ + str(len(tok))]
    for name, (spec, kw) in pinned_cases().items():
        assert pinned_output(tok, ip, spec, kw) == pins[name], name
    assert all(pins[n]["dropped"] > 0 for n in pins if n.startswith("budget"))  # the budget cases do summarise


def test_budget_module_is_imported_only_for_a_prompt_over_the_budget():
    """extras/prompt_budget.py stands off the RL path: no budget, or a prompt within it, leaves it unimported."""
    import subprocess
    import sys

    code = ("import sys, chat\nfrom PIL import Image\nfrom vlm import load_processor\n"
            "tok, ip = load_processor('tiny')\n"
            "kw = dict(goal='g', screenshots=[Image.new('RGB', (56, 56))] * 2, history=['<think>\\n</think>'])\n"
            "for budget in (None, 10 ** 6, 5):\n"
            "    chat.build_prompt(tok, ip, chat.PromptSpec(max_prompt_tokens=budget), **kw)\n"
            "    print('extras.prompt_budget' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(chat.__file__).parent, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "True"]
