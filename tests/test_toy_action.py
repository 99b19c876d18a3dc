"""A fork's new action type, end to end, through the places README's "How to fork" names and no other.

The toy action `double_click` ({"action": "double_click", "coordinate": [x, y]}, matched by the existing
"point" rule) is registered for the test only, into the documented registries (restored afterwards):
agent side an ActionSpec in gui.ACTIONS, environment side an executor in envs.miniwob_env.EXECUTORS and
an expert in envs.miniwob_experts.EXPERTS (enter-text, focusing its field by a double click). Then: the
generated system prompt lists it, a response with it parses, the strict match scores it, the executor
performs it in a live MiniWob++ page, the expert emits it with a thought (long, short and varied), the
data tool records the episode, and the expert replay through the rollout driver (eval_sop) gets SOP
progress 1.0. A new kind of argument adds a rule in reward.RULES (checked with a second toy), and its
trivial floor in policies.trivial_policies. The bullet of README that counts these places is checked
against what this file registers, so the count cannot drift. One enter-text episode in headless Chromium
(a few seconds)."""

import json
import re
from pathlib import Path

import pytest
from selenium.webdriver.common.action_chains import ActionChains

import chat
import gui
import reward
from envs import miniwob_env as me
from evaluation import protocols
from envs import miniwob_experts as experts

REPO = Path(__file__).resolve().parents[1]
KIND = "double_click"
SPEC = gui.ActionSpec((("coordinate", "point"),), "point",
                      '{"action": "double_click", "coordinate": [x, y]}: double-click the point (x, y).')
# The places this file registers into (agent: registry + rule; environment: executor + expert), and the one
# place a new kind of argument also needs that is code, not a registry: README's bullet must name exactly these.
AGENT = {"gui.ACTIONS", "reward.RULES"}
ENVIRONMENT = {"envs.miniwob_env.EXECUTORS", "envs.miniwob_experts.EXPERTS"}
FLOOR = {"policies.trivial_policies"}


def do_double_click(d, action, image_size):
    """The executor: a pointer double click at the point (page pixels, as envs.miniwob_env._do_point)."""
    x, y = me.to_page_xy(action["coordinate"], image_size)
    chain = ActionChains(d, duration=0)
    chain.w3c_actions.pointer_action.move_to_location(x, y)
    chain.w3c_actions.pointer_action.double_click()
    chain.w3c_actions.perform()


def expert_enter_text_by_double_click(obs):
    """enter-text's expert, but the field is focused by a double click (an empty field: nothing to select)."""
    st = experts.expert_enter_text(obs)
    if st.action["action"] == "click" and st.target is not None and st.target.tag == "input_text":
        return experts._click(st.target, "I double-click the text field to focus it before typing.", kind=KIND)
    return st


@pytest.fixture
def toy(monkeypatch):
    """double_click registered in the documented places only; monkeypatch removes it after the test."""
    monkeypatch.setitem(gui.ACTIONS, KIND, SPEC)
    monkeypatch.setitem(me.EXECUTORS, KIND, do_double_click)
    monkeypatch.setitem(experts.EXPERTS, "enter-text", expert_enter_text_by_double_click)
    yield
    # (teardown by monkeypatch) -- test_the_registries_are_restored checks nothing is left behind


def test_readme_counts_the_places_this_file_registers_into():
    text = (REPO / "README.md").read_text()
    section = text.split("## How to fork", 1)[1].split("\n## ", 1)[0]
    bullet = section.split("- **An action type**", 1)[1].split("\n- **", 1)[0]
    named = set(re.findall(r"`([\w./]+)`", bullet))
    assert named - {"ActionSpec", "tests/test_toy_action.py"} == AGENT | ENVIRONMENT | FLOOR, named
    assert "two places a side" in bullet  # agent: registry + rule; environment: executor + expert


def test_prompt_parse_and_match(toy):
    # the system prompt lists the new type (generated per build); the default text at import is as it was
    full = chat.full_system_prompt()
    assert f"- {SPEC.prompt}\n" in full and full.count('\n- {"action": ') == len(gui.ACTIONS)
    assert KIND not in chat.FULL_SYSTEM_PROMPT and full.replace(f"- {SPEC.prompt}\n", "") == chat.FULL_SYSTEM_PROMPT
    from vlm import load_processor

    tok, ip = load_processor("tiny")
    p = chat.build_prompt(tok, ip, chat.PromptSpec(), goal="g", screenshots=[(168, 224)], history=[], pixels=False)
    assert SPEC.prompt in p.messages[0]["content"][0]["text"] and SPEC.prompt in tok.decode(p.input_ids)
    # the derived type lists follow the registry: grounding accuracy counts it, the type lists know it
    from evaluation import metrics

    assert KIND in gui.action_types() and KIND in gui.action_types("point")
    assert metrics.static_metrics([{"expert_type": KIND, "type_match": True, "match": True}])["grounding_steps"] == 1
    assert KIND not in gui.action_types("text")

    # a response in the project's format parses; strict match: right point -> match, wrong -> type only
    text = gui.format_response("I double-click the field.", {"action": KIND, "coordinate": [80, 120]})
    parsed = gui.parse_response(text)
    assert parsed.error is None and parsed.action == {"action": KIND, "coordinate": [80, 120]}
    assert gui.parse_response(text.replace("[80, 120]", '"here"')).error == "invalid action"
    import dataset

    step = dataset.Step(None, {"action": KIND, "coordinate": [80, 120]}, candidate_bbox=[[70, 110, 90, 130]],
                        image_size=(168, 224))
    ok = reward.score_response(text, step, resized_size=(168, 224), orig_size=(168, 224))
    assert ok.match and ok.type_match and ok.reward == pytest.approx(1.0)
    far = reward.score_response(text.replace("[80, 120]", "[10, 10]"), step, resized_size=(168, 224),
                                orig_size=(168, 224))
    assert not far.match and far.type_match and far.reward == pytest.approx(0.1 + 0.9 * reward.SCORE_TYPE_ONLY)
    click = reward.score_response(gui.format_response("x", {"action": "click", "coordinate": [80, 120]}), step,
                                  resized_size=(168, 224), orig_size=(168, 224))
    assert not click.match and not click.type_match  # another type is another type
    # the published step protocols score it as the point action it is
    for rules in protocols.PROTOCOL_RULES.values():
        assert reward.action_match(parsed.action, step.action, step.candidate_bbox, (168, 224), rules=rules) == \
            (True, True), rules
        assert not reward.action_match({"action": KIND, "coordinate": [160, 10]}, step.action, step.candidate_bbox,
                                       (168, 224), rules=rules)[0], rules


def test_a_new_kind_of_argument_is_a_rule_in_reward_rules(toy, monkeypatch):
    # a type whose spec names a new rule is matched by that rule alone (here: the exact pixel)
    monkeypatch.setitem(reward.RULES, "exact", lambda p, e, boxes, size: list(p["coordinate"]) == e["coordinate"])
    monkeypatch.setitem(gui.ACTIONS, KIND, gui.ActionSpec(SPEC.args, "exact", SPEC.prompt))
    exp = {"action": KIND, "coordinate": [80, 120]}
    assert reward.action_match({"action": KIND, "coordinate": [80, 120]}, exp, [], (168, 224)) == (True, True)
    assert reward.action_match({"action": KIND, "coordinate": [81, 120]}, exp, [[0, 0, 168, 224]], (168, 224)) == \
        (False, True)
    assert KIND not in gui.action_types("point")  # not a "point" rule: no grounding step, no click floor


def test_every_registered_type_has_a_trivial_floor(toy):
    # the floors answer by rule, so a type on an existing rule has one; a new rule needs its own (README)
    import policies

    import dataset

    pol = policies.trivial_policies([(dataset.Step(None, {"action": KIND, "coordinate": [5, 5]}), (168, 224))])
    for kind, spec in gui.ACTIONS.items():
        assert any(kind in types for types, _ in pol.values() if types != gui.action_types()), (kind, spec.rule)


def test_short_and_varied_thoughts_of_the_new_type(toy):
    # a generic phrasing from the spec where a type has no wording of its own; none raises
    a = {"action": KIND, "coordinate": [3, 4]}
    assert experts._gist("", a) == "double-click (3,4)"
    assert experts.short_thought(a, None) == "Double-click."
    assert experts.short_thought({"action": "scroll_to", "text": "end"}, None) == "Scroll-to."  # not registered
    long_ = "I see the text field (empty) at (3,4). I double-click the text field to focus it before typing."
    assert experts._gist(long_, a) == "double-click the text field (empty)"
    steps = [{"action": a, "thought": long_}, {"action": a, "thought": "Something else."}]
    out = {t for j in range(12) for t in experts.varied_thoughts(steps, f"toy-{j}")}
    assert len(out) > 2 and not any("click (3,4)" in t and "double-click" not in t for t in out)


def test_the_registries_are_restored():
    assert KIND not in gui.ACTIONS and KIND not in me.EXECUTORS and KIND not in gui.action_types()
    assert experts.EXPERTS["enter-text"] is experts.expert_enter_text
    assert KIND not in chat.full_system_prompt()


def test_live_episode_data_and_replay(toy, tmp_path):
    """The executor in a live page, the expert's episode recorded by the data tool, its replay: SOP 1.0."""
    env = me.MiniWobEnv("enter-text")
    try:
        ep = experts.expert_episode(env, me.TEST_SEED_BASE, thoughts="varied")  # a fresh page: the field unfocused
        obs = env.reset(me.TEST_SEED_BASE + 1)
        field = next(e for e in obs["dom"] if e.id == "tt")
        env.driver.execute_script("window.__dbl = 0; document.getElementById('tt')"
                                  ".addEventListener('dblclick', function () { window.__dbl += 1; });")
        obs, _, done, info = env.step({"action": KIND, "coordinate": list(field.point)})
        assert not done and not info["invalid"] and env.driver.execute_script("return window.__dbl;") == 1
        assert next(e for e in obs["dom"] if e.id == "tt").focused
    finally:
        env.close()
    assert ep["success"], ep["reason"]
    kinds = [st["action"]["action"] for st in ep["steps"]]
    assert kinds == [KIND, "type", "click", "terminate"], kinds
    assert ep["steps"][0]["thought"].strip() and ep["steps"][0]["candidate_bbox"]

    # the data tool records it (one browser, one episode) in the shipped files' format
    import importlib

    data_tool = importlib.import_module("tools.make_miniwob_data")
    (tmp_path / "images").mkdir()
    res = data_tool.run_job(("enter-text", {"test": [me.TEST_SEED_BASE + 1]}, str(tmp_path), 12, 20.0, 0, "varied"))
    episodes = res["episodes"]["test"]
    assert len(episodes) == 1 and episodes[0]["steps"][0]["action_content"]["action"] == KIND, res["skipped"]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in episodes))

    # the expert's replay through the rollout driver: every step matched, SOP progress 1.0; the double click
    # counts as a grounding step of the static protocol
    import eval_sop

    s = eval_sop.main(["--data", str(path), "--image-root", str(tmp_path), "--protocol", "sop", "static"])
    assert s["pg"] == 1.0 and s["tsr"] == 1.0 and s["episodes"] == 1
    assert s["static_step_sr"] == 1.0 and s["static_grounding_steps"] == 2  # the double click and the Submit click
