"""The tiny preset's small tokenizer (assets/tiny_tokenizer, tools/build_tiny_tokenizer.py): Qwen2.5-VL's
behaviour on a vocabulary of its own. Checked against the real Qwen2.5-VL tokenizer shipped beside it."""

import hashlib
import json
import random
import sys
import unicodedata
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import chat
import dataset
import gui
import vlm
from extras.tiny import tiny_config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_tiny_tokenizer  # noqa: E402

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
           "<|image_pad|>", "<|video_pad|>")


@pytest.fixture(scope="module")
def toks():
    return vlm.load_processor("tiny")[0], vlm.load_processor(None)[0]


def shipped_texts() -> list[str]:
    """Every free text of every shipped episode file: goals, step instructions, thoughts, element
    lists, action texts and the expert responses as SFT trains on them, plus the system prompt."""
    texts = [chat.FULL_SYSTEM_PROMPT]
    for rel in build_tiny_tokenizer.EPISODE_FILES:
        for ep in dataset.load_episodes(str(ROOT / rel)):
            texts.append(ep.goal)
            for step in ep.steps:
                size = dataset.original_size(step, blank_screens=(1080, 2400))
                texts += [t for t in (step.step_instruction, step.thought, step.elements, step.action.get("text"))
                          if t]
                texts.append(gui.expert_response(step, size, gui.resized_size(size), thought=step.thought))
    return texts


def test_every_shipped_text_round_trips(toks):
    small, qwen = toks
    texts = shipped_texts()
    assert len(texts) > 20_000
    ids = small(texts, add_special_tokens=False)["input_ids"]
    bad = [t for t, i in zip(texts, ids) if small.decode(i) != t]
    assert bad == []
    assert max(max(i) for i in ids if i) < len(small)


def test_qwen_behaviour_kept(toks):
    """Same normaliser, pre-tokenizer (digits one by one), byte-level decoder, special tokens and chat
    template as Qwen2.5-VL; only the merges (and so the ids) differ."""
    small, qwen = toks
    js, jq = json.loads(small.backend_tokenizer.to_str()), json.loads(qwen.backend_tokenizer.to_str())
    for key in ("normalizer", "pre_tokenizer", "decoder"):
        assert js[key] == jq[key], key
    assert small.chat_template == qwen.chat_template
    assert (small.eos_token, small.pad_token) == (qwen.eos_token, qwen.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert {t.content for t in small.added_tokens_decoder.values()} == {t.content for t in qwen.added_tokens_decoder.values()}
    assert all(small.convert_tokens_to_ids(s) != small.unk_token_id for s in SPECIAL)
    assert small.convert_ids_to_tokens(small.encode("[1234, 56]", add_special_tokens=False)) == \
        ["[", "1", "2", "3", "4", ",", "Ġ", "5", "6", "]"]
    # the same pre-tokenised pieces: one text, split alike by both
    text = "Click 'Sign in' at (120,45), then type \"héllo wörld\" 123."
    pre = lambda t: [w for w, _ in t.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]  # noqa: E731
    assert pre(small) == pre(qwen)
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert small.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        qwen.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert len(small) < 20_000 < len(qwen)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_text_encodes_through_bytes(text):
    """Byte-level: any unicode text, emoji and unseen scripts included, encodes and decodes back to
    its NFC form (Qwen's normaliser; special-token strings aside: those are meant to become one id)."""
    small = vlm.load_processor("tiny")[0]
    if any(s in text for s in ("<|", "<tool_call>", "</tool_call>")):
        return
    assert small.decode(small.encode(text, add_special_tokens=False)) == unicodedata.normalize("NFC", text)


def test_special_ids_agree_between_tokenizer_config_and_prompt(toks):
    small, _ = toks
    cfg = tiny_config(64, 2, tokenizer=small)
    ids = dict(zip(SPECIAL, small.convert_tokens_to_ids(list(SPECIAL))))
    assert cfg.image_token_id == ids["<|image_pad|>"] and cfg.video_token_id == ids["<|video_pad|>"]
    assert cfg.vision_start_token_id == ids["<|vision_start|>"] and cfg.vision_end_token_id == ids["<|vision_end|>"]
    assert cfg.eos_token_id == small.eos_token_id == ids["<|im_end|>"]
    assert cfg.pad_token_id == small.pad_token_id == ids["<|endoftext|>"]
    assert cfg.text_config.vocab_size == len(small) == 8192
    # the real tokenizer gives the 7B's ids
    qcfg = tiny_config(64, 2, tokenizer=vlm.load_processor(None)[0], vocab_size=151936)
    assert (qcfg.image_token_id, qcfg.vision_start_token_id, qcfg.eos_token_id) == (151655, 151652, 151645)
    with pytest.raises(ValueError, match="vocab_size"):
        tiny_config(64, 2, tokenizer=small, vocab_size=100)


def test_image_pads_in_a_tiny_prompt_reach_the_model():
    """A prompt built with the tiny tokenizer places its image features where the tiny model looks:
    as many <|image_pad|> ids as the image processor's grid gives merged patches, and a forward runs."""
    tok, ip = vlm.load_processor("tiny", max_pixels=64 * 28 * 28)
    from PIL import Image
    p = chat.build_prompt(tok, ip, chat.PromptSpec(), goal="g", screenshots=[Image.new("RGB", (100, 180))] * 2,
                         history=[gui.format_response("x", {"action": "wait", "time": 1})])
    model = vlm.load_model("tiny")
    n_pad = int((p.input_ids == model.config.image_token_id).sum())
    assert n_pad == int(p.image_grid_thw.prod(-1).sum()) // 4 > 0
    with torch.no_grad():
        out = model(input_ids=p.input_ids[None], pixel_values=p.pixel_values, image_grid_thw=p.image_grid_thw)
    assert out.logits.shape == (1, len(p.input_ids), 8192)


def test_tokenizer_dir_rule(tmp_path):
    assert vlm.tokenizer_dir("tiny:128x4") == vlm.TINY_TOKENIZER_DIR
    assert vlm.tokenizer_dir(None) == vlm.TOKENIZER_DIR
    assert vlm.tokenizer_dir(tmp_path) == vlm.TOKENIZER_DIR  # a weights-only folder
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert vlm.tokenizer_dir(tmp_path) == tmp_path  # a folder with its own tokenizer keeps it


def test_committed_build_is_intact():
    """BUILD.json names the sha256 of every file the build wrote: the committed folder is that build."""
    d = vlm.TINY_TOKENIZER_DIR
    build = json.loads((d / "BUILD.json").read_text())
    assert build["vocab_size"] == 8192
    for name, digest in build["files"].items():
        assert hashlib.sha256((d / name).read_bytes()).hexdigest() == digest, name


def test_build_is_deterministic(tmp_path, monkeypatch):
    """Two builds on the same (small) corpus write identical files: the script rebuilds exactly."""
    rng = random.Random(0)
    words = ["click", "button", "submit", "Task goal:", "coordinate", "'okay'", "(12,34)", "Ñandú", "上传"]
    texts = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(300)]
    monkeypatch.setattr(build_tiny_tokenizer, "corpus", lambda tok, ip: list(texts))
    a = build_tiny_tokenizer.main(["--vocab-size", "400", "--out", str(tmp_path / "a")])
    b = build_tiny_tokenizer.main(["--vocab-size", "400", "--out", str(tmp_path / "b")])
    assert a["files"] == b["files"] and 300 < a["vocab_size"] <= 400
    again = build_tiny_tokenizer.main(["--vocab-size", "400", "--out", str(tmp_path / "a")])  # same: allowed
    assert again["files"] == a["files"]
