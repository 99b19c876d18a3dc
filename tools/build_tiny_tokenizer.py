"""Build the small tokenizer of the CPU default model (`--model tiny` / `tiny:HxL`).

A model trained from scratch needs Qwen2.5-VL's tokenizer *behaviour*, not its 151,936-row
vocabulary: on the tiny preset the tied embedding / lm_head of that vocabulary is ~90 % of the
parameters and most of every CPU step, for rows the project's texts never use. This script trains
a byte-level BPE of `--vocab-size` tokens from the real Qwen2.5-VL tokenizer
(`train_new_from_iterator`), so that what a model sees stays Qwen's:
  - the pre-tokenizer (Qwen's split regex: digits one by one, words with their leading space) and
    the byte-level alphabet: every text still encodes, through byte tokens if need be;
  - the special tokens (<|im_start|>, <|im_end|>, <|endoftext|>, the vision tokens <|vision_start|>,
    <|image_pad|>, ...), their roles (eos, pad) and the chat template;
  - only the merges are learned anew, on the texts the project ships.

The corpus, in a fixed order (so the build is exact): the system prompt; for every shipped episode
file (data/miniwob*, data/android_control/*) and every step, the text of the prompt the stages build
(chat.build_prompt with the expert's history, special tokens cut out) and the expert's response; the
synthetic pages of the SFT copy warm-up (extras/synthetic_pages.py, seed 0). Run it from the
repository root; it writes assets/tiny_tokenizer/ (the tokenizer files and BUILD.json with the
corpus hash) and refuses to overwrite a different build unless --force:

    python tools/build_tiny_tokenizer.py                 # rebuild; must reproduce the committed files
    python tools/build_tiny_tokenizer.py --vocab-size 4096 --out /tmp/tok4k
"""
from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import chat
import cli  # noqa: E402
import utils  # noqa: E402
import dataset
import gui  # noqa: E402
from extras import synthetic_pages  # noqa: E402

QWEN_DIR = ROOT / "assets" / "qwen2_5_vl_tokenizer"
EPISODE_FILES = ("data/miniwob/train.jsonl", "data/miniwob/test.jsonl", "data/miniwob_click/train.jsonl",
                 "data/miniwob_click/test.jsonl", "data/android_control/android_control_train_example_uis1.jsonl",
                 "data/android_control/thought_example_uis1.jsonl",
                 "data/android_control/android_control_test_uis1.jsonl",
                 "data/android_control/android_control_test_native_steps.json")
ANDROID_SIZE = (1080, 2400)  # blank stand-ins: only the sizes matter for the prompt's text
N_SYNTHETIC = 4000

parser = cli.make_parser(__doc__)
parser.add_argument("--vocab-size", type=cli.positive_int, default=8192, help="tokens in the new vocabulary, special and added tokens included (= the tiny model's vocab_size)")
parser.add_argument("--out", default=str(ROOT / "assets" / "tiny_tokenizer"), help="output folder")
parser.add_argument("--force", action="store_true", help="overwrite a build whose files differ")


def corpus(tokenizer, image_processor) -> list[str]:
    """The training texts (module docstring), in build order, special tokens removed."""
    specials = chat.special_tokens(tokenizer)

    def text_of(ids) -> str:
        return chat.strip_special(tokenizer.decode(ids, skip_special_tokens=False), specials)

    texts = [chat.FULL_SYSTEM_PROMPT]
    labels = []
    for rel in EPISODE_FILES:
        episodes = dataset.load_episodes(str(ROOT / rel))
        if "miniwob" in rel and rel.endswith("train.jsonl"):
            labels += synthetic_pages.page_labels(episodes)
        for ep in episodes:
            history = []
            for t, step in enumerate(ep.steps):
                size = dataset.original_size(step, blank_screens=ANDROID_SIZE)
                prompt = chat.build_prompt(tokenizer, image_processor, chat.PromptSpec(), goal=ep.goal,
                                           screenshots=[size] * (t + 1), history=history,
                                           step_instruction=step.step_instruction, elements=step.elements, pixels=False)
                # one image pad run per image is enough: the pads are special tokens and cut out anyway
                texts.append(text_of([i for k, i in enumerate(prompt.input_ids.tolist())
                                      if k == 0 or i != prompt.input_ids[k - 1]]))
                response = gui.expert_response(step, size, prompt.resized_size, thought=step.thought)
                texts.append(response)
                history.append(response)
    rng = random.Random(0)
    labels = sorted(set(labels))
    for _ in range(N_SYNTHETIC):
        goal, lines, action, thought = synthetic_pages.synthetic_page(rng, labels, 4)
        texts += [f"Task goal: {goal}\nUI elements on screen:\n{lines}", gui.format_response(thought, action)]
    return texts


def main(argv=None):
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    import vlm

    qwen, image_processor = vlm.load_processor(QWEN_DIR)
    texts = corpus(qwen, image_processor)
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()
    print(f"corpus: {len(texts)} texts, {sum(map(len, texts)):,} characters, sha256 {digest[:16]}", flush=True)
    # the trainer counts the special tokens in vocab_size but appends Qwen's plain added tokens
    # (<tool_call>, <|fim_prefix|>, ...) after it: leave room for them, so len(tokenizer) == --vocab-size
    n_plain = sum(not t.special for t in qwen.added_tokens_decoder.values())
    small = qwen.train_new_from_iterator(iter(texts), vocab_size=args.vocab_size - n_plain)
    if len(small) != args.vocab_size:
        print(f"warning: {len(small)} tokens, not {args.vocab_size}: the corpus has fewer merges to learn")
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    small.save_pretrained(str(tmp))
    # files the tokenizer does not write, copied so that the folder is a complete processor folder
    for name in ("chat_template.json", "preprocessor_config.json", "LICENSE-Apache-2.0.txt"):
        (tmp / name).write_bytes((QWEN_DIR / name).read_bytes())
    check = AutoTokenizer.from_pretrained(str(tmp))
    n_qwen = sum(len(qwen.encode(t, add_special_tokens=False)) for t in texts)
    n_small = sum(len(check.encode(t, add_special_tokens=False)) for t in texts)
    build = {"vocab_size": len(check), "corpus_texts": len(texts), "corpus_sha256": digest,
             "tokens_qwen": n_qwen, "tokens_small": n_small, "files": {}}
    for p in sorted(tmp.iterdir()):
        build["files"][p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    (tmp / "BUILD.json").write_text(json.dumps(build, indent=1) + "\n")
    if out.exists():
        old = json.loads((out / "BUILD.json").read_text()) if (out / "BUILD.json").exists() else {}
        same = old.get("files") == build["files"]
        print(f"{out}: the committed build is {'reproduced exactly' if same else 'DIFFERENT'}")
        if not same and not args.force:
            raise utils.UsageError(f"{out}: differs from this build; --force overwrites it")
        import shutil
        shutil.rmtree(out)
    tmp.rename(out)
    print(utils.dumps({k: v for k, v in build.items() if k != "files"}))
    return build


if __name__ == "__main__":
    cli.run_script(main)
