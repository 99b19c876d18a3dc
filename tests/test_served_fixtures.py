"""Real `transformers serve` answers (tests/data/served: transformers 5.24.0, captured 2026-12-07 beside the
same checkpoint's in-process text for the same prompts) read back by evaluation/served.py: the answer the
served model wrote is the text the in-process model wrote, through the reader alone and through the whole
client (ServedSampler over a loopback server that replays the captured bytes). The loopback test server
(tests/openai_server.py) answers in that server's shape, end marker included."""
import json
import sys
from pathlib import Path

import pytest
from PIL import Image

import chat
import policies
import vlm
from evaluation import served

sys.path.insert(0, str(Path(__file__).resolve().parent))  # openai_server
from openai_server import Loopback, Reply, transformers_message  # noqa: E402

FIXTURES = sorted((Path(__file__).resolve().parent / "data" / "served").glob("*.json"))
load = lambda p: json.loads(p.read_text())  # noqa: E731


def test_the_fixtures_are_real_split_answers():
    """The captured shape: each answer's think block is in reasoning_content (stripped) and not in content;
    13 answers, one an open think block whose reasoning kept the literal end marker."""
    assert len(FIXTURES) == 13
    for p in FIXTURES:
        msg = load(p)["response"]["choices"][0]["message"]
        assert msg["reasoning_content"] and "<think>" not in msg["content"], p.name
        assert load(p)["in_process_text"].startswith("<think>\n"), p.name
    assert load(FIXTURES[-1])["response"]["choices"][0]["message"] == {
        "content": "", "role": "assistant", "reasoning_content": "I click it.\n</action><|im_end|>"}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_real_answers_read_back_to_the_in_process_text(path):
    """answer_text(message) is the text the checkpoint wrote in process (the content alone never is)."""
    case = load(path)
    msg = case["response"]["choices"][0]["message"]
    assert served.answer_text(msg) == case["in_process_text"]
    assert msg["content"] != case["in_process_text"]


def test_served_sampler_over_the_captured_bytes_writes_the_in_process_text():
    """ServedSampler (the client eval_sop --policy openai runs), greedy, one prompt at a time against a
    loopback server replaying the captured answers: each ServedOutput's text and raw answer are the
    in-process text, finish "stop", nothing failed."""
    cases = [load(p) for p in FIXTURES]
    tok, ip = vlm.load_processor("tiny")
    spec = chat.PromptSpec(system_prompt="short", max_pixels=20000)
    prompt = chat.build_prompt(tok, ip, spec, goal="Click on the No button.",
                               screenshots=[Image.new("RGB", (160, 210))], history=[])
    with Loopback(lambda req: Reply(body=cases[req.n]["response"])) as srv:  # the k-th answer to the k-th request
        sampler = served.ServedSampler(srv.url, "sft", policies.ADAPTERS["uis1"], concurrency=1, retries=0,
                                       max_new_tokens=64)
        outs = [sampler.generate([prompt], greedy=True)[0][0] for _ in cases]
    assert [o.finish_reason for o in outs] == ["stop"] * len(cases) and sampler.stats["failed"] == 0
    assert [o.raw for o in outs] == [o.text for o in outs] == [c["in_process_text"] for c in cases]  # uis1: as is
    assert srv.seen[0].body["temperature"] == 0.0 and srv.seen[0].body["max_tokens"] == 64


def test_loopback_transformers_shape_keeps_the_servers_end_marker():
    """tests/openai_server.py's `transformers` shape is the real server's for the same answer: an answer that
    stopped at <|im_end|> with its think block open gives the captured message (the marker inside
    reasoning_content, content ""); a closed one the captured split."""
    tok, _ = vlm.load_processor("tiny")
    for p in FIXTURES:
        case = load(p)
        real = case["response"]["choices"][0]["message"]
        got = transformers_message(case["in_process_text"], tok, finish_reason="stop")
        assert (got["content"], got["reasoning_content"]) == (real["content"], real["reasoning_content"]), p.name
