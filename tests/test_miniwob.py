"""MiniWob++ environment, experts and data generator, in a real headless Chromium (never skipped:
CI installs Debian's chromium and chromium-driver). About a minute on 2 CPU cores."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from envs import miniwob_env as me
from envs import miniwob_experts as experts

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def env_factory():
    """One browser per task for the whole module; closed at the end."""
    envs = {}

    def get(task, **kw):
        if task not in envs:
            envs[task] = me.MiniWobEnv(task, **kw)
        return envs[task]

    yield get
    for env in envs.values():
        env.close()


# -----------------------------------------------------------------------------
# action mapping (pure)


def test_screen_size_survives_smart_resize():
    # The screenshot is 168 x 224 (multiples of 28), so Qwen2.5-VL's smart_resize keeps it: model
    # pixels == page pixels == element-box pixels. The bare 160 x 210 task area would not be kept.
    import gui

    assert (me.SCREEN_W, me.SCREEN_H) == (168, 224) and (me.TASK_W, me.TASK_H) == (160, 210)
    assert me.SCREEN_W % 28 == 0 and me.SCREEN_H % 28 == 0
    assert gui.resized_size((me.SCREEN_W, me.SCREEN_H)) == (me.SCREEN_W, me.SCREEN_H)
    assert gui.resized_size((me.TASK_W, me.TASK_H)) != (me.TASK_W, me.TASK_H)


def test_to_page_xy_identity_on_original_pixels():
    # every pixel of the screenshot (and of the smart_resize'd screenshot, the same size) is
    # its own page pixel, the task area's corner and the background margin included
    for x in range(me.SCREEN_W):
        for y in (0, 57, 209, 210, 223):
            assert me.to_page_xy([x, y]) == (x, y)
            assert me.to_page_xy([x, y], (168, 224)) == (x, y)
    assert me.to_page_xy([167, 223], (168, 224)) == (167, 223)


def test_to_page_xy_resized_round_trip():
    # A policy that saw the screenshot at another size (here 2x and 1.5x) answers in those
    # pixels: every page pixel, sent to the image pixel that holds its centre, comes back to
    # itself. (w, h) order: image_size is (W, H).
    for W, H in ((336, 448), (252, 336)):
        for x in range(me.SCREEN_W):
            for y in (0, 57, 209, 223):
                rx, ry = int((x + 0.5) * W / me.SCREEN_W), int((y + 0.5) * H / me.SCREEN_H)
                assert me.to_page_xy([rx, ry], (W, H)) == (x, y)
    assert me.to_page_xy([201, 301], (336, 448)) == (100, 150)
    # a transposed size would move points: the (W, H) contract matters
    assert me.to_page_xy([100, 200], (448, 336)) != me.to_page_xy([100, 200], (336, 448))
    # downscaled images map to the page pixel under the centre of the image pixel
    assert me.to_page_xy([0, 0], (84, 112)) == (1, 1)
    assert me.to_page_xy([83, 111], (84, 112)) == (167, 223)


def test_to_page_xy_clamps_and_rejects():
    assert me.to_page_xy([-5, 999]) == (0, 223)
    assert me.to_page_xy([999, -5], (336, 448)) == (167, 0)
    assert me.to_page_xy([10.4, 20.6]) == (10, 21)
    with pytest.raises(ValueError):
        me.to_page_xy([float("nan"), 3])
    with pytest.raises(ValueError):
        me.to_page_xy([1, 2], (0, 224))


# -----------------------------------------------------------------------------
# the live environment


def test_screenshot_pixels_are_page_pixels(env_factory):
    env = env_factory("click-test")
    obs = env.reset(0)
    img = obs["screenshot"]
    assert img.size == (me.SCREEN_W, me.SCREEN_H) and img.mode == "RGB"
    btn = next(e for e in obs["dom"] if e.id == "subbtn")
    x1, y1, x2, y2 = btn.box
    y = y1 + 3  # a row above the label text
    # the button's border lies exactly on its DOM box edges in the screenshot
    assert img.getpixel((x1, y)) != img.getpixel((x1 - 1, y)) == (255, 255, 255)
    assert img.getpixel((x2 - 1, y)) != img.getpixel((x2, y)) == (255, 255, 255)
    assert img.getpixel((x1 + 3, y)) != (255, 255, 255)
    # the goal banner is the top 50 px, yellow
    assert img.getpixel((155, 49)) == (255, 255, 0) and img.getpixel((155, 50)) == (255, 255, 255)
    # the 160 x 210 task area (white) sits at the top-left; the margin is page background (#555)
    assert img.getpixel((159, 209)) == (255, 255, 255)
    assert img.getpixel((160, 100)) == img.getpixel((100, 210)) == (85, 85, 85)
    assert img.getpixel((167, 223)) == (85, 85, 85)


def test_click_in_resized_pixels_reaches_the_page(env_factory):
    env = env_factory("click-test")
    W, H = 336, 448  # a policy that saw the screenshot at twice its size
    sx, sy = W / me.SCREEN_W, H / me.SCREEN_H
    obs = env.reset(1)
    btn = next(e for e in obs["dom"] if e.id == "subbtn")
    x1, y1, x2, y2 = btn.box
    # a point just outside the button (resized pixels) does nothing ...
    out = [int((x2 + 2 + 0.5) * sx) if x2 + 2 < me.TASK_W else int((x1 - 3 + 0.5) * sx),
           int(((y1 + y2) / 2) * sy)]
    obs, reward, done, info = env.step({"action": "click", "coordinate": out}, image_size=(W, H))
    assert not done and reward == 0.0
    # ... a point inside it, in resized pixels, clicks it
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    obs, reward, done, info = env.step(
        {"action": "click", "coordinate": [int(cx * sx), int(cy * sy)]}, image_size=(W, H))
    assert done and info["success"] and reward == 1.0 and obs is None


def test_click_in_smart_resized_pixels_is_identity(env_factory):
    # image_size (168, 224), what smart_resize gives the model, is the page itself: a box read
    # off the element list is clicked as is; a click in the margin hits no widget
    env = env_factory("click-test")
    obs = env.reset(2)
    btn = next(e for e in obs["dom"] if e.id == "subbtn")
    x1, y1, x2, y2 = btn.box
    assert f"({x1},{y1},{x2},{y2})" in obs["elements"] and x2 <= me.TASK_W and y2 <= me.TASK_H
    obs, reward, done, info = env.step({"action": "click", "coordinate": [164, (y1 + y2) // 2]},
                                       image_size=(168, 224))
    assert not done and reward == 0.0
    obs, reward, done, info = env.step({"action": "click", "coordinate": [x1, y2 - 1]},
                                       image_size=(168, 224))
    assert done and info["success"] and reward == 1.0


def test_reset_is_deterministic_per_seed(env_factory):
    env = env_factory("click-checkboxes", screenshots=False)
    a = env.reset(7)
    env.reset(8)
    b = env.reset(7)
    assert a["goal"] == b["goal"] and a["elements"] == b["elements"]
    assert a["goal"] != env.reset(8)["goal"] or a["elements"] != env.reset(8)["elements"]


def test_success_needs_full_raw_reward(env_factory):
    # click-checkboxes pays (right - wrong) / n: submitting at once on seed 8 (6 boxes, 2 to
    # check) earns raw reward 2/6 > 0. That is a wrong answer, not a success (docs/method.md §11).
    env = env_factory("click-checkboxes", screenshots=False)
    obs = env.reset(8)
    assert sum(e.tag == "input_checkbox" for e in obs["dom"]) == 6
    submit = next(e for e in obs["dom"] if e.id == "subbtn")
    obs, reward, done, info = env.step({"action": "click", "coordinate": list(submit.point)})
    assert done and 0 < reward < 1 and not info["success"]


def test_invalid_and_terminate_actions(env_factory):
    env = env_factory("enter-text", screenshots=False)
    env.reset(0)
    for bad in [None, {}, {"action": "fly"}, {"action": "click"}, {"action": "click", "coordinate": "x"},
                {"action": "key", "text": "NoSuchKey"}]:
        obs, reward, done, info = env.step(bad)
        assert info["invalid"] and not done and obs is not None
    obs, reward, done, info = env.step({"action": "wait", "time": 0.1})
    assert not info["invalid"] and not done
    obs, reward, done, info = env.step({"action": "terminate", "status": "success"})
    assert done and info["terminated"] and not info["success"] and reward == 0.0
    with pytest.raises(RuntimeError):
        env.step({"action": "wait", "time": 0})


def test_type_and_enter_key_through_our_actions(env_factory):
    env = env_factory("enter-text", screenshots=False)
    obs = env.reset(3)
    target = obs["fields"]["target"]
    field = next(e for e in obs["dom"] if e.id == "tt")
    obs, *_ = env.step({"action": "click", "coordinate": list(field.point)})
    obs, *_ = env.step({"action": "type", "text": target})
    assert next(e for e in obs["dom"] if e.id == "tt").value == target
    obs, *_ = env.step({"action": "key", "text": "Backspace"})
    assert next(e for e in obs["dom"] if e.id == "tt").value == target[:-1]


def test_refs_stay_unique_across_recorded_episodes(env_factory):
    # the terminate step's look at the finished page gives elements refs; the next episode
    # must not reuse them (duplicate refs once sent the multi-layouts expert into a loop)
    env = env_factory("multi-layouts")
    for seed in (0, 1, 2):
        ep = experts.expert_episode(env, seed)
        assert ep["success"] and len(ep["steps"]) == 8  # 3 x (click, type), submit, terminate
    obs = env.reset(3)
    assert len({e.ref for e in obs["dom"]}) == len(obs["dom"])


# -----------------------------------------------------------------------------
# experts end to end, online evaluation


def test_expert_online_success_multi_step_tasks():
    tasks = ["login-user", "click-checkboxes", "search-engine"]
    res = me.evaluate_online(experts.expert_policy, tasks, 3, max_steps=12, progress=False)
    for task in tasks:
        r = res["per_task"][task]
        assert r["success_rate"] == 1.0, (task, res["episodes"])
        assert r["episodes"] == 3 and r["failures"] == {c: 0 for c in me.CAUSES}
    assert res["per_task"]["login-user"]["mean_steps"] == 5  # click, type, click, type, click
    ep = res["episodes"][0]
    assert ep["seed"] == me.TEST_SEED_BASE and ep["cause"] == "success"


def test_page_timer_ends_the_episode_as_a_time_out():
    """MiniWob++'s own episode timer fires before the action is sent: the page ends the episode (raw -1,
    'timed out') and shows its START cover. The action must not be sent (on the cover it would start a
    new problem and the episode would go on); the step reports the time-out, evaluation counts it."""
    env = me.MiniWobEnv("click-button", screenshots=False, episode_time_s=0.4)
    try:
        obs = env.reset(3)
        button = next(e for e in obs["dom"] if e.tag == "button")
        time.sleep(0.8)
        obs, reward, done, info = env.step({"action": "click", "coordinate": list(button.point)})
        assert done and obs is None and info["timed_out"] and not info["success"] and reward == -1.0
        assert info["reason"] == me.TIMED_OUT
        assert env.driver.execute_script("return WOB_DONE_GLOBAL;")  # no new problem was started
        with pytest.raises(RuntimeError):
            env.step({"action": "wait", "time": 0})
    finally:
        env.close()

    def slow_expert(o, t):
        time.sleep(0.8)
        return experts.expert_policy(o, t)

    res = me.evaluate_online(slow_expert, ["click-button"], 2, max_steps=3, screenshots=False, progress=False,
                             episode_time_s=0.4)
    assert [e["cause"] for e in res["episodes"]] == ["time_out", "time_out"]
    assert res["overall"]["failures"]["time_out"] == 2 and res["overall"]["success_rate"] == 0.0
    fast = me.evaluate_online(experts.expert_policy, ["click-button"], 2, max_steps=3, screenshots=False,
                              progress=False)
    assert fast["overall"]["success_rate"] == 1.0 and fast["overall"]["failures"]["time_out"] == 0


def test_random_policy_fails_and_counts_causes():
    res = me.evaluate_online(experts.random_click_policy, ["login-user"], 2, max_steps=3,
                             screenshots=False, progress=False)
    r = res["per_task"]["login-user"]
    assert r["success_rate"] == 0.0
    assert sum(r["failures"].values()) == 2 and r["failures"]["browser_fault"] == 0


def test_browser_fault_is_counted_not_hung(monkeypatch):
    calls = []

    def broken_reset(self, seed):
        calls.append(seed)
        raise me.BrowserFault("simulated crash")

    monkeypatch.setattr(me.MiniWobEnv, "reset", broken_reset)
    res = me.evaluate_online(experts.expert_policy, ["click-test"], [5], retries=1, progress=False)
    assert calls == [5, 5]  # one retry, then counted
    assert res["per_task"]["click-test"]["failures"]["browser_fault"] == 1
    assert res["episodes"][0]["attempts"] == 2


def _as_batched(policy, calls):
    """A per-episode policy as a batched one, recording the size of every call."""
    def batched(obs_list, steps):
        calls.append(len(obs_list))
        return [policy(o, t) for o, t in zip(obs_list, steps)]
    batched.batched = True
    return batched


def test_batched_evaluation_matches_one_at_a_time(monkeypatch):
    """Episodes played 4 at a time (continuous batching over two tasks, browsers handed from task to
    task) end exactly as one at a time, in the same order; one browser serves both tasks at batch 1."""
    starts = []
    real_start = me.MiniWobEnv.start
    monkeypatch.setattr(me.MiniWobEnv, "start", lambda self: (starts.append(self.task), real_start(self))[1])
    ends = {}
    for bs in (1, 4):
        calls, starts[:] = [], []
        t0 = time.time()
        res = me.evaluate_online(_as_batched(experts.expert_policy, calls), ["click-test", "enter-text"], 3,
                                 max_steps=6, batch_size=bs, progress=False)
        wall = time.time() - t0
        ends[bs] = [(e["task"], e["seed"], e["success"], e["steps"], e["cause"]) for e in res["episodes"]]
        assert res["overall"]["success_rate"] == 1.0 and max(calls) == bs
        assert len(starts) == bs  # browsers are reused across tasks, never one per episode
        assert sum(calls) == 3 * 1 + 3 * 3  # click; click, type, submit (enter-text)
        assert all(e["seconds"] > 0 and e["env_seconds"] > 0 for e in res["episodes"])
        assert 0.5 * wall < sum(e["seconds"] for e in res["episodes"]) <= wall  # shares of the wall time
    assert ends[1] == ends[4]
    assert [e[:2] for e in ends[4]] == [(t, me.TEST_SEED_BASE + k) for t in ("click-test", "enter-text") for k in range(3)]


def test_batched_policy_error_and_browser_fault(monkeypatch):
    """Under batching a browser fault retries that episode alone, and a batched policy that raises ends
    the episodes it was asked about (policy_error), never the run."""
    real_reset = me.MiniWobEnv.reset
    tried = []

    def reset(self, seed):
        tried.append(seed)
        if seed == 6:
            raise me.BrowserFault("simulated crash")
        return real_reset(self, seed)

    monkeypatch.setattr(me.MiniWobEnv, "reset", reset)
    res = me.evaluate_online(_as_batched(experts.expert_policy, []), ["click-test"], [5, 6, 7], batch_size=3,
                             progress=False)
    assert [(e["seed"], e["cause"], e["attempts"]) for e in res["episodes"]] == \
        [(5, "success", 1), (6, "browser_fault", 2), (7, "success", 1)]
    assert tried.count(6) == 2
    monkeypatch.setattr(me.MiniWobEnv, "reset", real_reset)

    def broken(obs_list, steps):
        raise KeyError("no such element")
    broken.batched = True
    res = me.evaluate_online(broken, ["click-test"], [5, 6], batch_size=2, progress=False)
    assert [(e["cause"], e["steps"]) for e in res["episodes"]] == [("policy_error", 0)] * 2
    assert "KeyError" in res["episodes"][0]["error"]
    with pytest.raises(ValueError, match="batch_size 0"):
        me.evaluate_online(experts.expert_policy, ["click-test"], [5], batch_size=0)
    with pytest.raises(ValueError, match="click-tset"):
        me.evaluate_online(experts.expert_policy, ["click-tset"], [5])


def test_hung_page_is_killed_and_browser_restarts():
    env = me.MiniWobEnv("click-test", step_timeout_s=4.0)
    try:
        obs = env.reset(0)
        btn = next(e for e in obs["dom"] if e.id == "subbtn")
        env.driver.execute_script(  # a page whose click handler never returns
            "document.getElementById('subbtn').addEventListener('click', function () {"
            " while (true) {} });")
        t0 = time.time()
        with pytest.raises(me.BrowserFault):
            env.step({"action": "click", "coordinate": list(btn.point)})
        assert time.time() - t0 < 15
        assert env.driver is None
        obs = env.reset(0)  # a fresh browser
        assert env.n_starts == 2 and obs["goal"] == "Click the button."
        # a browser killed from outside: the next step raises BrowserFault instead of hanging
        os.killpg(env._service.process.pid, signal.SIGKILL)
        with pytest.raises(me.BrowserFault):
            env.step({"action": "click", "coordinate": [80, 100]})
        assert env.reset(1)["goal"] == "Click the button." and env.n_starts == 3
    finally:
        env.close()


# -----------------------------------------------------------------------------
# the data generator


def test_generated_data_round_trips(tmp_path):
    out = tmp_path / "mw"
    cmd = [sys.executable, "tools/make_miniwob_data.py", "--out", str(out), "--tasks", "enter-text",
           "click-option", "--train-seeds", "2", "--test-seeds", "1", "--workers", "1"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["train_episodes"] == 4 and summary["test_episodes"] == 2 and summary["skipped"] == 0

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tasks"] == ["click-option", "enter-text"]
    assert manifest["image_size"] == [168, 224]
    assert manifest["versions"]["miniwob"] == "1.1.0" and manifest["versions"]["chromium"]
    seeds = {}
    for split in ("train", "test"):
        lines = (out / f"{split}.jsonl").read_text().splitlines()
        eps = [json.loads(line) for line in lines]
        assert [json.loads(json.dumps(e)) for e in eps] == eps  # plain JSON through and through
        seeds[split] = {e["seed"] for e in eps}
        for e in eps:
            assert set(e) == {"goal", "episode_id", "task", "seed", "image_size", "steps"}
            assert e["episode_id"] == f"{e['task']}-{e['seed']}" and e["image_size"] == [168, 224]
            assert e["goal"] and e["steps"][-1]["action_content"] == {"action": "terminate",
                                                                      "status": "success"}
            assert "button 'Submit'" in e["steps"][-1]["elements"]  # the finished task, no cover
            for k, st in enumerate(e["steps"]):
                assert set(st) == {"screenshot", "action_content", "thought", "elements",
                                   "check_options"}
                assert st["screenshot"] == f"images/{e['episode_id']}-{k}.png"
                assert Image.open(out / st["screenshot"]).size == (168, 224)
                a, co = st["action_content"], st["check_options"]
                assert co["action"] == a["action"] and st["thought"]
                if a["action"] == "click":  # the expert point lies in the target box
                    (x1, y1, x2, y2), = co["candidate_bbox"]
                    x, y = a["coordinate"]
                    assert x1 <= x < x2 and y1 <= y < y2 and all(isinstance(v, int) for v in (x, y))
                    assert f"({x1},{y1},{x2},{y2})" in st["elements"]
        n_steps = {e["task"]: len(e["steps"]) for e in eps}
        assert n_steps["enter-text"] == 4 and n_steps["click-option"] == 3  # + terminate
    assert seeds["train"] == {0, 1} and seeds["test"] == {me.TEST_SEED_BASE}
    assert manifest["splits"]["train"]["episodes"] == 4

    import dataset  # the foundation loader reads the files as written

    eps = dataset.load_episodes(str(out / "train.jsonl"))
    assert len(eps) == 4 and eps[0].steps[0].image_size == (168, 224)
    assert dataset.load_screenshot(eps[0].steps[0]).size == (168, 224)


def test_short_thoughts_copy_the_element_line(tmp_path):
    # --thoughts short: a click's thought names the target as its element line does, with the
    # point the expert clicks, so "tag 'text' at (x,y)" is copied from the prompt, never computed
    out = tmp_path / "mw"
    cmd = [sys.executable, "tools/make_miniwob_data.py", "--out", str(out), "--tasks", "click-button", "enter-text",
           "--train-seeds", "2", "--test-seeds", "1", "--workers", "1", "--thoughts", "short"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((out / "manifest.json").read_text())["args"]["thoughts"] == "short"
    kinds = set()
    for line in (out / "train.jsonl").read_text().splitlines():
        for st in json.loads(line)["steps"]:
            a, thought = st["action_content"], st["thought"]
            kinds.add(a["action"])
            if a["action"] == "click":
                x, y = a["coordinate"]
                assert thought.startswith("Click ") and thought.endswith(f" at ({x},{y}).")
                assert f"{thought[len('Click '):-1]} (" in st["elements"]  # the target's line, box next
            elif a["action"] == "type":
                assert thought == f"Type '{a['text']}'."
            else:
                assert a["action"] == "terminate" and thought == "Done."
    assert kinds == {"click", "type", "terminate"}
