"""What makes a tiny random-init model able to act on MiniWob++: element lines that show each
element's click point (grounding becomes copying), short thoughts, and a tiny model of chosen size.
Pure: no browser."""

from pathlib import Path

import pytest

import utils
import vlm
from envs import miniwob_env as me
from envs import miniwob_experts as experts
from extras.tiny import parse_tiny, tiny_config


def _el(ref, tag, text, box, point, *, value=None, leaf=True):
    x1, y1, x2, y2 = box
    return me.Element(ref=ref, parent=0, tag=tag, text=text, value=value, id="", classes="", left=x1, top=y1,
                      width=x2 - x1, height=y2 - y1, focused=False, tampered=False, leaf=leaf, point=point)


def test_elements_text_shows_click_point():
    dom = [_el(5, "button", "okay", (2, 63, 47, 84), (24, 73)),
           _el(6, "div", "hidden under", (2, 90, 40, 100), None),  # nothing on top: no point shown
           _el(7, "input_text", None, (2.4, 84.6, 151.5, 104.2), (76, 94), value="")]
    lines = me.elements_text(dom).split("\n")
    assert lines == ["[5] button 'okay' at (24,73) (2,63,47,84)",
                     "[6] div 'hidden under' (2,90,40,100)",
                     "[7] input_text '' at (76,94) (2,84,152,105)"]


def test_short_thought_copies_the_element_line():
    e = _el(5, "button", "  okay\n now ", (2, 63, 47, 84), (24, 73))
    click = {"action": "click", "coordinate": [24, 73]}
    assert experts.short_thought(click, e) == "Click button 'okay now' at (24,73)."
    # the thought (less "Click " and ".") is a substring of the element line the model sees: a copy
    assert "button 'okay now' at (24,73)" in me.elements_text([e])
    assert experts.short_thought(click, _el(1, "input_text", None, (0, 0, 9, 9), (4, 4), value="")) == \
        "Click input_text '' at (24,73)."
    long = _el(2, "a", "x" * 80, (0, 0, 9, 9), (4, 4))  # cut as the element line cuts it
    assert experts.short_thought(click, long) == f"Click a '{'x' * 57}...' at (24,73)."
    assert f"a '{'x' * 57}...' at (4,4)" in me.elements_text([long])
    assert experts.short_thought({"action": "type", "text": "abc"}, None) == "Type 'abc'."
    assert experts.short_thought({"action": "terminate", "status": "success"}, None) == "Done."


def test_parse_tiny():
    assert parse_tiny("tiny") == (64, 2)
    assert parse_tiny("tiny:128x4") == (128, 4)
    assert parse_tiny("out/sft/ckpt/latest") is None
    for bad in ("tiny:128", "tiny:axb", "tiny:100x2", "tiny:128x0", "tiny:0x2"):
        with pytest.raises(ValueError, match="tiny"):
            parse_tiny(bad)


@pytest.mark.parametrize("h,n", [(64, 2), (128, 4), (256, 2)])
def test_tiny_config_sizes(h, n):
    cfg = tiny_config(h, n, tokenizer=vlm.load_processor("tiny")[0])
    tc = cfg.text_config
    head_dim = tc.hidden_size // tc.num_attention_heads
    assert (tc.hidden_size, tc.num_hidden_layers, tc.intermediate_size) == (h, n, 2 * h)
    assert sum(tc.rope_parameters["mrope_section"]) == head_dim // 2  # mrope covers the head
    assert tc.num_attention_heads % tc.num_key_value_heads == 0
    assert cfg.vision_config.out_hidden_size == h  # merger feeds the LM


def test_tiny_default_unchanged():
    tc = tiny_config(tokenizer=vlm.load_processor("tiny")[0]).text_config
    assert (tc.hidden_size, tc.num_hidden_layers, tc.num_attention_heads) == (64, 2, 4)
    assert tc.rope_parameters["mrope_section"] == [2, 3, 3]


def test_model_names_that_mean_a_preset(tmp_path):
    """'tiny' and 'tiny:...' are presets (a malformed one refused by --model's type, as parse_tiny
    refuses it); a folder named otherwise is not, even one whose name contains 'tiny'."""
    assert utils.is_tiny("tiny") and utils.is_tiny("tiny:128x4") and utils.is_tiny("tiny:bad")
    assert not utils.is_tiny("tinyllama") and not utils.is_tiny(tmp_path / "tiny") and not utils.is_tiny(None)
    assert vlm.model_path("tiny:128x4") == "tiny:128x4"
    with pytest.raises(ValueError, match="expected tiny:HxL"):
        vlm.model_path("tiny:128")
    assert vlm.tokenizer_dir("tiny:128x4") == vlm.TINY_TOKENIZER_DIR


def test_a_model_folder_never_imports_the_presets(tmp_path):
    """The RL step starts from a checkpoint folder: --model's type and load_model of a folder leave
    extras.tiny unimported (it is off the RL path); a preset name imports it."""
    import subprocess
    import sys

    vlm.load_model("tiny").save_pretrained(tmp_path / "m")
    code = ("import sys, vlm\n"
            f"vlm.load_model(vlm.model_path({str(tmp_path / 'm')!r}))\n"
            "print('extras.tiny' in sys.modules)\n"
            "vlm.model_path('tiny')\n"
            "print('extras.tiny' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]


def test_load_model_tiny_size():
    m = vlm.load_model("tiny:96x3")
    assert m.config.text_config.hidden_size == 96 and len(m.model.language_model.layers) == 3
