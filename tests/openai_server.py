"""A real OpenAI-compatible chat-completions server for the tests (not a test module): the standard
library's HTTP server answering POST /v1/chat/completions with a Qwen2.5-VL checkpoint run by the
project's own sampler (sampler.Sampler), greedy at temperature 0.

It receives messages as any OpenAI client sends them (text parts, images as base64 data URLs),
renders them with the checkpoint's chat template, expands each image's pads from its size and
processes the pixels without resizing (the client sends screenshots already resized, as a
Qwen2.5-VL server would leave them). Why not `transformers serve` (transformers 5.24): FastAPI and
Uvicorn install from the registry, but it loads the checkpoint with AutoProcessor, whose Qwen2.5-VL
video processor needs torchvision, and the registry's torchvision wheels (0.28.0 pins torch 2.13.0)
are CUDA builds that fail to load against the CPU torch (2026-12-05: "operator torchvision::nms does
not exist"); on a GPU machine `transformers serve` or `vllm serve` is the server to use.

The request's "model" names how the answer comes back (SHAPES; any other name: "plain"), as the servers
people run shape it: `transformers serve` (its own Qwen response template, run here: the think block in
`reasoning_content`, tool calls in `tool_calls`, content "" when nothing is left), vLLM with a reasoning
parser (`reasoning_content`, or `reasoning` in newer releases; content null), with the hermes tool parser
(content null before a call), both, and content as a list of text parts. "rotate" answers the n-th
request in the n-th shape, so one run meets them all.

    python tests/openai_server.py --model DIR [--port 0]   # prints "listening on PORT", then serves

The same HTTP plumbing serves the tests' scripted servers in-process (Loopback: a reply per request,
statuses, headers, delays, raw bytes, the requests recorded), so every loopback server in tests/ is one.
"""
import argparse
import base64
import io
import itertools
import json
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.client import HTTPMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from PIL import Image  # noqa: E402

import chat  # noqa: E402
import vlm  # noqa: E402
from sampler import Sampler  # noqa: E402


def encode(tokenizer, image_processor, messages: list) -> chat.Prompt:
    """OpenAI chat messages -> chat.Prompt (ids with image pads expanded, pixels, grid)."""
    msgs, images = [], []
    for m in messages:
        parts = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        content = []
        for c in parts:
            if c["type"] == "image_url":
                data = c["image_url"]["url"].split(",", 1)[1]
                images.append(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))
                content.append({"type": "image"})
            else:
                content.append({"type": "text", "text": c["text"]})
        msgs.append({"role": m["role"], "content": content})
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    patch, merge = int(image_processor.patch_size), int(image_processor.merge_size)
    counts = iter([(im.size[0] // patch) * (im.size[1] // patch) // merge**2 for im in images])
    out = []
    for tok in ids:
        out.extend([pad] * next(counts) if tok == pad else [tok])
    pixels = grid = None
    if images:
        feats = image_processor(images=images, do_resize=False, return_tensors="pt")
        pixels, grid = feats["pixel_values"], feats["image_grid_thw"].long()
    size = images[-1].size if images else (0, 0)
    return chat.Prompt(torch.tensor(out, dtype=torch.long), pixels, grid, size, 0)


def transformers_message(text: str, tokenizer, finish_reason: str = "stop") -> dict | None:
    """The message `transformers serve` sends for `text` from a Qwen2.5-VL-family model: its own response
    template (cli/serving/utils.py) and tool-call normaliser, run; None where its parser raises (a tool call
    that is not JSON: the server answers HTTP 500). The server parses the decode WITH special tokens: an
    answer that stopped ("stop") ends with the end token, which an open think block keeps
    (tests/data/served/open_think_00.json)."""
    text = text + tokenizer.eos_token if finish_reason == "stop" else text
    from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS, _normalize_tool_call
    template = next(v for types, v in _RESPONSE_TEMPLATE_FALLBACKS.items() if "qwen2_5_vl" in types)
    try:
        parsed = tokenizer.parse_response(text, template, prefix="<|im_start|>assistant\n")  # the prompt's end
    except ValueError:
        return None
    calls = [_normalize_tool_call(c) for c in parsed.get("tool_calls") or []]
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for i, c in enumerate(calls)]
    return {"role": "assistant", "content": parsed.get("content", ""),
            "reasoning_content": parsed.get("reasoning_content"), "tool_calls": calls or None}


def vllm_reasoning(text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) as vLLM's qwen3 reasoning parser splits an answer: a <think> dropped, the text
    before </think> and after it (null when empty), unstripped; no </think>: all of it is reasoning."""
    text = text.partition("<think>")[2] if "<think>" in text else text
    if "</think>" not in text:
        return text, None
    reasoning, _, content = text.partition("</think>")
    return reasoning or None, content or None


def vllm_tools(content: str | None) -> tuple[str | None, list | None]:
    """(content, tool_calls) as vLLM's hermes tool parser splits an answer: the text before the first
    <tool_call> (null when empty) and each call, arguments as a JSON string; unchanged where a call is not JSON."""
    if content is None or "<tool_call>" not in content:
        return content, None
    try:
        found = re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", content, re.S)
        calls = [json.loads(a or b) for a, b in found]
        calls = [{"id": f"call_{i}", "type": "function", "function": {"name": c["name"], "arguments":
                  json.dumps(c["arguments"], ensure_ascii=False)}} for i, c in enumerate(calls)]
    except (ValueError, KeyError, TypeError):
        return content, None
    return content[:content.find("<tool_call>")] or None, calls


def shape_message(text: str, finish_reason: str, shape: str, tokenizer) -> tuple[dict | None, str]:
    """(message, finish_reason) of an answer `text` in `shape` (SHAPES); message None: an HTTP 500."""
    if shape == "transformers":
        m = transformers_message(text, tokenizer, finish_reason)
        return m, ("tool_calls" if m and m["tool_calls"] else finish_reason)
    if shape == "parts":
        parts = [{"type": "text", "text": text[:5]}, {"type": "text", "text": text[5:]}]
        return {"role": "assistant", "content": parts}, finish_reason
    if shape not in ("vllm-reasoning", "vllm-reasoning-new", "vllm-tools", "vllm-both"):
        return {"role": "assistant", "content": text}, finish_reason
    reasoning, content = vllm_reasoning(text) if shape != "vllm-tools" else (None, text)
    content, calls = vllm_tools(content) if shape in ("vllm-tools", "vllm-both") else (content, None)
    m = {"role": "assistant", "content": content, "tool_calls": calls or []}
    m["reasoning" if shape == "vllm-reasoning-new" else "reasoning_content"] = reasoning
    return m, ("tool_calls" if calls else finish_reason)


SHAPES = ("plain", "transformers", "vllm-reasoning", "vllm-reasoning-new", "vllm-tools", "vllm-both", "parts")


# --- the loopback server: one HTTP plumbing for this script and the tests' scripted servers

CHAT_PATH = "/v1/chat/completions"


class Request(NamedTuple):
    """One POST the loopback server took: `n` its place in arrival order (from 0), `body` its JSON, `headers`
    its headers (case-insensitive get, as http.server reads them)."""
    n: int
    body: dict
    headers: HTTPMessage


@dataclass
class Reply:
    """An HTTP answer: `status`; `body` a dict (sent as JSON, Content-Type application/json), bytes (sent as
    they are) or None (empty); extra `headers` (e.g. Retry-After); `delay` seconds slept before answering."""
    status: int = 200
    body: dict | bytes | None = None
    headers: dict = field(default_factory=dict)
    delay: float = 0.0


def completion(message: dict | str, finish_reason: str = "stop", **extra) -> Reply:
    """A 200 chat completion with one choice: `message` (a str: the assistant's plain content) and
    `finish_reason`; `extra` top-level fields (model, usage, ...)."""
    if isinstance(message, str):
        message = {"role": "assistant", "content": message}
    return Reply(body={"object": "chat.completion", **extra,
                       "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]})


Answer = Callable[[Request], "Reply | Iterable[bytes]"]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        srv = self.server.loopback
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") != CHAT_PATH:
            return self.send(Reply(404, {"error": {"message": f"no route {self.path}"}}))
        try:
            body = json.loads(raw)
        except ValueError as e:
            return self.send(Reply(400, {"error": {"message": f"bad request: {e}"}}))
        with srv.lock:  # handler threads: each request gets its own n
            req = Request(len(srv.seen), body, self.headers)
            srv.seen.append(req)
        reply = srv.answer(req)
        if isinstance(reply, Reply):
            return self.send(reply)
        try:  # raw bytes, status line and headers included, each chunk flushed as it comes
            for chunk in reply:
                self.wfile.write(chunk)
                self.wfile.flush()
        except OSError:  # the client hung up (a trickle's client is meant to)
            pass

    def send(self, reply: Reply):
        time.sleep(reply.delay)
        data = json.dumps(reply.body).encode() if isinstance(reply.body, dict) else reply.body or b""
        self.send_response(reply.status)
        if isinstance(reply.body, dict):
            self.send_header("Content-Type", "application/json")
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):  # quiet: the tests read stdout (this script's port) and stderr (the client's)
        pass


class Loopback:
    """An OpenAI-compatible chat-completions server on 127.0.0.1 (`port` 0: a free one), a thread per
    request. POST /v1/chat/completions -> `answer(Request)`: a Reply, or an iterable of raw byte chunks
    written and flushed one at a time (a server misbehaving below HTTP, e.g. one that trickles). Another
    path: 404; a body that is not JSON: 400 (neither reaches `answer`). Every request that does is kept in
    `seen`. `url` is the client's base URL (.../v1).

        with Loopback(lambda req: completion("hi")) as srv:   # serving in a daemon thread
            ... srv.url ... srv.seen                           # leaving the block stops it
    """

    def __init__(self, answer: Answer, port: int = 0):
        self.answer, self.seen, self.lock = answer, [], threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.httpd.loopback = self
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def dead_port() -> int:
    """A port on 127.0.0.1 that nobody listens on: one the OS gave as free, closed again."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    tokenizer, image_processor = vlm.load_processor(args.model)
    model = vlm.load_model(args.model).eval()
    rotation = itertools.cycle(SHAPES)  # "rotate": the n-th request in the n-th shape
    one_at_a_time = threading.Lock()  # one generation at a time, in the order the requests take the lock

    def answer(req: Request) -> Reply:
        try:
            prompt = encode(tokenizer, image_processor, req.body["messages"])
        except (ValueError, KeyError, TypeError, IndexError) as e:
            return Reply(400, {"error": {"message": f"bad request: {e}"}})
        sampler = Sampler(model, tokenizer, max_new_tokens=int(req.body.get("max_tokens", 512)), decode="eager")
        with one_at_a_time, torch.no_grad():
            out = sampler.generate([prompt], n=1, greedy=float(req.body.get("temperature", 1.0)) == 0.0)[0][0]
            shape = next(rotation) if req.body.get("model") == "rotate" else req.body.get("model")
        message, finish = shape_message(out.text, out.finish_reason, shape, tokenizer)
        if message is None:
            return Reply(500, {"error": {"message": "the response parser raised"}})
        return completion(message, finish, model=req.body.get("model"),
                          usage={"prompt_tokens": len(prompt.input_ids), "completion_tokens": len(out.ids)})

    server = Loopback(answer, args.port)
    print(f"listening on {server.port}", flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
