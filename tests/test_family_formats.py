"""Each family's published answer forms (evaluation/families.py) read into hand-written expected actions, a
table per family, every row naming the repository and file its form (or its very example) comes from; the
screen is the resized screenshot the model saw, SIZE = 1092 x 2408 (a 1080 x 2400 phone after smart_resize),
so a 0-1000 relative x is x * 1.092 px and y is y * 2.408 px. Rows with None are malformed answers: a point
outside the image after the family's conversion among them (0 <= x <= W, 0 <= y <= H), scored 0."""
import pytest

import dataset
import gui
import reward
from evaluation.families import ADAPTERS

SIZE = (1092, 2408)
W, H = SIZE


def click(x, y, kind="click"):
    return {"action": kind, "coordinate": [x, y]}


def swipe(x1, y1, x2, y2):
    return {"action": "swipe", "coordinate": [x1, y1], "coordinate2": [x2, y2]}


def tool(arguments: str) -> str:
    """A Qwen2.5-VL mobile_use tool call around its JSON arguments."""
    return '<tool_call>\n{"name": "mobile_use", "arguments": ' + arguments + '}\n</tool_call>'


def box(x, y) -> str:
    """A UI-TARS v1 box argument's value, box tokens included."""
    return f"<|box_start|>({x},{y})<|box_end|>"


def button(b):
    return {"action": "system_button", "button": b}


def end(status="success"):
    return {"action": "terminate", "status": status}


TARS_V1 = "bytedance/UI-TARS README.md (prompt template for mobile)"
TARS_V1_COORD = "bytedance/UI-TARS README.md (coordinate mapping: (235, 512) on 1920 x 1080 is (451, 553))"
TARS_TEST = "bytedance/UI-TARS codes/tests/action_parser_test.py"
TARS_15 = "bytedance/UI-TARS codes/ui_tars/action_parser.py + the UI-TARS-1.5 mobile prompt"
TARS_DEPLOY = "bytedance/UI-TARS README_deploy.md (UI-TARS-1.5 expected output)"
UIS1_TARS = "X-PLUG/MobileAgent UI-S1/evaluation/ui_tars_utils.py (the UI-S1 paper's UI-TARS evaluation)"
CPM_README = "OpenBMB/AgentCPM-GUI README.md (expected output)"
CPM_SCHEMA = "OpenBMB/AgentCPM-GUI eval/utils/schema/schema_for_extraction.json + eval/utils/evaluator.py"
UIS1_CPM = "X-PLUG/MobileAgent UI-S1/evaluation/ui_tars_utils.py (agent_action example, uitars2minicpm)"
QWEN = "OpenBMB/AgentCPM-GUI eval/utils/qwen_mobile_tool.py (Qwen2.5-VL mobile_use arguments, resized pixels)"
OURS = "chat.FULL_SYSTEM_PROMPT (this repository)"

# (source, raw answer, expected action in pixels of SIZE or None)
FORMS = {
    "uitars": [
        (TARS_V1_COORD, "Thought: open the menu\nAction: click(start_box='(235,512)')",
         click(235 * W / 1000, 512 * H / 1000)),
        (TARS_TEST, "Thought: test\nAction: click(start_box='<|box_start|>(112,224)<|box_end|>')",
         click(122.304, 539.392)),
        (UIS1_TARS, "Action: click(start_box='<|box_start|>(558,925)<|box_end|>')", click(609.336, 2227.4)),
        (TARS_V1, "Action: long_press(start_box='<|box_start|>(100,200)<|box_end|>', time='')",
         click(109.2, 481.6, "long_press")),
        (TARS_V1, f"Action: scroll(start_box='{box(500, 700)}', end_box='{box(500, 300)}')",
         swipe(546, 1685.6, 546, 722.4)),  # the finger's path
        # no box: the centre; content down = finger up
        (UIS1_TARS, "Action: scroll(direction='down')", swipe(546, 1204, 546, 481.6)),
        (UIS1_TARS, "Action: scroll(direction='left')", swipe(546, 1204, 873.6, 1204)),
        (TARS_V1, "Action: type(content='I\\'m home')", {"action": "type", "text": "I'm home"}),
        # unescaped, read as UI-TARS's own parser reads it
        (TARS_V1, "Action: type(content='I'm home')", {"action": "type", "text": "I'm home"}),
        (TARS_V1, "Action: type(content='say \\\"hi\\\"\\n')", {"action": "type", "text": 'say "hi"\n'}),
        (TARS_V1, "Action: press_home()", button("Home")),
        (TARS_V1, "Action: press_back()", button("Back")),
        (TARS_V1, "Action: finished(content='')", end()),
        (UIS1_TARS, "Action: wait()", {"action": "wait"}),
        # 1.5's absolute pixels read as 0-1000: y 1200 -> 2,889.6 px on a 2,408-px screen: outside, malformed
        (TARS_15, "Action: click(start_box='(500,1200)')", None),
        (TARS_V1, "Action: click(start_box='(-5,100)')", None),
        (TARS_V1, f"Action: scroll(start_box='{box(500, 700)}', end_box='{box(500, 1300)}')",
         None),
    ],
    "uitars15": [
        (TARS_TEST, "Thought: test\nAction: click(point='<point>200 300</point>')", click(200, 300)),
        (TARS_DEPLOY, "Thought: the Color Management option\nAction: click(start_box='(177,549)')", click(177, 549)),
        (TARS_15, "Action: long_press(point='<point>546 1204</point>')", click(546, 1204, "long_press")),
        (TARS_15, "Action: drag(start_point='<point>546 1800</point>', end_point='<point>546 600</point>')",
         swipe(546, 1800, 546, 600)),
        (TARS_15, "Action: scroll(point='<point>546 1204</point>', direction='up')", swipe(546, 1204, 546, 1926.4)),
        # our end point stays on the screen
        (TARS_15, "Action: scroll(point='<point>546 2300</point>', direction='up')", swipe(546, 2300, 546, 2408)),
        (TARS_15, "Action: type(content='I\\'m home\\n')", {"action": "type", "text": "I'm home\n"}),
        (TARS_15, "Action: open_app(app_name='Settings')", {"action": "open", "text": "Settings"}),
        (TARS_15, "Action: press_home()", button("Home")),
        (TARS_15, "Action: press_back()", button("Back")),
        (TARS_15, "Action: finished(content='successful')", end()),
        (TARS_15, "Action: finished(content='infeasible')", end("failure")),
        (TARS_15, "Action: finished(content='It\\'s done')", end()),
        (TARS_15, "Action: click(point='<point>546 2890</point>')", None),  # below the 2,408-px screen
        (TARS_15, "Action: click(point='<point>1093 10</point>')", None),
        (TARS_15, "Action: click(point='<point>546</point>')", None),
    ],
    "agentcpm": [
        (CPM_README, '{"thought":"任务目标是点击屏幕上的‘会员’按钮。","POINT":[729,69]}',
         click(796.068, 166.152)),
        (UIS1_CPM, '{"thought":"click on the Add to Cart button","POINT":[501,952]}', click(547.092, 2292.416)),
        (CPM_SCHEMA, '{"POINT":[500,500],"duration":200}', click(546, 1204)),  # 200 ms is the default: a tap
        (CPM_SCHEMA, '{"POINT":[500,500],"duration":100}', click(546, 1204)),
        (CPM_SCHEMA, '{"POINT":[500,500],"duration":201}', click(546, 1204, "long_press")),
        (CPM_SCHEMA, '{"POINT":[500,500],"to":"up"}', swipe(546, 1204, 546, 481.6)),  # "to": the finger
        (CPM_SCHEMA, '{"POINT":[500,800],"to":[500,200]}', swipe(546, 1926.4, 546, 481.6)),
        (CPM_SCHEMA, '{"TYPE":"I\'m \\"home\\"\\n"}', {"action": "type", "text": 'I\'m "home"\n'}),
        (CPM_SCHEMA, '{"PRESS":"BACK"}', button("Back")),
        (CPM_SCHEMA, '{"PRESS":"HOME"}', button("Home")),
        (CPM_SCHEMA, '{"duration":1000}', {"action": "wait"}),
        (UIS1_CPM, '{"STATUS": "continue", "duration": 200}', {"action": "wait"}),  # its wait()
        (CPM_SCHEMA, '{"STATUS":"finish"}', end()),
        (CPM_SCHEMA, '{"STATUS":"satisfied"}', end()),
        (CPM_SCHEMA, '{"STATUS":"impossible"}', end("failure")),
        (CPM_SCHEMA, '{"POINT":[500,1001]}', None),  # the schema's range is 0-1000: outside the image
        (CPM_SCHEMA, '{"POINT":[500,500],"duration":-1}', None),
        (CPM_SCHEMA, '{"POINT":[500,500],"to":"sideways"}', None),
    ],
    "qwen25vl": [
        (QWEN, tool('{"action": "click", "coordinate": [540, 1200]}'),
         click(540, 1200)),
        # the history prompt there asks for <thinking> before the call and <conclusion> after it
        (QWEN, '<thinking>open the menu</thinking>\n' + tool('{"action": "long_press", "coordinate": [540, 1200], '
                                                            '"time": 2}') + '\n<conclusion>pressed</conclusion>',
         {"action": "long_press", "coordinate": [540, 1200], "time": 2}),
        (QWEN, '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "swipe", "coordinate": [546, 1504], '
         '"coordinate2": [546, 904]}}\n</tool_call>', swipe(546, 1504, 546, 904)),
        (QWEN, '<tool_call>\n{"name":"mobile_use","arguments":{"action":"type","text":"I\'m \\"home\\"\\n"}}'
               '\n</tool_call>',
         {"action": "type", "text": 'I\'m "home"\n'}),
        (QWEN, tool('{"action": "system_button", "button": "Enter"}'),
         button("Enter")),
        (QWEN, tool('{"action": "terminate", "status": "failure"}'),
         end("failure")),
        (QWEN, '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "wait", "time": 2}}\n</tool_call>',
         {"action": "wait", "time": 2}),
        (QWEN, tool('{"action": "click", "coordinate": [1200, 500]}'),
         None),
    ],
    "uis1": [
        (OURS, '<think>\nthe button\n</think>\n<action>\n{"action": "click", "coordinate": [546, 1204]}\n</action>',
         click(546, 1204)),
        (OURS, '<think>\nx\n</think>\n<action>\n{"action": "type", "text": "I\'m \\"home\\""}\n</action>',
         {"action": "type", "text": 'I\'m "home"'}),
        (OURS, '<think>\nx\n</think>\n<action>\n{"action": "click", "coordinate": [546, 2409]}\n</action>', None),
    ],
}
ROWS = [(fmt, *row) for fmt, rows in FORMS.items() for row in rows]


@pytest.mark.parametrize("fmt,source,raw,expected", ROWS, ids=[f"{r[0]}-{i}" for i, r in enumerate(ROWS)])
def test_published_forms_read_as_written(fmt, source, raw, expected):
    p = gui.parse_response(ADAPTERS[fmt].to_response(raw, SIZE))
    if expected is None:
        if fmt == "uis1" and p.action is not None:  # our own format is kept as written: the reward refuses it
            assert gui.outside_point(p.action, SIZE) is not None, (source, p.action)
            step = dataset.Step(None, p.action, candidate_bbox=[], image_size=SIZE)
            assert reward.score_response(raw, step, resized_size=SIZE, orig_size=SIZE).reward == 0.0, source
            return
        assert p.action is None and p.error is not None, (source, p.action)
        return
    assert p.error is None, (source, p.error)
    assert p.action.keys() == expected.keys() and p.action["action"] == expected["action"], (source, p.action)
    for k, v in expected.items():
        if k in ("coordinate", "coordinate2"):
            assert p.action[k] == pytest.approx(v, abs=1e-6), (source, k, p.action[k])
        else:
            assert p.action[k] == v, (source, k, p.action[k])


def test_every_family_has_its_table_and_its_malformed_rows():
    assert set(FORMS) == set(ADAPTERS)
    for rows in FORMS.values():
        assert any(e is None for *_, e in rows) and sum(e is not None for *_, e in rows) >= 2


@pytest.mark.parametrize("fmt,raw", [("uitars", "Action: click(start_box='(500,1200)')"),
                                     ("uitars15", "Action: click(point='<point>546 2890</point>')"),
                                     ("agentcpm", '{"POINT":[500,1001]}'),
                                     ("qwen25vl", '<tool_call>{"name": "mobile_use", "arguments": {"action": "click", '
                                                  '"coordinate": [546, -1]}}</tool_call>'),
                                     ("uis1", '<think>x</think>\n<action>{"action": "click", "coordinate": [-1, 5]}'
                                              '</action>')])
def test_a_point_outside_the_image_scores_zero_even_beside_the_expert(fmt, raw):
    """The issue's case: a point off the screen is no click at its edge, whatever the rule set; the expert
    here sits at the bottom-centre edge and its box covers the whole screen (AndroidControl's rule would
    accept any point inside that box enlarged 1.2x)."""
    text = ADAPTERS[fmt].to_response(raw, SIZE)
    # the families' converted point is marked; the project's own format stays as written (served == in
    # process) and reward.score_response refuses its point itself
    assert ('"outside_image"' in text) if fmt != "uis1" else (text == raw)
    step = dataset.Step(None, click(546, 2408), candidate_bbox=[[0, 0, W, H]], image_size=SIZE)
    for rules in ("strict", "release"):
        s = reward.score_response(text, step, resized_size=SIZE, orig_size=SIZE, rules=rules)
        assert not s.match, (fmt, rules)
    assert reward.score_response(text, step, resized_size=SIZE, orig_size=SIZE).reward == 0.0


@pytest.mark.parametrize("fmt", ["uitars", "uitars15", "agentcpm", "qwen25vl"])
@pytest.mark.parametrize("action", [click(546, 1204), click(100, 2000, "long_press"), swipe(546, 1800, 546, 600),
                                    {"action": "type", "text": "I'm \"home\"\nnow \\ ok"},
                                    button("Home"), button("Back"),
                                    end(), end("failure"), {"action": "wait"}])
def test_history_written_in_the_family_format_reads_back(fmt, action):
    """Writer then parser: the same action (points within a 0-1000 rounding), quotes and newlines kept."""
    a = ADAPTERS[fmt]
    text = a.from_response(gui.format_response("why", action), SIZE)
    assert "<action>" not in text
    back = gui.parse_response(a.to_response(text, SIZE)).action
    assert back["action"] == action["action"]
    if "text" in action:
        assert back["text"] == action["text"]
    if action["action"] in ("click", "long_press"):
        assert back["coordinate"] == pytest.approx(action["coordinate"], abs=2.5)
    if action["action"] == "swipe":
        assert gui.swipe_direction(back["coordinate"], back["coordinate2"]) == "up"
    if action["action"] in ("system_button", "terminate"):
        assert (back.get("button"), back.get("status")) == (action.get("button"), action.get("status"))


@pytest.mark.parametrize("rules", ["strict", "androidcontrol", "aitw"])
def test_score_reads_a_family_s_raw_answers_under_a_protocol(tmp_path, rules):
    """`eval_sop.py score --action-format uitars15 --match-rules R`: UI-TARS-1.5's answers for step 2 of
    line-1 (expert click at original (540, 390) = resized (546, 391.3)) are read in resized pixels and judged
    by the named rule set (a protocol's by its function); the point below the screen scores 0 under all."""
    import json
    from pathlib import Path

    import eval_sop
    data = Path(__file__).resolve().parents[1] / "data" / "android_control" / "android_control_train_example_uis1.jsonl"
    lines = [{"episode_id": "line-1", "step": 2, "response": f"Thought: {t}\nAction: click(point='<point>{p}</point>')"}
             for t, p in (("the post", "546 391"), ("off", "546 2890"))]
    rfile, ofile = tmp_path / "r.jsonl", tmp_path / "s.jsonl"
    rfile.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = eval_sop.main(["score", "--data", str(data), "--responses", str(rfile), "--out", str(ofile), "--image-size",
                       "1080x2400", "--subset", "--action-format", "uitars15", "--match-rules", rules])
    rows = [json.loads(x) for x in ofile.read_text().splitlines()]
    assert [r["match"] for r in rows] == [True, False] and rows[1]["reward"] == 0.0 and rows[1]["error"]
    assert rows[0]["action"] == {"action": "click", "coordinate": [540, 390]} and s["match_rate"] == 0.5
