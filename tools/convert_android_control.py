"""AndroidControl from Google's release (GZIP TFRecord shards) to PNG screenshots and UI-S1 JSONL episodes, no TensorFlow.

Input (google-research `android_control/README.md`; docs/android_control.md has the details): a folder
with the shards `android_control-000NN-of-00020` and, optionally, `splits.json` ({split: [episode_id,
...]}). Each shard is one GZIP stream of TFRecords: per record, uint64 length (little-endian), masked
crc32c of those 8 bytes, the data, masked crc32c of the data. Each record is one serialized
`tf.train.Example`, one episode: `episode_id` (int64), `goal` (bytes), `screenshots` (PNG bytes, one
per observation), `screenshot_widths` / `screenshot_heights` (int64, one per observation),
`accessibility_trees` (serialized android_env `AndroidAccessibilityForest`, one per observation),
`actions` (JSON bytes, one fewer than screenshots; may be absent when there is none) and
`step_instructions` (bytes, one per action). Both protobuf messages are read by the small wire-format
decoder below (varints and length-delimited fields; field numbers from tensorflow's example.proto /
feature.proto and android_env's proto/a11y/*.proto), so neither `protobuf` nor `android_env` is needed.

Output, in OUT:
- images/{episode_id}_{k}.png: observation k of the episode, every one (also the last, which has no
  action), the PNG bytes as shipped (pixel-exact; a non-PNG image is re-encoded losslessly as PNG);
- {split}.jsonl: one episode per line in the UI-S1 layout that dataset.load_episodes reads: goal,
  episode_id, swipe_convention "finger", steps with action_content, screenshot ("images/..." relative
  to OUT), image_size [W, H], step_instruction (absent when empty or blank) and check_options (the
  action plus, for click / long_press, candidate_bbox: the interactive accessibility nodes of that
  observation holding the point, smallest first). With --split S only S.jsonl; without, one file per
  split of splits.json (train.jsonl, validation.jsonl, test.jsonl) in one pass, episodes listed in no
  split in unsplit.jsonl (all.jsonl when there is no splits.json);
- convert_summary.json: the summary also printed as the last stdout line (episodes, steps, actions per
  type, episodes without actions, records skipped and why).

Actions (docs/android_control.md, "Action mapping"): click / long_press -> click / long_press at (x, y)
in pixels of that observation's screenshot; scroll `direction` (the side the content comes from) ->
swipe of the FINGER, which moves the opposite way on both axes; input_text -> type; open_app -> open;
navigate_back / navigate_home -> system_button Back / Home; wait -> wait (extras/android_control.py's
release_action, which the loader of the native per-step JSON shares). --terminate appends the
train-style final step {"action": "terminate", "status": "success"} on the last observation.

Bad input is never dropped silently: a corrupted shard (gzip error, truncated record, CRC mismatch),
a record that is not an Example, a screenshot whose size disagrees with its declared width / height,
counts that do not add up (actions = screenshots - 1), an unknown action type stop the run with one
line `convert_android_control.py: error: <shard>:<record>: <field>: <what>` and exit code 2; with
--skip-bad the record (or, when the framing itself is broken, the rest of its shard) is skipped and
listed in the summary. An episode with no action is not written (nothing to imitate) and is listed.

Commands:
    # the test split, as the release's evaluation file (no terminate step)
    python tools/convert_android_control.py --src /data/android_control_raw --out /data/ac --split test
    # the training split, train-style (a terminate step ends every episode)
    python tools/convert_android_control.py --src /data/android_control_raw --out /data/ac --split train --terminate
    # every split in one pass; bad records skipped and listed in /data/ac/convert_summary.json
    python tools/convert_android_control.py --src /data/android_control_raw --out /data/ac --skip-bad
    # then, e.g., the expert replay (must give PG = TSR = 1.0)
    python eval_sop.py --data /data/ac/test.jsonl --image-root /data/ac --policy expert
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import struct
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

from PIL import Image
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: utils, gui
import cli  # noqa: E402
import utils  # noqa: E402
import dataset  # noqa: E402
# the action mapping (docs/android_control.md), shared with the loader of the native per-step JSON
from extras.android_control import Bad, release_action  # noqa: E402

# -----------------------------------------------------------------------------
# Config

SHARD_GLOB = "android_control-*-of-*"
# Interactive nodes: those a tap can be aimed at. Scrollable and merely focusable nodes are left out:
# a scroll container covers most of the screen and would name no target.
INTERACTIVE_FLAGS = {12: "is_checkable", 14: "is_clickable", 15: "is_editable", 19: "is_long_clickable"}
SWIPE_CONVENTION = "finger"  # dataset.SWIPE_CONVENTIONS: every swipe we write is the finger's path


def build_parser():
    p = cli.make_parser(__doc__)
    p.add_argument("--src", required=True, type=cli.arg_type(cli.input_dir),
                   help="folder with the shards android_control-000NN-of-00020 (and splits.json)")
    p.add_argument("--out", required=True, help="output folder: images/, {split}.jsonl, convert_summary.json")
    p.add_argument("--split", default=None, choices=["train", "validation", "test"], help="convert only this split of SRC/splits.json (train, validation "
                   "or test), written to OUT/{split}.jsonl (default: every split, one file each, in one pass)")
    p.add_argument("--terminate", action="store_true",
                   help="end every episode with {\"action\": \"terminate\", \"status\": \"success\"} on its last "
                   "observation, as the release's training file (its evaluation file has none)")
    p.add_argument("--limit", type=cli.positive_int, default=None, help="stop after this many episodes written (default: all)")
    p.add_argument("--skip-bad", action="store_true", help="skip a bad record (a broken shard: the rest of it) and "
                   "list it in the summary instead of stopping with an error")
    return p


class RecordError(dataset.DataError):
    """A record (or shard) that cannot be converted: `<shard>:<record>: <field>: <what>`. lost_rest:
    the shard's framing is broken, so no later record of it can be read either."""

    def __init__(self, shard: str, record: int, field: str, what: str, *, lost_rest: bool = False,
                 episode_id: int | None = None):
        super().__init__(f"{shard}:{record}: {field}: {what}")
        self.shard, self.record, self.field, self.what = shard, record, field, what
        self.lost_rest, self.episode_id = lost_rest, episode_id


# -----------------------------------------------------------------------------
# crc32c (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord frames use it

def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c_py(data: bytes) -> int:
    """crc32c of `data`, byte at a time from a 256-entry table: the fallback (~10 MB/s, well over an
    hour for the ~50 GB release; google-crc32c does GB/s)."""
    crc, table = 0xFFFFFFFF, _CRC_TABLE
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:  # the C implementation when installed (requirements.txt), else the table above
    import google_crc32c

    def crc32c(data: bytes) -> int:
        """crc32c of `data` (google-crc32c)."""
        return google_crc32c.value(bytes(data))
    CRC_IMPLEMENTATION = "google-crc32c"
except ImportError:
    crc32c = crc32c_py
    CRC_IMPLEMENTATION = "pure Python (pip install google-crc32c: ~100x faster)"


def masked_crc(data: bytes) -> int:
    """TFRecord's masked crc32c: rotate right by 15 bits, add 0xa282ead8 (mod 2^32). The mask keeps
    a CRC of bytes that themselves hold a CRC from being trivially predictable."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -----------------------------------------------------------------------------
# TFRecord framing inside one GZIP stream

def read_records(path: str, progress=None):
    """Yield (index, data, error) for every record of the GZIP-compressed TFRecord file `path`: data
    a memoryview and error None, or, on a data CRC mismatch, error a RecordError (not raised: the
    length was sound, so the next record can still be read). Raises RecordError(path, index, ...,
    lost_rest=True) on a file that is not gzip, a gzip stream that breaks, a truncated record or a
    length CRC mismatch (no later record can be found then). progress(n): compressed bytes consumed
    since the last call, for a progress bar."""
    with open(path, "rb") as raw:
        if raw.read(2) != b"\x1f\x8b":
            raise RecordError(path, 0, "gzip", "not a gzip file (AndroidControl shards are GZIP-compressed "
                              "TFRecords)", lost_rest=True)
        raw.seek(0)
        gz = gzip.GzipFile(fileobj=raw, mode="rb")
        index, seen = 0, 0

        def read(n, what):
            try:
                buf = gz.read(n)
            except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; EOFError: cut short
                raise RecordError(path, index, "gzip", f"{type(e).__name__}: {e}", lost_rest=True) from None
            if len(buf) != n and (buf or what != "length"):
                raise RecordError(path, index, what, f"truncated: {len(buf)} of {n} bytes", lost_rest=True)
            return buf

        while True:
            head = read(8, "length")
            if not head:
                return
            (length,) = struct.unpack("<Q", head)
            (crc,) = struct.unpack("<I", read(4, "length_crc"))
            if masked_crc(head) != crc:
                raise RecordError(path, index, "length_crc", f"crc32c mismatch (length field {length})", lost_rest=True)
            data = read(length, "data")
            (crc,) = struct.unpack("<I", read(4, "data_crc"))
            if progress is not None:
                progress(raw.tell() - seen)
                seen = raw.tell()
            bad = None
            if masked_crc(data) != crc:
                bad = RecordError(path, index, "data_crc", f"crc32c mismatch over {length} bytes")
            yield index, memoryview(data), bad
            index += 1


# -----------------------------------------------------------------------------
# Protocol-buffer wire format: just enough to read tf.train.Example and the accessibility forest

class ProtoError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtoError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if result >> 64:  # ten bytes hold 70 bits: int64 / uint64 fields hold 64
            raise ProtoError("varint exceeds 64 bits")
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtoError("varint longer than 10 bytes")


def _signed(v: int) -> int:
    """int32/int64 fields hold negatives as 64-bit two's complement varints."""
    return v - (1 << 64) if v >= 1 << 63 else v


def proto_fields(buf):
    """Yield (field number, wire type, value) of a serialized message: an int for varints (wire type
    0), a memoryview for length-delimited fields (2) and fixed 64/32-bit fields (1, 5). Raises
    ProtoError on truncation, field number 0 or the deprecated group wire types (3, 4)."""
    buf = memoryview(buf)
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise ProtoError("field number 0")
        if wt == 0:
            v, pos = _varint(buf, pos)
        elif wt in (1, 2, 5):
            if wt == 2:
                size, pos = _varint(buf, pos)
            else:
                size = 8 if wt == 1 else 4
            if pos + size > n:
                raise ProtoError(f"field {num}: {size} bytes run past the end of the message")
            v, pos = buf[pos:pos + size], pos + size
        else:
            raise ProtoError(f"field {num}: unsupported wire type {wt}")
        yield num, wt, v


def _repeated_ints(wt: int, v) -> list[int]:
    """A repeated varint field's occurrence: packed (wire type 2, proto3's default) or one value."""
    if wt == 0:
        return [_signed(v)]
    if wt != 2:
        raise ProtoError(f"expected a varint list, got wire type {wt}")
    out, pos = [], 0
    while pos < len(v):
        x, pos = _varint(v, pos)
        out.append(_signed(x))
    return out


# tensorflow/core/example/{example,feature}.proto: Example.features = 1; Features.feature = 1
# (map<string, Feature>: entry key = 1, value = 2); Feature: bytes_list = 1, float_list = 2,
# int64_list = 3; each list's values are its field 1 (floats and int64s packed by default).
_FEATURE_KINDS = {1: "bytes_list", 2: "float_list", 3: "int64_list"}


def _feature(buf) -> tuple[str | None, list]:
    kind, values = None, []
    for num, wt, v in proto_fields(buf):
        if num not in _FEATURE_KINDS or wt != 2:
            continue
        kind, values = _FEATURE_KINDS[num], []  # oneof: the last one set wins
        for n2, w2, x in proto_fields(v):
            if n2 != 1:
                continue
            if kind == "bytes_list":
                values.append(x)
            elif kind == "int64_list":
                values += _repeated_ints(w2, x)
            elif w2 == 5:
                values.append(struct.unpack("<f", x)[0])
            else:
                values += [f for (f,) in struct.iter_unpack("<f", x)]
    return kind, values


def parse_example(buf) -> dict[str, tuple[str | None, list]]:
    """Serialized tf.train.Example -> {feature name: (kind, values)}; kind is "bytes_list" (values
    are memoryviews), "int64_list", "float_list", or None for an empty Feature. Raises ProtoError."""
    out = {}
    for num, wt, features in proto_fields(buf):
        if num != 1 or wt != 2:
            continue
        for n2, w2, entry in proto_fields(features):
            if n2 != 1 or w2 != 2:
                continue
            key, value = "", b""  # proto3 map entry: absent key / value are the defaults
            for n3, w3, v in proto_fields(entry):
                if n3 == 1 and w3 == 2:
                    key = bytes(v).decode("utf-8", errors="replace")
                elif n3 == 2 and w3 == 2:
                    value = v
            out[key] = _feature(value)
    return out


# android_env/proto/a11y: AndroidAccessibilityForest.windows = 1; AndroidAccessibilityWindowInfo.tree
# = 11; AndroidAccessibilityTree.nodes = 1; AndroidAccessibilityNodeInfo.bounds_in_screen = 2
# (ProtoRect: left 1, top 2, right 3, bottom 4), flags in INTERACTIVE_FLAGS.

def interactive_boxes(forest) -> list[tuple[int, int, int, int]]:
    """The bounds (left, top, right, bottom), screen pixels, of every interactive node (one of
    INTERACTIVE_FLAGS set) of every window of a serialized AndroidAccessibilityForest. Raises
    ProtoError."""
    boxes = []
    for num, wt, window in proto_fields(forest):
        if num != 1 or wt != 2:
            continue
        for n2, w2, tree in proto_fields(window):
            if n2 != 11 or w2 != 2:
                continue
            for n3, w3, node in proto_fields(tree):
                if n3 != 1 or w3 != 2:
                    continue
                rect, interactive = None, False
                for n4, w4, v in proto_fields(node):
                    if n4 == 2 and w4 == 2:
                        r = {1: 0, 2: 0, 3: 0, 4: 0}
                        for n5, w5, x in proto_fields(v):
                            if n5 in r and w5 == 0:
                                r[n5] = _signed(x)
                        rect = (r[1], r[2], r[3], r[4])
                    elif n4 in INTERACTIVE_FLAGS and w4 == 0 and v:
                        interactive = True
                if interactive and rect is not None:
                    boxes.append(rect)
    return boxes


def candidate_bbox(boxes, x: int, y: int, size: tuple[int, int]) -> list[list[int]]:
    """The boxes holding the point (x, y) (edges included), clipped to the screenshot (W, H) =
    size, empty ones and duplicates dropped, smallest area first (ties: top-left first). All in
    pixels of that screenshot (the accessibility bounds are the device screen's, which the
    screenshot shows 1:1)."""
    w, h = size
    out = set()
    for x1, y1, x2, y2 in boxes:
        if x1 <= x <= x2 and y1 <= y <= y2:
            c = (max(x1, 0), max(y1, 0), min(x2, w), min(y2, h))
            if c[2] > c[0] and c[3] > c[1]:  # gui rejects empty boxes: no point could be inside
                out.add(c)
    return [list(b) for b in sorted(out, key=lambda b: ((b[2] - b[0]) * (b[3] - b[1]), b))]


# -----------------------------------------------------------------------------
# One record -> one episode

def _get(feats, name, kind, *, required=True):
    if name not in feats:
        if required:
            raise Bad(name, "missing")
        return []
    k, values = feats[name]
    if k is not None and k != kind:
        raise Bad(name, f"expected a {kind}, got a {k}")
    return values


def _utf8(v, fld):
    try:
        return bytes(v).decode("utf-8")
    except UnicodeDecodeError as e:
        raise Bad(fld, f"not UTF-8 (byte {e.start})") from None


def episode_id_of(feats) -> int:
    """The record's episode_id (one int64). Raises Bad."""
    ids = _get(feats, "episode_id", "int64_list")
    if len(ids) != 1:
        raise Bad("episode_id", f"expected one int64, got {len(ids)}")
    return ids[0]


def convert_episode(feats, *, terminate: bool) -> tuple[dict | None, list[tuple[str, bytes]], Counter]:
    """A parsed Example (parse_example) -> (episode dict for the JSONL or None when it has no action,
    [(image file name, PNG bytes)] for every observation, Counter of native action types). Checks
    everything before anything is written: raises Bad naming the feature (with its index) that is
    missing, of the wrong kind, of the wrong count, or disagrees with its screenshot."""
    eid = episode_id_of(feats)
    goals = _get(feats, "goal", "bytes_list")
    if len(goals) != 1:
        raise Bad("goal", f"expected one string, got {len(goals)}")
    goal = _utf8(goals[0], "goal")
    shots = _get(feats, "screenshots", "bytes_list")
    n = len(shots)
    if n == 0:
        raise Bad("screenshots", "none: an episode has at least one observation")
    widths = _get(feats, "screenshot_widths", "int64_list")
    heights = _get(feats, "screenshot_heights", "int64_list")
    trees = _get(feats, "accessibility_trees", "bytes_list", required=False)
    actions = _get(feats, "actions", "bytes_list", required=False)  # absent when the episode has none
    instructions = _get(feats, "step_instructions", "bytes_list", required=False)
    for name, values, want in (("screenshot_widths", widths, n), ("screenshot_heights", heights, n),
                               ("accessibility_trees", trees, n), ("actions", actions, n - 1),
                               ("step_instructions", instructions, len(actions))):
        if len(values) != want and (values or name in ("screenshot_widths", "screenshot_heights", "actions")):
            raise Bad(name, f"{len(values)} values for {n} screenshots (expected {want})")

    # screenshots: decoded size must be the declared one, or every point would be misplaced
    images, sizes = [], []
    for k, raw in enumerate(shots):
        w, h = widths[k], heights[k]
        if w <= 0 or h <= 0:
            raise Bad(f"screenshot_widths/heights[{k}]", f"not a positive size: {w}x{h}")
        data = bytes(raw)
        try:
            with Image.open(io.BytesIO(data)) as im:
                fmt, decoded = im.format, im.size
                im.verify()  # chunk CRCs and structure, without decoding pixels
            if fmt != "PNG":  # re-encode losslessly: the files are named .png
                with Image.open(io.BytesIO(data)) as im:
                    buf = io.BytesIO()
                    im.save(buf, format="PNG")
                    data = buf.getvalue()
        except (OSError, SyntaxError, ValueError, EOFError, struct.error) as e:  # PIL's errors on broken images
            raise Bad(f"screenshots[{k}]", f"not a readable image: {type(e).__name__}: {e}") from None
        if decoded != (w, h):
            raise Bad(f"screenshots[{k}]", f"decoded {decoded[0]}x{decoded[1]} (W x H) but screenshot_widths/heights "
                      f"declare {w}x{h}")
        images.append((f"{eid}_{k}.png", data))
        sizes.append((w, h))
    if not actions:
        return None, images, Counter()

    steps, native = [], Counter()
    for k, raw in enumerate(actions):
        try:
            act = json.loads(_utf8(raw, f"actions[{k}]"))
        except json.JSONDecodeError as e:
            raise Bad(f"actions[{k}]", f"invalid JSON: {e.msg}") from None
        except ValueError as e:  # an integer literal past Python's digit limit
            raise Bad(f"actions[{k}]", f"a number does not fit: {e}") from None
        try:
            action = release_action(act, sizes[k])
        except Bad as e:
            raise Bad(f"actions[{k}].{e.field}", e.what) from None
        native[act["action_type"]] += 1
        step = {"action_content": action, "screenshot": f"images/{eid}_{k}.png", "image_size": list(sizes[k])}
        if instructions:
            text = _utf8(instructions[k], f"step_instructions[{k}]")
            if text.strip():  # verbatim, as the release keeps them; an empty one is left out
                step["step_instruction"] = text
        check = dict(action)
        if action["action"] in ("click", "long_press"):
            try:
                boxes = interactive_boxes(trees[k]) if trees else []
            except ProtoError as e:
                raise Bad(f"accessibility_trees[{k}]", str(e)) from None
            check["candidate_bbox"] = candidate_bbox(boxes, *action["coordinate"], sizes[k])
        step["check_options"] = check
        steps.append(step)
    if terminate:
        steps.append({"action_content": {"action": "terminate", "status": "success"},
                      "screenshot": f"images/{eid}_{n - 1}.png", "image_size": list(sizes[n - 1]),
                      "check_options": {"action": "terminate", "status": "success"}})
    episode = {"goal": goal, "episode_id": eid, "swipe_convention": SWIPE_CONVENTION, "steps": steps}
    return episode, images, native


# -----------------------------------------------------------------------------
# main

def load_splits(src: str) -> tuple[dict[int, str] | None, list[str]]:
    """SRC/splits.json ({split: [episode ids]}) -> ({episode id: split}, split names), or (None, [])
    without the file. Raises UsageError on a malformed file or an id listed in two splits."""
    path = os.path.join(src, "splits.json")
    if not os.path.isfile(path):
        return None, []
    try:
        obj = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise utils.UsageError(f"{path}: not JSON: {e}") from None
    if not isinstance(obj, dict) or not all(isinstance(v, list) for v in obj.values()):
        raise utils.UsageError(f"{path}: expected {{split name: [episode ids]}}")
    out = {}
    for split, ids in obj.items():
        for i in ids:
            try:
                i = int(i)
            except (TypeError, ValueError):
                raise utils.UsageError(f"{path}: split {split!r}: episode id {i!r} is not an integer") from None
            if out.setdefault(i, split) != split:
                raise utils.UsageError(f"{path}: episode {i} is in both {out[i]!r} and {split!r}")
    return out, list(obj)


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    t0 = time.time()
    shards = sorted(glob.glob(os.path.join(args.src, SHARD_GLOB)))
    if not shards:
        raise utils.UsageError(f"--src {args.src}: no shards named {SHARD_GLOB} in it")
    if args.limit is not None and args.limit < 1:
        raise utils.UsageError(f"--limit {args.limit}: need at least 1")
    split_of, split_names = load_splits(args.src)
    if args.split is not None:
        if split_of is None:
            raise utils.UsageError(f"--split {args.split} needs {os.path.join(args.src, 'splits.json')}")
        if args.split not in split_names:
            raise utils.UsageError(f"--split {args.split}: not in splits.json (it has: {', '.join(split_names)})")
    os.makedirs(os.path.join(args.out, "images"), exist_ok=True)
    if CRC_IMPLEMENTATION != "google-crc32c":
        print(f"note: crc32c is {CRC_IMPLEMENTATION}", file=sys.stderr)

    outputs: dict[str, object] = {}

    def output(name):
        if name not in outputs:
            outputs[name] = open(os.path.join(args.out, f"{name}.jsonl"), "w", encoding="utf-8")
        return outputs[name]

    if args.split is not None:
        output(args.split)  # the file exists even if no episode lands in it
    episodes, steps, images = Counter(), 0, 0
    native, ours = Counter(), Counter()
    no_actions, skipped, seen = [], [], {}
    # progress in compressed bytes (records per shard are not known in advance); off a terminal none,
    # so that an error stays the one line on stderr
    bar = tqdm(total=sum(os.path.getsize(s) for s in shards), unit="B", unit_scale=True, desc="convert",
               file=sys.stderr, disable=None)
    done = False
    try:
        for shard in shards:
            name = os.path.basename(shard)
            records = read_records(shard, progress=bar.update)
            while not done:
                try:
                    index, data, bad = next(records)
                    if bad is not None:
                        raise bad
                except StopIteration:
                    break
                except RecordError as e:
                    if not args.skip_bad:
                        raise
                    skipped.append({"shard": name, "record": e.record, "field": e.field, "what": e.what,
                                    "episode_id": None, "rest_of_shard": e.lost_rest})
                    if e.lost_rest:  # the generator is finished: on to the next shard
                        break
                    continue
                eid = None
                try:
                    try:
                        feats = parse_example(data)
                    except ProtoError as e:
                        raise Bad("example", f"not a tf.train.Example: {e}") from None
                    eid = episode_id_of(feats)
                    split = (split_of or {}).get(eid, "unsplit" if split_of is not None else "all")
                    if args.split is not None and split != args.split:
                        continue
                    if eid in seen:
                        raise Bad("episode_id", f"{eid} already read from {seen[eid]}")
                    try:
                        episode, imgs, acts = convert_episode(feats, terminate=args.terminate)
                    except OverflowError as e:  # any other number too big for what it is used as
                        raise Bad("record", f"a number does not fit: {e}") from None
                    seen[eid] = f"{name}:{index}"  # a good copy only: a bad first copy leaves the id free
                except Bad as e:
                    if not args.skip_bad:
                        raise RecordError(shard, index, e.field, e.what, episode_id=eid) from None
                    skipped.append({"shard": name, "record": index, "field": e.field, "what": e.what,
                                    "episode_id": eid, "rest_of_shard": False})
                    continue
                for fname, png in imgs:
                    with open(os.path.join(args.out, "images", fname), "wb") as f:
                        f.write(png)
                images += len(imgs)
                if episode is None:
                    no_actions.append(eid)
                    continue
                episode["source"] = f"{name}:{index}"  # where it came from, for anyone tracing a step back
                output(split).write(json.dumps(episode, ensure_ascii=False, allow_nan=False) + "\n")
                episodes[split] += 1
                steps += len(episode["steps"])
                native.update(acts)
                ours.update(s["action_content"]["action"] for s in episode["steps"])
                bar.set_postfix(episodes=sum(episodes.values()), skipped=len(skipped), refresh=False)
                done = args.limit is not None and sum(episodes.values()) >= args.limit
            if done:
                break
    finally:
        bar.close()
        for f in outputs.values():
            f.close()

    # --- summary: which ids of splits.json never turned up (only meaningful after a full pass)
    missing = None
    if split_of is not None and args.limit is None:
        wanted = [i for i, s in split_of.items() if args.split is None or s == args.split]
        missing = Counter(split_of[i] for i in wanted if i not in seen)
    summary = {"episodes": sum(episodes.values()), "episodes_per_split": dict(episodes), "steps": steps,
               "images": images, "actions": dict(ours), "native_actions": dict(native),
               "no_actions": {"count": len(no_actions), "episode_ids": no_actions},
               "skipped": {"count": len(skipped), "records": skipped},
               "missing_from_shards": dict(missing) if missing is not None else None,
               "outputs": {k: os.path.join(args.out, f"{k}.jsonl") for k in outputs},
               "terminate": args.terminate, "swipe_convention": SWIPE_CONVENTION, "crc32c": CRC_IMPLEMENTATION,
               "shards": len(shards), "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(args.out, "convert_summary.json"), "w", encoding="utf-8") as f:
        f.write(utils.dumps(summary, indent=1, ensure_ascii=False))
    print(f"{summary['episodes']} episodes ({', '.join(f'{k} {v}' for k, v in episodes.items()) or 'none'}), "
          f"{steps} steps, {images} images; actions: {', '.join(f'{k} {v}' for k, v in ours.most_common())}")
    print(f"no actions (not written): {len(no_actions)}; skipped: {len(skipped)}"
          + "".join(f"\n  {s['shard']}:{s['record']}: {s['field']}: {s['what']}"
                    + (" (and the rest of the shard)" if s["rest_of_shard"] else "") for s in skipped[:20])
          + (f"\n  ... {len(skipped) - 20} more in convert_summary.json" if len(skipped) > 20 else ""))
    if missing:
        print(f"listed in splits.json but in no shard: {dict(missing)}")
    print(utils.dumps(summary, ensure_ascii=False))
    return summary


if __name__ == "__main__":
    cli.run_script(main)
