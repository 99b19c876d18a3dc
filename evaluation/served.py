"""The client of a model served behind an OpenAI-compatible chat-completions endpoint (`vllm serve`,
`transformers serve`, SGLang, a hosted API): what `eval_sop.py --policy openai` sends, how it reads
the answer back, and how long it waits.

Sending. openai_messages turns the chat.Prompt the in-process model would get into OpenAI messages:
each screenshot a PNG data URL of the RESIZED image, the system prompt and the history turns in the
family's format (evaluation.families.Adapter). The prompt contract (chat.PromptSpec) is the checkpoint's:
prompt_spec reads it from --prompt-from, or from --served-model when that names a local folder.

Reading (answer_text). A server does not always hand back the text the model wrote. `transformers
serve` (5.x, cli/serving/utils.py: the response template of the qwen2 / qwen2_5_vl / qwen3 ... model
types) moves a `<think>..</think>` block into `reasoning_content` and each `<tool_call>{json}</tool_call>`
into `tool_calls` (`{"type": "function", "function": {"name", "arguments": a JSON string}}`, finish_reason
"tool_calls"), strips both, and leaves `content` the rest ("" when nothing is left), with or without
`--reasoning off`. vLLM does the same when a reasoning parser is on (`reasoning_content`, renamed
`reasoning` in newer releases, unstripped; a missing `</think>` puts the whole answer there) or a tool
parser (hermes: `content` null when nothing came before the call). A hosted API may answer `content`
as a list of text parts, or a `refusal`. answer_text puts the answer back together before the family's
parser sees it: the think block first, then the content, then each call as Qwen writes it
(`<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>`). The rebuilding is the same for every
family: a server only splits what the model wrote inside those tags.

Waiting. --timeout bounds the whole request (connect, headers, body: a server that trickles bytes is cut
at the deadline), not each socket read. A network error, a deadline or HTTP 429 / 5xx is retried --retries
times after backoff * 2**k seconds, or the server's Retry-After (seconds), at most BACKOFF_CAP. A request
that fails after its retries, or an answer the server's content filter withheld (finish_reason
"content_filter"), is the SERVER's: the step is answered with finish_reason "error: ...", counted in
`stats`, and never scored as a malformed answer of the model's.

Text. Every answer goes through clean_text (lone UTF-16 surrogates, which a JSON `\\ud83d` escape can
carry and which no tokenizer or UTF-8 file accepts, become U+FFFD, counted in stats["lone_surrogates"]).
"""
from __future__ import annotations

import base64
import http.client
import io
import json
import re
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import chat
import utils

BACKOFF_CAP = 60.0  # seconds: the longest wait before a retry, Retry-After included

# -----------------------------------------------------------------------------
# text


_SURROGATE_PAIR_RE = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> tuple[str, int]:
    """(text with every lone UTF-16 surrogate replaced by U+FFFD, how many were replaced). A str decoded
    from JSON can hold one (`"\\ud83d"` alone); UTF-8 cannot encode it, so a tokenizer raises on it and
    a file write fails. A high surrogate followed by a low one (two code points) is joined into the one
    character they spell, as UTF-16 reads them, and not counted."""
    text = _SURROGATE_PAIR_RE.sub(lambda m: chr(0x10000 + ((ord(m.group()[0]) - 0xD800) << 10)
                                                + ord(m.group()[1]) - 0xDC00), text)
    return _SURROGATE_RE.subn("\ufffd", text)


# -----------------------------------------------------------------------------
# the answer as the model wrote it


class ServerError(RuntimeError):
    """An answer that is no chat completion (HTTP error, bad JSON, no choices, a message of the wrong
    shape, a withheld answer): retried when transient."""

    def __init__(self, msg: str, transient: bool):
        super().__init__(msg)
        self.transient = transient


def _text_of(value, field: str) -> str:
    """A message field as text: a string, null ("") or a list of text parts ({"type": "text", "text": ..})."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list) and all(isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in value):
        return "".join(p.get("text", "") for p in value if p.get("type", "text") in ("text", "output_text"))
    raise ServerError(f"message.{field} is {type(value).__name__}, not text", False)


def _tool_call_text(call) -> str:
    """One `tool_calls` entry as Qwen writes it: <tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>.
    Arguments given as a JSON string are parsed and written again; a string that is not JSON is put in
    as it came, so the family's parser finds it malformed (the model's answer), never the server's."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ServerError(f"a tool call without function.name: {str(call)[:120]}", False)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            body = '{"name": ' + json.dumps(fn["name"], ensure_ascii=False) + ', "arguments": ' + args + "}"
            return f"<tool_call>\n{body}\n</tool_call>"
    body = json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


# the end tokens transformers serve's Qwen response template closes `content` at (cli/serving/utils.py, 5.24)
_END_MARKER_RE = re.compile(r"\s*(?:<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>)")


def answer_text(message: dict) -> str:
    """The answer a chat-completion `message` carries, as the model wrote it (module docstring: Reading).

    message: choices[0].message, a dict with `content` (str, "" or null, or a list of text parts),
    optionally `reasoning_content` or `reasoning` (str) and `tool_calls` (a list of {"type": "function",
    "function": {"name": str, "arguments": a JSON string or an object}}), or `refusal` (str, read as
    content when there is none). Returns `<think>\\n{reasoning}\\n</think>\\n` + content + the tool calls
    (each on its own line, `<tool_call>\\n{json}\\n</tool_call>`). A reasoning with nothing after it (the
    server found no `</think>`) is an open block `<think>\\n{reasoning}` where content is "" (transformers:
    a cut thought), the reasoning as it came where content is null (vLLM: an answer that never closed or
    never wrote a think block, whether a `<think>` was written is lost), cut at an end token left in it
    (`<|im_end|>`: transformers keeps the one the model stopped on in an open block). Whitespace around
    each part is the servers' to change (transformers strips it): the parts are stripped and joined on
    one newline, as the project's and Qwen's own formats write them. A plain `content` comes back unchanged.
    Raises ServerError (not transient) for a message of the wrong shape: the server's fault."""
    if not isinstance(message, dict):
        raise ServerError(f"message is {type(message).__name__}, not an object", False)
    content = _text_of(message.get("content"), "content") or _text_of(message.get("refusal"), "refusal")
    reasoning = next((_text_of(message[k], k) for k in ("reasoning_content", "reasoning") if message.get(k)), "")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ServerError(f"message.tool_calls is {type(calls).__name__}, not a list", False)
    if not reasoning.strip() and not calls:
        return content
    tail = "\n".join([content.strip()] * bool(content.strip()) + [_tool_call_text(c) for c in calls])
    if not reasoning.strip():
        return tail
    if tail:
        return f"<think>\n{reasoning.strip()}\n</think>\n{tail}"
    # reasoning alone: the server found no </think>. transformers (content "") opens its reasoning region
    # only at a written <think>: the block was left open (cut). vLLM's parsers (content null) put a whole
    # answer without </think> there, a <think> removed: the answer as it came. Either way the region never
    # closed, so the end token the model stopped on (transformers parses the decode with special tokens)
    # is still in it: cut there, as the template's content region would have been.
    reasoning = _END_MARKER_RE.split(reasoning, maxsplit=1)[0]
    return reasoning if message.get("content") is None else f"<think>\n{reasoning.strip()}"


# finish_reason -> what the step was: a complete answer, one cut at the token cap, or the server's
FINISH = {"stop": "stop", "tool_calls": "stop", "function_call": "stop", "length": "length"}


# -----------------------------------------------------------------------------
# the request: sent, bounded, retried


def image_url(im) -> str:
    """A PIL image as a PNG data URL (lossless: the server decodes the very pixels)."""
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def openai_messages(messages: list, adapter, size: tuple[int, int]) -> list:
    """chat.Prompt.messages -> OpenAI chat messages: images as data URLs, the system prompt and the
    history turns in the family format of `adapter` (evaluation.families.Adapter: system_prompt, from_response),
    in the frame of the current screenshot's `size` (W, H). Raises ValueError for a prompt built
    without pixels."""
    out = []
    for m in messages:
        if m["role"] == "system" and adapter.system_prompt is not None:
            out.append({"role": "system", "content": adapter.system_prompt})
            continue
        if m["role"] == "assistant":
            text = "".join(c["text"] for c in m["content"] if c["type"] == "text")
            out.append({"role": "assistant", "content": adapter.from_response(text, size)})
            continue
        parts = []
        for c in m["content"]:
            if c["type"] == "image":
                if "image" not in c:
                    raise ValueError("a served model needs the prompt's pixels (chat.build_prompt with pixels=True)")
                parts.append({"type": "image_url", "image_url": {"url": image_url(c["image"])}})
            else:
                parts.append({"type": "text", "text": c["text"]})
        out.append({"role": m["role"], "content": parts})
    return out


class _Sockets:
    """The sockets one request opened; cut() shuts them (and any opened later), which ends a blocked
    read at once: how the request's deadline is kept, whatever the server trickles."""

    def __init__(self):
        self.socks, self.fired, self.lock = [], False, threading.Lock()

    def add(self, sock) -> None:
        with self.lock:
            self.socks.append(sock)
            if self.fired:
                self._shut(sock)

    def cut(self) -> None:
        with self.lock:
            self.fired = True
            for s in self.socks:
                self._shut(s)

    @staticmethod
    def _shut(sock) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass


def _opener(watch: _Sockets):
    """A urllib opener (proxies from the environment, as urlopen's) whose connections report their sockets."""
    def conn(cls):
        class Watched(cls):
            def connect(self):
                super().connect()
                watch.add(self.sock)
        return Watched

    class HTTP(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(conn(http.client.HTTPConnection), req)

    class HTTPS(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(conn(http.client.HTTPSConnection), req, context=ctx)

    ctx = ssl.create_default_context()
    return urllib.request.build_opener(HTTP(), HTTPS(context=ctx))


def retry_after(headers) -> float | None:
    """The seconds of an HTTP Retry-After header in its seconds form; None when absent or a date."""
    value = (headers.get("Retry-After") or "").strip() if headers is not None else ""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


@dataclass
class ServedOutput:
    """What the rollout driver reads of a sample (sampler.SampleOutput's fields) plus the raw answer."""
    ids: list
    text: str           # the answer as an evaluator response (Adapter.to_response of the raw answer)
    logprobs: object
    finish_reason: str  # "stop" | "length" | "error: <why>" (the server's: failed after its retries, withheld)
    prompt_index: int
    raw: str = ""       # answer_text of the server's message, lone surrogates replaced


class ServedSampler:
    """A sampler (rollout.semi_online_rollout's `generate`) backed by an OpenAI-compatible server.

    base_url: up to /v1 (".../v1/chat/completions" is posted to); model: the served model's name;
    adapter: the family (evaluation.families.Adapter); api_key: sent as a Bearer token (eval_sop reads it from
    $OPENAI_API_KEY); concurrency: requests in flight at once (threads); timeout: seconds a request may
    take in all; retries: further tries after a network error, the deadline, HTTP 429 or 5xx, waiting
    min(Retry-After or backoff * 2**k, BACKOFF_CAP) seconds before try k + 1 (`sleep` does the waiting:
    tests put a recorder there). Greedy: temperature 0; sampled: `temperature` and the prompt's seed.
    Keeps raw[id(prompt)] = (raw answer, error or None) and messages[id(prompt)] = the server's message
    object (None when none came) for the caller to record; counts requests, retries, failed (steps the
    server answered nothing usable), content_filter (of those, withheld by its filter) and
    lone_surrogates in `stats`."""

    def __init__(self, base_url: str, model: str, adapter, *, api_key: str | None = None,
                 max_new_tokens: int = 512, concurrency: int = 8, timeout: float = 120.0, retries: int = 3,
                 backoff: float = 1.0, temperature: float = 1.0):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.adapter, self.api_key = model, adapter, api_key
        self.max_new_tokens, self.concurrency, self.timeout = max_new_tokens, concurrency, timeout
        self.retries, self.backoff, self.temperature = retries, backoff, temperature
        self.sleep = time.sleep
        self.raw: dict = {}
        self.messages: dict = {}
        self.stats = {"requests": 0, "retries": 0, "failed": 0, "content_filter": 0, "lone_surrogates": 0}
        self._lock = threading.Lock()  # the counters are shared by the request threads

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def _post(self, body: dict) -> tuple[dict, str]:
        """(the message, finish_reason) of one request, within self.timeout seconds in all."""
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        watch = _Sockets()
        timer = threading.Timer(self.timeout, watch.cut)
        timer.start()
        try:
            with _opener(watch).open(req, timeout=self.timeout) as r:
                payload = r.read()
        except urllib.error.HTTPError as e:
            if watch.fired:
                raise ServerError(f"no complete answer from {self.url} within --timeout {self.timeout:g} s",
                                  True) from None
            detail = e.read()[:200].decode("utf-8", "replace")
            err = ServerError(f"HTTP {e.code} from {self.url}: {detail}", e.code == 429 or e.code >= 500)
            err.retry_after = retry_after(e.headers)
            raise err from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # refused, reset, cut
            why = f"within --timeout {self.timeout:g} s" if watch.fired else f"({getattr(e, 'reason', e)})"
            raise ServerError(f"no {'complete ' * watch.fired}answer from {self.url} {why}", True) from None
        finally:
            timer.cancel()
        if watch.fired:  # the body ended at the cut, no error raised (a reply without Content-Length)
            raise ServerError(f"no complete answer from {self.url} within --timeout {self.timeout:g} s", True)
        try:
            choice = json.loads(payload)["choices"][0]
            message = choice["message"]
            if not isinstance(message, dict):
                raise TypeError(f"message is {type(message).__name__}")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ServerError(f"{self.url} answered no chat completion ({type(e).__name__}: {e}): "
                              f"{payload[:120]!r}", False) from None
        return message, choice.get("finish_reason")

    def _one(self, prompt, greedy: bool, seed) -> tuple[str, str, dict | None]:
        """(raw answer, finish reason, message) of one prompt, after the retries; never raises."""
        body = {"model": self.model, "max_tokens": self.max_new_tokens,
                "messages": openai_messages(prompt.messages, self.adapter, prompt.resized_size),
                "temperature": 0.0 if greedy else self.temperature}
        if seed is not None:
            body["seed"] = int(seed) % (2**31)
        for k in range(self.retries + 1):
            self._count("requests")
            message = None
            try:
                message, finish = self._post(body)
                raw, n_bad = clean_text(answer_text(message))
                self._count("lone_surrogates", n_bad)
                if finish == "content_filter":  # the server withheld (part of) the answer: not the model's
                    self._count("failed"), self._count("content_filter")
                    return raw, "error: content_filter: the server's content filter withheld the answer", message
                if finish not in FINISH and finish is not None:
                    raise ServerError(f"{self.url} ended the answer with finish_reason {finish!r}", False)
                return raw, FINISH.get(finish, "stop"), message
            except ServerError as e:
                if not e.transient or k == self.retries:
                    self._count("failed")
                    return "", f"error: {e}", message
                self._count("retries")
                wait = getattr(e, "retry_after", None)
                self.sleep(min(BACKOFF_CAP, self.backoff * 2**k if wait is None else wait))
        raise AssertionError("unreachable")

    def generate(self, prompts: list, n: int | list[int] = 1, greedy: bool = True, seeds=None):
        """outs[i][j] for j < n[i]: the answers to prompts[i] (chat.Prompt with messages), as
        ServedOutput. Never raises on a server fault (finish_reason says it)."""
        ns = [n] * len(prompts) if isinstance(n, int) else list(n)
        jobs = [(i, j) for i, k in enumerate(ns) for j in range(k)]

        def run(job):
            i, j = job
            seed = None if seeds is None else seeds[i] + j
            return self._one(prompts[i], greedy, seed)

        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            answers = list(pool.map(run, jobs))
        outs = [[] for _ in prompts]
        for (i, _), (raw, finish, message) in zip(jobs, answers):
            failed = finish.startswith("error")
            text = self.adapter.to_response(raw, prompts[i].resized_size) if not failed else ""
            outs[i].append(ServedOutput([], text, None, finish, i, raw))
            self.raw[id(prompts[i])] = (raw, finish[len("error: "):] if failed else None)
            self.messages[id(prompts[i])] = message
        return outs


# -----------------------------------------------------------------------------
# the prompt contract of a served checkpoint


def contract_folder(path: str) -> Path | None:
    """The folder holding the args.json of `path`: path itself, or the checkpoint its `latest` names."""
    p = Path(path)
    if (p / "args.json").is_file():
        return p
    ckpt = utils.latest_checkpoint(p) if p.is_dir() else None
    return ckpt if ckpt is not None and (ckpt / "args.json").is_file() else None


def prompt_spec(args, say=print) -> chat.PromptSpec:
    """The prompt contract of --policy openai: the args.json of --prompt-from (a checkpoint or run folder),
    else of --served-model when it names such a local folder, else chat.PromptSpec's defaults (said on
    stderr for --action-format uis1, whose checkpoints carry a contract). A contract flag given on the
    command line that disagrees with the checkpoint's raises utils.UsageError (the served model was trained
    on the checkpoint's prompt). Sets args.prompt_from (the folder read, or None) and, when --tokenizer is
    not given, args.tokenizer to that folder where it holds a tokenizer; returns chat.resolve_spec's spec."""
    src = None
    if getattr(args, "prompt_from", None):
        src = contract_folder(args.prompt_from)
        if src is None:
            raise utils.UsageError(f"--prompt-from {args.prompt_from}: no args.json there (nor in the checkpoint its "
                                   "`latest` names): expected a checkpoint or run folder of train_sft.py or "
                                   "train_semionline.py")
    elif args.served_model and Path(args.served_model).is_dir():
        src = contract_folder(args.served_model)
    saved = chat.checkpoint_spec(src) if src is not None else {}
    for name, value in saved.items():
        given = getattr(args, name, None)
        if given is not None and given != value:
            raise utils.UsageError(f"--{name.replace('_', '-')} {given}: the served checkpoint's prompt contract has "
                                   f"{value} ({src}/args.json); drop the flag, or serve a model trained with it")
    if src is None and args.action_format == "uis1":
        print("eval_sop: the prompt contract is PromptSpec's defaults (no --prompt-from); a checkpoint of this "
              "project needs its own: --prompt-from CKPT_DIR", file=sys.stderr)
    args.prompt_from = str(src) if src is not None else None
    if args.tokenizer is None and src is not None and (src / "tokenizer_config.json").is_file():
        args.tokenizer = str(src)
    return chat.resolve_spec(args, str(src) if src is not None else "none", say=say)
