"""tools/convert_android_control.py on small shards this test writes itself in Google's format: a
GZIP stream of TFRecords (uint64 length, masked crc32c, data, masked crc32c), each a tf.train.Example
episode whose accessibility trees are android_env AndroidAccessibilityForest messages. The writer
below is an independent encoder of the same wire format; the byte-level tests pin both sides to
hand-computed bytes and to published crc32c vectors, so a wrong field number cannot agree with itself.

Checked: every action type round-trips to the expected action dict (scrolls in all four directions as
finger swipes, unicode text), screenshots of different sizes in one episode are written pixel-exact,
empty / blank / repeated step instructions, candidate boxes (interactive nodes holding the point,
smallest first), a zero-action episode, --terminate, expert replay PG = TSR = 1.0 through
eval_sop.main, and every kind of bad input: one line naming <shard>:<record>: <field>, exit 2, or with
--skip-bad the record skipped and listed."""

import gzip
import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import dataset
import eval_sop
import gui
import reward
from extras import android_control

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import convert_android_control as conv  # noqa: E402

SHARD0, SHARD1 = "android_control-00000-of-00002", "android_control-00001-of-00002"


# -----------------------------------------------------------------------------
# The writer: protobuf wire format, tf.train.Example, accessibility forest, TFRecord framing

def varint(v: int) -> bytes:
    v &= (1 << 64) - 1  # negatives as 64-bit two's complement, as protobuf writes int32/int64
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def ld(num: int, payload: bytes) -> bytes:  # length-delimited field (wire type 2)
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def vi(num: int, v: int) -> bytes:  # varint field (wire type 0)
    return varint(num << 3) + varint(v)


def bytes_feature(values) -> bytes:  # Feature.bytes_list = 1 -> BytesList.value = 1
    return ld(1, b"".join(ld(1, v if isinstance(v, bytes) else v.encode()) for v in values))


def int64_feature(values) -> bytes:  # Feature.int64_list = 3 -> Int64List.value = 1, packed
    return ld(3, ld(1, b"".join(varint(v) for v in values)))


def example(features: dict) -> bytes:  # Example.features = 1 -> Features.feature = 1 (map entries)
    return ld(1, b"".join(ld(1, ld(1, k.encode()) + ld(2, f)) for k, f in features.items()))


NODE_FLAGS = {"checkable": 12, "clickable": 14, "editable": 15, "long_clickable": 19, "scrollable": 21,
              "focusable": 17}


def node(bounds, *flags, text="") -> bytes:
    """AndroidAccessibilityNodeInfo: unique_id 1, bounds_in_screen 2 (ProtoRect left/top/right/bottom
    1-4), class_name 3, text 7, the flags' bools."""
    rect = b"".join(vi(i + 1, c) for i, c in enumerate(bounds))
    return (vi(1, 5) + ld(2, rect) + ld(3, b"android.widget.View") + (ld(7, text.encode()) if text else b"")
            + b"".join(vi(NODE_FLAGS[f], 1) for f in flags))


def forest(*windows) -> bytes:
    """AndroidAccessibilityForest.windows 1 -> WindowInfo (id 3, tree 11) -> Tree.nodes 1."""
    return b"".join(ld(1, vi(3, i) + ld(11, b"".join(ld(1, n) for n in nodes))) for i, nodes in enumerate(windows))


def masked_crc(data: bytes) -> int:
    c = conv.crc32c_py(data)
    return ((c >> 15 | c << 17) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    n = struct.pack("<Q", len(data))
    return n + struct.pack("<I", masked_crc(n)) + data + struct.pack("<I", masked_crc(data))


def write_shard(path, records: list[bytes]) -> None:
    with gzip.open(path, "wb") as f:
        f.write(b"".join(tfrecord(r) for r in records))


def png(size, seed: int, fmt="PNG") -> tuple[bytes, np.ndarray]:
    a = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format=fmt)
    return buf.getvalue(), a


def episode_record(eid, goal, sizes, actions, instructions=None, trees=None, shots=None, replace=None) -> bytes:
    """One Example in AndroidControl's layout; `replace` {feature: encoded Feature, or None to leave it
    out} damages it."""
    shots = shots or [png(s, eid * 100 + k)[0] for k, s in enumerate(sizes)]
    feats = {"episode_id": int64_feature([eid]), "goal": bytes_feature([goal]),
             "screenshots": bytes_feature(shots),
             "screenshot_widths": int64_feature([s[0] for s in sizes]),
             "screenshot_heights": int64_feature([s[1] for s in sizes]),
             "accessibility_trees": bytes_feature(trees if trees is not None else [forest([]) for _ in sizes])}
    if actions is not None:
        feats["actions"] = bytes_feature([json.dumps(a, ensure_ascii=False) for a in actions])
    if instructions is not None:
        feats["step_instructions"] = bytes_feature(instructions)
    for k, v in (replace or {}).items():
        if v is None:
            feats.pop(k, None)
        else:
            feats[k] = v
    return example(feats)


# -----------------------------------------------------------------------------
# The data set: episode 7 has every action type; 8 none; 9 a JPEG and no tree boxes; 10 is train

S1, S2 = (108, 240), (120, 200)  # (W, H): two screenshot sizes within one episode
GOAL7 = "Order crème brûlée in 東京 🍰"
EP7 = [  # (native action, step instruction, forest of that observation, expected action, expected boxes)
    ({"action_type": "click", "x": 50, "y": 100}, "Tap the button",
     forest([node((0, 0, 108, 240), "clickable"), node((40, 90, 70, 110), "clickable", text="Buy"),
             node((40, 90, 70, 110), "clickable"),         # a duplicate: listed once
             node((45, 95, 60, 105), text="label"),        # holds the point, not interactive
             node((45, 95, 60, 105), "scrollable", "focusable"),  # nor are these flags
             node((0, 200, 108, 230), "editable"),          # interactive, elsewhere
             node((-5, -10, 60, 130), "checkable"),         # partly off-screen: clipped
             node((50, 100, 50, 120), "clickable")],        # zero width: dropped
            [node((30, 80, 80, 120), "long_clickable")]),   # a second window
     {"action": "click", "coordinate": [50, 100]},
     [[40, 90, 70, 110], [30, 80, 80, 120], [0, 0, 60, 130], [0, 0, 108, 240]]),
    ({"action_type": "long_press", "x": 10.6, "y": 20.4}, "", forest([node((0, 0, 30, 40), "long_clickable")]),
     {"action": "long_press", "coordinate": [11, 20], "time": 2}, [[0, 0, 30, 40]]),
    # scroll `direction` = the side the content comes from; the finger starts there (S1: W 108, H 240)
    ({"action_type": "scroll", "direction": "down"}, "Scroll through the list", forest([]),
     {"action": "swipe", "coordinate": [54, 180], "coordinate2": [54, 60]}, None),
    ({"action_type": "scroll", "direction": "up"}, "Scroll through the list", forest([]),   # S2: W 120, H 200
     {"action": "swipe", "coordinate": [60, 50], "coordinate2": [60, 150]}, None),
    ({"action_type": "scroll", "direction": "left"}, "Scroll through the list", forest([]),
     {"action": "swipe", "coordinate": [27, 120], "coordinate2": [81, 120]}, None),
    ({"action_type": "scroll", "direction": "right"}, "Scroll through the list", forest([]),
     {"action": "swipe", "coordinate": [90, 100], "coordinate2": [30, 100]}, None),
    ({"action_type": "input_text", "text": "Crème brûlée — 東京 🍰"}, "   ", forest([]),
     {"action": "type", "text": "Crème brûlée — 東京 🍰"}, None),
    ({"action_type": "open_app", "app_name": "Café Ünïcode"}, "open the café app", forest([]),
     {"action": "open", "text": "Café Ünïcode"}, None),
    ({"action_type": "navigate_back"}, "go back", forest([]), {"action": "system_button", "button": "Back"}, None),
    ({"action_type": "navigate_home"}, "go home", forest([]), {"action": "system_button", "button": "Home"}, None),
    ({"action_type": "wait"}, "wait for the page", forest([]), {"action": "wait", "time": 2}, None),
]
SIZES7 = [S1 if k % 2 == 0 else S2 for k in range(len(EP7) + 1)]
FINGER = {"down": "up", "up": "down", "left": "right", "right": "left"}  # scroll direction -> finger's


def make_src(root: Path) -> Path:
    src = root / "raw"
    src.mkdir()
    r7 = episode_record(7, GOAL7, SIZES7, [a for a, *_ in EP7], [i for _, i, *_ in EP7],
                        [t for _, _, t, *_ in EP7] + [forest([])])
    r8 = episode_record(8, "look at the home screen", [S1], None)  # one observation, no `actions` feature
    jpeg = png(S2, 91, "JPEG")[0]
    r9 = episode_record(9, "tap then wait", [S1, S2, S1], [{"action_type": "click", "x": 3, "y": 4},
                        {"action_type": "wait"}], ["tap", "tap"], shots=[png(S1, 90)[0], jpeg, png(S1, 92)[0]])
    r10 = episode_record(10, "a training episode", [S2, S2], [{"action_type": "navigate_home"}], ["home"])
    write_shard(src / SHARD0, [r7, r8])
    write_shard(src / SHARD1, [r9, r10])
    (src / "splits.json").write_text(json.dumps({"train": [10], "validation": [], "test": [7, 8, 9]}))
    return src


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("ac")
    src, out = make_src(root), root / "out"
    summary = conv.main(["--src", str(src), "--out", str(out), "--split", "test"])
    return src, out, summary


# -----------------------------------------------------------------------------
# Bytes: crc32c vectors, masked crc, the wire format by hand

def test_crc32c_known_vectors():
    # RFC 3720 (iSCSI) appendix B.4 and the classic check value of "123456789"
    vectors = [(b"", 0), (b"123456789", 0xE3069283), (bytes(32), 0x8A9136AA), (b"\xff" * 32, 0x62A8AB43),
               (bytes(range(32)), 0x46DD794E), (bytes(range(31, -1, -1)), 0x113FDB5C)]
    for data, want in vectors:
        assert conv.crc32c_py(data) == want, data
        assert conv.crc32c(data) == want, data  # the implementation in use (google-crc32c when installed)
    blob = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    assert conv.crc32c(blob) == conv.crc32c_py(blob)


def test_masked_crc_and_framing_by_hand(tmp_path):
    # c = crc32c("123456789") = 0xE3069283; rotate right 15: c >> 15 = 0x0001C60D, (c & 0x7FFF) << 17 =
    # 0x25060000, together 0x2507C60D; + 0xA282EAD8 = 0xC78AB0E5 (mod 2^32)
    assert conv.masked_crc(b"123456789") == 0xC78AB0E5
    frame = struct.pack("<Q", 9) + struct.pack("<I", conv.masked_crc(struct.pack("<Q", 9))) + b"123456789" \
        + struct.pack("<I", 0xC78AB0E5)
    assert frame == tfrecord(b"123456789")  # the test's writer frames as the reader expects
    (tmp_path / "s").write_bytes(gzip.compress(frame * 2))
    assert [(i, bytes(d), bad) for i, d, bad in conv.read_records(str(tmp_path / "s"))] == \
        [(0, b"123456789", None), (1, b"123456789", None)]


def test_wire_format_by_hand():
    # Example{features{feature{key:"a" value{int64_list{value:[1, -2]}}}}}, bytes written out by hand:
    # Int64List  0a 0b 01 fe ff ff ff ff ff ff ff 01        (packed: 1, then -2 as a 10-byte varint)
    # Feature    1a 0d <Int64List>                          (int64_list = field 3)
    # entry      0a 01 61 12 0f <Feature>                   (key = 1, value = 2)
    # Features   0a 14 <entry>;  Example 0a 16 <Features>
    ints = bytes([0x0A, 0x0B, 0x01]) + bytes([0xFE] + [0xFF] * 8 + [0x01])
    feat = bytes([0x1A, len(ints)]) + ints
    entry = bytes([0x0A, 0x01, 0x61, 0x12, len(feat)]) + feat
    ex = bytes([0x0A, len(entry) + 2, 0x0A, len(entry)]) + entry
    assert ex == example({"a": int64_feature([1, -2])})
    assert conv.parse_example(ex) == {"a": ("int64_list", [1, -2])}
    # bytes and (unpacked) float lists: BytesList 0a 02 68 69; FloatList field 1 as fixed32 (wire type 5)
    ex = example({"b": ld(1, ld(1, b"hi")), "f": ld(2, bytes([0x0D]) + struct.pack("<f", 0.5))})
    got = conv.parse_example(ex)
    assert got["b"][0] == "bytes_list" and [bytes(v) for v in got["b"][1]] == [b"hi"] and got["f"] == ("float_list", [0.5])
    # a node: bounds_in_screen (field 2) {left 1, top -10 (10-byte varint), right 30, bottom 40}, is_clickable (14)
    rect = bytes([0x08, 0x01, 0x10]) + bytes([0xF6] + [0xFF] * 8 + [0x01]) + bytes([0x18, 0x1E, 0x20, 0x28])
    nd = bytes([0x12, len(rect)]) + rect + bytes([0x70, 0x01])
    assert nd == ld(2, b"".join(vi(i + 1, c) for i, c in enumerate((1, -10, 30, 40)))) + vi(14, 1)
    fr = ld(1, ld(11, ld(1, nd)))  # forest.windows[0].tree.nodes[0]
    assert conv.interactive_boxes(fr) == [(1, -10, 30, 40)]
    assert conv.interactive_boxes(ld(1, ld(11, ld(1, ld(2, b"\x08\x01"))))) == []  # no flag: not interactive
    for broken in (b"\x0a\x05ab", b"\x08", b"\x0b", b"\x00\x01"):  # overrun, cut varint, group, field 0
        with pytest.raises(conv.ProtoError):
            conv.parse_example(broken)


def test_one_action_mapping_for_shards_and_native_rows():
    """The converter and the native-JSON loader map a native action with one function; its scroll points,
    computed by hand for S1 = 108 x 240: the centre line at a quarter and three quarters of each axis."""
    assert conv.release_action is android_control.release_action
    hand = {"up": ([54, 60], [54, 180]), "down": ([54, 180], [54, 60]),
            "left": ([27, 120], [81, 120]), "right": ([81, 120], [27, 120])}
    for d, (start, end) in hand.items():
        ours = conv.release_action({"action_type": "scroll", "direction": d}, S1)
        assert ours == {"action": "swipe", "coordinate": start, "coordinate2": end}
        assert android_control.row_action({"action_type": "scroll", "direction": d}, S1) == ours
        assert gui.swipe_direction(ours["coordinate"], ours["coordinate2"]) == FINGER[d]
    # the loader leaves points to its own check against the recorded size; the converter checks them here
    far = {"action_type": "click", "x": 500, "y": 3}
    assert android_control.row_action(far, S1) == {"action": "click", "coordinate": [500, 3]}
    with pytest.raises(android_control.Bad, match="500 lies outside the 108x240 screenshot"):
        conv.release_action(far, S1)


# -----------------------------------------------------------------------------
# Conversion

def test_actions_round_trip(converted):
    src, out, summary = converted
    (ep7, ep9) = read_jsonl(out / "test.jsonl")
    assert ep7["episode_id"] == 7 and ep7["goal"] == GOAL7 and ep7["swipe_convention"] == "finger"
    assert ep7["source"] == f"{SHARD0}:0"
    assert [s["action_content"] for s in ep7["steps"]] == [e for *_, e, _ in EP7]
    for k, (s, (_, instr, _, action, boxes)) in enumerate(zip(ep7["steps"], EP7)):
        assert s["screenshot"] == f"images/7_{k}.png" and s["image_size"] == list(SIZES7[k])
        assert s.get("step_instruction") == (instr if instr.strip() else None)  # empty and blank: absent
        assert s["check_options"] == ({**action, "candidate_bbox": boxes} if boxes is not None else action)
    assert [s.get("step_instruction") for s in ep7["steps"][2:6]] == ["Scroll through the list"] * 4  # repeated
    assert ep9["steps"][0]["check_options"]["candidate_bbox"] == []  # the tree has no interactive node
    assert summary["episodes"] == 2 and summary["steps"] == len(EP7) + 2 and summary["images"] == 12 + 1 + 3
    assert summary["actions"] == {"click": 2, "long_press": 1, "swipe": 4, "type": 1, "open": 1,
                                  "system_button": 2, "wait": 2}
    assert summary["native_actions"]["scroll"] == 4 and summary["native_actions"]["input_text"] == 1
    assert summary["no_actions"] == {"count": 1, "episode_ids": [8]}
    assert summary["skipped"]["count"] == 0 and summary["missing_from_shards"] == {}
    assert not (out / "train.jsonl").exists() and not (out / "images" / "10_0.png").exists()  # --split test


def test_screenshots_pixel_exact(converted):
    src, out, _ = converted
    for k, size in enumerate(SIZES7):
        data, pixels = png(size, 700 + k)
        assert (out / "images" / f"7_{k}.png").read_bytes() == data  # the shipped bytes, as they are
        with Image.open(out / "images" / f"7_{k}.png") as im:
            assert im.size == size and np.array_equal(np.asarray(im.convert("RGB")), pixels)
    assert (out / "images" / "8_0.png").read_bytes() == png(S1, 800)[0]  # the zero-action episode's too
    with Image.open(io.BytesIO(png(S2, 91, "JPEG")[0])) as jpeg, Image.open(out / "images" / "9_1.png") as im:
        assert im.format == "PNG" and np.array_equal(np.asarray(im), np.asarray(jpeg))  # re-encoded losslessly


def test_loaded_by_gui_with_finger_swipes(converted):
    src, out, _ = converted
    eps = dataset.load_episodes(out / "test.jsonl")  # no --swipe-convention: the file declares "finger"
    ep = eps[0]
    assert [s.action for s in ep.steps] == [e for *_, e, _ in EP7]
    assert ep.meta["swipe_convention"] == "finger"
    for step, (native, *_) in zip(ep.steps, EP7):
        if native["action_type"] != "scroll":
            continue
        a, size = step.action, step.image_size
        assert gui.swipe_direction(a["coordinate"], a["coordinate2"]) == FINGER[native["direction"]]
        assert reward.action_match(dict(a), a, [], size) == (True, True)
        reversed_ = {**a, "coordinate": a["coordinate2"], "coordinate2": a["coordinate"]}
        assert reward.action_match(reversed_, a, [], size) == (False, True)  # the content direction does not match
    for s in ep.steps:  # recorded sizes agree with the files
        assert dataset.original_size(s, image_root=str(out)) == s.image_size


def test_expert_replay_pg_tsr_one(converted, capsys):
    src, out, _ = converted
    s = eval_sop.main(["--data", str(out / "test.jsonl"), "--image-root", str(out), "--policy", "expert"])
    assert s["pg"] == 1.0 and s["tsr"] == 1.0 and s["episodes"] == 2 and s["steps"] == s["steps_run"] == len(EP7) + 2


def test_all_splits_one_pass_and_terminate(tmp_path, capsys):
    src, out = make_src(tmp_path), tmp_path / "out"
    summary = conv.main(["--src", str(src), "--out", str(out), "--terminate"])
    assert summary["episodes_per_split"] == {"test": 2, "train": 1}
    (ep10,) = read_jsonl(out / "train.jsonl")
    assert ep10["steps"][-1] == {"action_content": {"action": "terminate", "status": "success"},
                                 "screenshot": "images/10_1.png", "image_size": list(S2),
                                 "check_options": {"action": "terminate", "status": "success"}}
    ep7 = read_jsonl(out / "test.jsonl")[0]
    assert len(ep7["steps"]) == len(EP7) + 1 and ep7["steps"][-1]["screenshot"] == f"images/7_{len(EP7)}.png"
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary  # last line: the JSON summary
    assert json.loads((out / "convert_summary.json").read_text()) == summary
    s = eval_sop.main(["--data", str(out / "test.jsonl"), str(out / "train.jsonl"), "--image-root", str(out)])
    assert s["pg"] == 1.0 and s["tsr"] == 1.0 and s["steps"] == len(EP7) + 1 + 3 + 2
    limited = conv.main(["--src", str(src), "--out", str(tmp_path / "one"), "--limit", "1"])
    assert limited["episodes"] == 1 and limited["missing_from_shards"] is None


# -----------------------------------------------------------------------------
# Bad input: one line naming shard:record: field, or skipped and listed

def test_corrupted_byte_one_line_error_and_skip_bad(tmp_path, capsys):
    src = make_src(tmp_path)
    raw = gzip.decompress((src / SHARD1).read_bytes())
    first = 12 + struct.unpack("<Q", raw[:8])[0] + 4  # record 1 starts here
    raw = bytearray(raw)
    raw[first + 12 + 40] ^= 0x01  # one bit inside record 1's data
    (src / SHARD1).write_bytes(gzip.compress(bytes(raw)))
    p = subprocess.run([sys.executable, "tools/convert_android_control.py", "--src", str(src), "--out", str(tmp_path / "o")],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]  # no progress bar off a terminal
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    length = len(raw) - first - 16  # record 1's data: what lies between its 12-byte header and 4-byte footer
    assert lines == [f"convert_android_control.py: error: {src / SHARD1}:1: data_crc: crc32c mismatch over "
                     f"{length} bytes"], lines
    s = conv.main(["--src", str(src), "--out", str(tmp_path / "o"), "--skip-bad"])
    assert s["skipped"]["records"] == [{"shard": SHARD1, "record": 1, "field": "data_crc", "episode_id": None,
                                        "what": f"crc32c mismatch over {length} bytes", "rest_of_shard": False}]
    assert s["episodes_per_split"] == {"test": 2} and s["missing_from_shards"] == {"train": 1}


@pytest.mark.parametrize("damage, field", [("gzip_byte", None), ("truncate", "gzip"), ("length_crc", "length_crc"),
                                           ("not_gzip", "gzip")])
def test_broken_shard_named_and_rest_skipped(tmp_path, damage, field, capsys):
    src = make_src(tmp_path)
    data = (src / SHARD0).read_bytes()
    if damage == "gzip_byte":
        data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
    elif damage == "truncate":
        data = data[:int(len(data) * 0.6)]
    elif damage == "length_crc":
        raw = bytearray(gzip.decompress(data))
        raw[2] ^= 0x10  # record 0's length field
        data = gzip.compress(bytes(raw))
    else:
        data = gzip.decompress(data)  # an uncompressed TFRecord file
    (src / SHARD0).write_bytes(data)
    with pytest.raises(dataset.DataError) as e:
        conv.main(["--src", str(src), "--out", str(tmp_path / "o")])
    assert str(e.value).startswith(f"{src / SHARD0}:")
    if field:
        assert f": {field}: " in str(e.value)
    s = conv.main(["--src", str(src), "--out", str(tmp_path / "o"), "--skip-bad"])
    assert s["skipped"]["count"] >= 1 and all(r["shard"] == SHARD0 for r in s["skipped"]["records"])
    assert s["episodes_per_split"]["train"] == 1  # the other shard is converted whole


def _one(tmp_path, record) -> Path:
    src = tmp_path / "raw"
    src.mkdir()
    good = episode_record(1, "fine", [S1, S1], [{"action_type": "wait"}], ["wait"])
    write_shard(src / SHARD0, [good, record, episode_record(3, "fine too", [S1, S1], [{"action_type": "wait"}])])
    return src


def broken_png(size) -> bytes:
    data = bytearray(png(size, 5)[0])
    data[len(data) // 2] ^= 0xFF  # inside IDAT: the header (and so the size) still reads
    return bytes(data)


BAD_RECORDS = [
    (episode_record(2, "g", [S1, S1], [{"action_type": "wait"}], shots=[png(S1, 1)[0], broken_png(S1)]),
     "screenshots[1]: not a readable image"),
    (episode_record(2, "g", [S1, S2], [{"action_type": "wait"}], shots=[png(S1, 1)[0], png((S2[0] + 1, S2[1]), 2)[0]]),
     "screenshots[1]: decoded 121x200 (W x H) but screenshot_widths/heights declare 120x200"),
    (episode_record(2, "g", [S1, S1, S1], [{"action_type": "wait"}]), "actions: 1 values for 3 screenshots (expected 2)"),
    (episode_record(2, "g", [S1, S1], None), "actions: 0 values for 2 screenshots (expected 1)"),
    (episode_record(2, "g", [S1, S1], [{"action_type": "swipe", "x": 1}]), "actions[0].action_type: unknown action type 'swipe'"),
    (episode_record(2, "g", [S1, S1], [{"action_type": "scroll", "direction": "sideways"}]),
     "actions[0].direction: expected up/down/left/right"),
    (episode_record(2, "g", [S1, S1], [{"action_type": "click", "x": 500, "y": 3}]),
     "actions[0].x: 500 lies outside the 108x240 screenshot"),
    (episode_record(2, "g", [S1, S1], [{"action_type": "wait"}], ["a", "b"]), "step_instructions: 2 values"),
    (episode_record(2, "g", [S1, S1], [{"action_type": "wait"}], replace={"screenshot_widths": int64_feature([108])}),
     "screenshot_widths: 1 values for 2 screenshots"),
    (episode_record(2, "g", [S1, S1], [{"action_type": "wait"}], replace={"goal": None}), "goal: missing"),
    (episode_record(2, "g", [S1, S1], [{"action_type": "wait"}], replace={"goal": int64_feature([5])}), "goal: expected a bytes_list"),
    (example({"episode_id": int64_feature([2]), "goal": b"\x0b"}), "example: not a tf.train.Example"),
    (episode_record(1, "g", [S1, S1], [{"action_type": "wait"}]), "episode_id: 1 already read from"),
    # numbers that do not fit what they are read as: a coordinate past a float's range, an integer literal
    # past Python's digit limit, a varint of more than 64 bits
    (episode_record(2, "g", [S1, S1], [{"action_type": "click", "x": 10 ** 400, "y": 3}]),
     "actions[0].x: the integer 1000000000000000000"),
    (episode_record(2, "g", [S1, S1], [{"action_type": "click", "x": 1e300, "y": 3}]), "actions[0].x: 1e+300 lies outside"),
    (episode_record(2, "g", [S1, S1], [{"action_type": "wait"}],
                    replace={"actions": bytes_feature(['{"action_type": "click", "x": ' + "9" * 5000 + ', "y": 1}'])}),
     "actions[0]: a number does not fit"),
    (episode_record(2, "g", [S1, S1], [{"action_type": "wait"}], replace={"screenshot_widths": ld(3, ld(1, b"\xff" * 9 + b"\x7f"))}),
     "example: not a tf.train.Example: varint exceeds 64 bits"),
]


@pytest.mark.parametrize("record, message", BAD_RECORDS, ids=[m.split(":")[0] for _, m in BAD_RECORDS])
def test_bad_record_named_and_skipped(tmp_path, record, message, capsys):
    src = _one(tmp_path, record)
    with pytest.raises(dataset.DataError) as e:
        conv.main(["--src", str(src), "--out", str(tmp_path / "o")])
    assert str(e.value).startswith(f"{src / SHARD0}:1: {message}"), str(e.value)
    s = conv.main(["--src", str(src), "--out", str(tmp_path / "o"), "--skip-bad"])
    (rec,) = s["skipped"]["records"]
    assert (rec["shard"], rec["record"], rec["rest_of_shard"]) == (SHARD0, 1, False)
    assert f"{rec['field']}: {rec['what']}".startswith(message)
    assert s["episodes"] == 2 and not (tmp_path / "o" / "images" / "2_0.png").exists()  # nothing of it written


def test_good_duplicate_after_a_bad_first_copy_is_kept(tmp_path):
    """--skip-bad: a bad first copy of episode 2 does not make its good second copy 'already read'."""
    src = tmp_path / "raw"
    src.mkdir()
    bad = episode_record(2, "g", [S1, S1], [{"action_type": "click", "x": 10 ** 400, "y": 3}])
    good = episode_record(2, "g", [S1, S1], [{"action_type": "wait"}], ["wait"])
    write_shard(src / SHARD0, [bad, good])
    s = conv.main(["--src", str(src), "--out", str(tmp_path / "o"), "--skip-bad"])
    assert s["episodes"] == 1 and [r["record"] for r in s["skipped"]["records"]] == [0]
    assert [e["episode_id"] for e in read_jsonl(tmp_path / "o" / "all.jsonl")] == [2]


def test_usage_errors(tmp_path):
    with pytest.raises(conv.utils.UsageError, match="no shards named"):
        conv.main(["--src", str(tmp_path), "--out", str(tmp_path / "o")])
    src = make_src(tmp_path)
    with pytest.raises(SystemExit):  # not a split name at all: refused while the flags are parsed
        conv.build_parser().parse_args(["--src", str(src), "--out", str(tmp_path / "o"), "--split", "dev"])
    (src / "splits.json").write_text(json.dumps({"train": [10], "test": [7, 8, 9]}))
    with pytest.raises(conv.utils.UsageError, match=r"--split validation: not in splits.json \(it has: train, test\)"):
        conv.main(["--src", str(src), "--out", str(tmp_path / "o"), "--split", "validation"])
    os.remove(src / "splits.json")
    with pytest.raises(conv.utils.UsageError, match="--split test needs"):
        conv.main(["--src", str(src), "--out", str(tmp_path / "o"), "--split", "test"])
