"""The prompt contract (chat.PromptSpec): one checkpoint, three stages, the identical prompt.

A checkpoint records its contract in args.json ("prompt"); SFT, semi-online RL and evaluation each
adopt it with chat.resolve_spec and build the prompt of a recorded step with chat.step_prompt (SFT
through train_sft.sft_example, RL and evaluation through rollout.semi_online_rollout). Here all
three build step 1 of a real MiniWob++ episode, with the expert's history, from one checkpoint
whose contract differs from every default: the ids and pixels must be the same to the bit."""
import json
from pathlib import Path

import pytest
import torch

import chat
import dataset
import eval_sop
import train_semionline
import train_sft
import vlm
from rollout import RolloutSpec, semi_online_rollout
from sampler import SampleOutput

REPO = Path(__file__).resolve().parent.parent
CONTRACT = {"num_images": 1, "min_pixels": 3136, "max_pixels": 20000, "max_prompt_tokens": 600,
            "step_instruction": True, "elements": False, "system_prompt": "short"}


@pytest.fixture()
def checkpoint(tmp_path):
    """A checkpoint folder as save_checkpoint leaves it, as far as the stages read it before the weights."""
    ckpt = tmp_path / "ckpt" / "step_000007"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "args.json").write_text(json.dumps({"lr": 0.1, "prompt": CONTRACT}))
    (tmp_path / "ckpt" / "latest").write_text("step_000007")
    return tmp_path / "ckpt"


class Recorder:
    """A sampler that records the prompts it is given and answers with an empty response."""

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, n=1, greedy=False, seeds=None):
        self.prompts += list(prompts)
        return [[SampleOutput(ids=[], text="", logprobs=torch.zeros(0), finish_reason="stop", prompt_index=i)] * k
                for i, k in enumerate(n)]


def episode_with_instruction():
    ep = next(e for e in dataset.load_episodes(REPO / "data" / "miniwob" / "test.jsonl") if len(e.steps) >= 3)
    ep.steps[1].step_instruction = "Type the name into the field."  # shown: the contract asks for it
    return ep


def test_one_checkpoint_three_stages_identical_prompt(checkpoint):
    said = []
    specs = {}
    for name, parser in (("sft", train_sft.parser), ("rl", train_semionline.parser), ("eval", eval_sop.sop_parser())):
        args = parser.parse_args(["--model", str(checkpoint)])
        specs[name] = chat.resolve_spec(args, args.model, say=said.append)
        assert args.prompt == CONTRACT  # args.json of the stage's own run records the contract
    assert specs["sft"] == specs["rl"] == specs["eval"] == chat.PromptSpec(**CONTRACT)
    assert all("prompt contract from" in s for s in said)

    tok, ip = vlm.load_processor("tiny", min_pixels=3136, max_pixels=20000)
    ep = episode_with_instruction()
    sft_prompt, _ = train_sft.sft_example(ep, 1, tok, ip, specs["sft"])
    by_stage = {"sft": sft_prompt}
    for name in ("rl", "eval"):  # both walk with the rollout driver; static evaluation = expert history
        rec = Recorder()
        semi_online_rollout(rec, [ep], tok, ip, RolloutSpec(n_rollouts=1, history_mode="expert", patch_threshold=0,
                                                            greedy=name == "eval"), spec=specs[name], seed=0)
        by_stage[name] = rec.prompts[1]  # step 1's prompt
    for name in ("rl", "eval"):
        assert torch.equal(by_stage[name].input_ids, by_stage["sft"].input_ids), name
        assert torch.equal(by_stage[name].pixel_values, by_stage["sft"].pixel_values), name
        assert by_stage[name].resized_size == by_stage["sft"].resized_size
    text = tok.decode(sft_prompt.input_ids)
    assert "Type the name into the field." in text and "UI elements on screen" not in text  # the contract's switches
    assert chat.SHORT_SYSTEM_PROMPT in text and "## Action space" not in text
    assert sft_prompt.image_grid_thw.shape[0] == 1  # one image kept


def test_a_flag_wins_over_the_checkpoint_with_a_warning(checkpoint):
    args = train_semionline.parser.parse_args(["--model", str(checkpoint), "--num-images", "2", "--elements"])
    said = []
    spec = chat.resolve_spec(args, args.model, say=said.append)
    assert spec.num_images == 2 and spec.elements is True and spec.system_prompt == "short"
    assert sum("warning" in s for s in said) == 2


def test_fresh_defaults_and_bad_values():
    args = train_sft.parser.parse_args(["--model", "tiny:64x2"])
    assert chat.resolve_spec(args, args.model, say=lambda s: None).system_prompt == "short"  # trained from scratch
    args = eval_sop.sop_parser().parse_args([])
    assert chat.resolve_spec(args, "/models/Qwen2.5-VL-7B-Instruct", say=lambda s: None) == chat.PromptSpec()
    import utils
    args = train_sft.parser.parse_args(["--max-pixels", "10", "--min-pixels", "20"])
    with pytest.raises(utils.UsageError, match="--min-pixels 20 / --max-pixels 10"):
        chat.resolve_spec(args, "tiny", say=lambda s: None)


def test_step_instruction_flag_on_every_stage():
    for parser in (train_sft.parser, train_semionline.parser, eval_sop.sop_parser()):
        assert "--step-instruction" in parser.format_help() and "--system-prompt" in parser.format_help()


def test_hint_lands_after_the_instruction():
    tok, ip = vlm.load_processor("tiny", max_pixels=20000)
    from PIL import Image
    step = dataset.Step(screenshot=None, action={"action": "wait"}, step_instruction="Open settings")
    kw = dict(goal="g", step=step, screenshots=[Image.new("RGB", (56, 56))], history=[])
    with_instr = chat.step_prompt(tok, ip, chat.PromptSpec(step_instruction=True, max_pixels=20000), hint="HINT", **kw)
    without = chat.step_prompt(tok, ip, chat.PromptSpec(max_pixels=20000), hint="HINT", **kw)
    assert "Step instruction: Open settings\nHINT" in tok.decode(with_instr.input_ids)
    assert "Step instruction: HINT" in tok.decode(without.input_ids)  # goal-only setting: the hint alone
