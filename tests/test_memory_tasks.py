"""The memory tasks (envs/miniwob_pages/memory.html, envs/miniwob_tasks.OWN_TASKS) in a real headless Chromium:
the fact is on screen at step 0 and on no later screen, the using step (a choice, or the typed code) needs it,
the knobs do what they say, the expert (with its notes) always succeeds and cannot without them; the shipped
demonstrations (data/miniwob/memory_*.jsonl: the typed-recall tasks) replay to PG = TSR = 1.0. A few dozen
browser episodes, ~30 s on 2 cores."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dataset
import eval_sop
from envs import miniwob_env as me
from envs import miniwob_experts as experts
from envs import miniwob_tasks as mt

REPO = Path(__file__).resolve().parents[1]
MINIWOB = REPO / "data" / "miniwob"  # the memory files sit beside the others: memory_*.jsonl, one image root
TASKS = ["memory-code-1", "memory-name-2", "memory-code-3", "memory-type-1", "memory-type-3",
         "memory-d4-type-1", "memory-d4-type-3", "memory-d8-type-1", "memory-d8-type-3"]
SHIPPED = ["memory-type-1", "memory-type-3"]  # data/miniwob/memory_*.jsonl (the choosing tasks: pages only)


def use_step(task: str) -> int:
    """The step that needs the fact: the choice at gap + 1; the typing at gap + 1 when the field opens
    focused, else gap + 2 (the field is clicked first)."""
    knobs = mt.OWN_TASKS[task][1]
    return knobs["gap"] + 1 + (knobs.get("widget") == "type" and not knobs.get("focus"))


@pytest.fixture(scope="module")
def env():
    e = me.MiniWobEnv(TASKS[0], screenshots=False)
    yield e
    e.close()


def texts(obs) -> set[str]:
    """Every text of the page's DOM, visible or not (core.getDOMInfo's elements and text nodes)."""
    return {(e.text or "").strip() for e in obs["dom"]} | {str(e.value) for e in obs["dom"] if e.value is not None}


@pytest.mark.parametrize("task", TASKS)
def test_the_fact_leaves_the_screen_before_it_is_needed(env, task):
    # The fact is in step 0's element list; from step 1 to the using step it is nowhere in the DOM (so in no
    # element list and no screenshot of those steps; the goal banner never holds it); at a choosing step it
    # is one of `options` choices, at a typing step the field is empty and focused. With the
    # release's 2 screenshots kept, the using step's prompt shows steps u - 1 and u: free of the fact from
    # u >= 2 (distance 1 needs --num-images 1).
    page, knobs = mt.OWN_TASKS[task]
    env.load_task(task)
    u = use_step(task)
    for seed in (0, 1):
        obs, notes = env.reset(seed), []
        fact = next(e for e in obs["dom"] if e.id == "fact").label
        assert f"'{fact}'" in obs["elements"] and fact not in obs["goal"]
        if knobs["fact"] == "code":  # `chars`: digits only, or the 32 letters and digits (no O/0, I/1)
            assert len(fact) == knobs["len"] and set(fact) <= set("0123456789" if knobs.get("chars") == "digits"
                                                                   else "ABCDEFGHJKLMNPQRSTUVWXYZ23456789")
        for t in range(u):
            st = experts.expert_memory({**obs, "notes": notes})
            notes += [st.note] if st.note else []
            obs, reward, done, info = env.step(st.action)
            assert not done
            if t < knobs["gap"] or knobs.get("widget") == "type":  # a page in between or the empty field
                assert not any(fact in x for x in texts(obs)), (task, seed, t)
        assert not any(e.id == "fact" for e in obs["dom"]) and notes == [fact]
        if knobs.get("widget") == "type":  # the typing step: the field is empty and focused (opened so, or clicked)
            field = next(e for e in obs["dom"] if e.id == "tt")
            assert field.value == "" and field.focused
            assert experts.expert_memory({**obs, "notes": notes}).action == {"action": "type", "text": fact}
        else:  # the choosing step: the fact is back only as one of the choices, never as the shown fact
            choices = [e for e in obs["dom"] if (e.tag == "button" and "opt" in e.classes)
                       or (e.tag == "t" and any(r.parent == e.parent for r in obs["dom"] if r.tag == "input_radio"))]
            assert len(choices) == knobs["options"] and sorted(c.label for c in choices).count(fact) == 1
        assert goal_of(task) == obs["goal"]


def goal_of(task):
    if "type" in task:
        return "Remember the code you are shown. Go on through the pages, then type that code and click Submit."
    return ("Remember the contact's name. Go on through the pages, then select that name and click Submit."
            if "name" in task else "Remember the code you are shown. Go on through the pages, then click that code.")


def test_a_wrong_choice_fails_and_the_expert_needs_its_note(env):
    env.load_task("memory-code-3")
    obs = env.reset(4)
    fact = next(e for e in obs["dom"] if e.id == "fact").label
    for _ in range(3):  # Next, then the two pages in between, each its one button
        obs, *_ = env.step({"action": "click", "coordinate": list(next(e for e in obs["dom"] if e.tag == "button").point)})
    with pytest.raises(experts.ExpertError, match="no note holds it"):
        experts.expert_memory({**obs, "notes": []})  # nothing on the page tells the fact
    wrong = next(e for e in obs["dom"] if e.tag == "button" and e.label != fact)
    obs, reward, done, info = env.step({"action": "click", "coordinate": list(wrong.point)})
    assert done and reward == -1.0 and not info["success"]


def test_a_wrongly_typed_code_fails(env):
    # memory-type-1: the field opens focused; one character off is a failure, the exact code a success
    env.load_task("memory-type-1")
    for typed, want in ((None, 1.0), ("X", -1.0)):
        obs = env.reset(5)
        fact = next(e for e in obs["dom"] if e.id == "fact").label
        obs, *_ = env.step({"action": "click", "coordinate": list(next(e for e in obs["dom"] if e.id == "next").point)})
        obs, *_ = env.step({"action": "type", "text": fact if typed is None else fact[:-1] + ("Y" if fact[-1] == "X" else "X")})
        submit = next(e for e in obs["dom"] if e.id == "subbtn")
        obs, reward, done, info = env.step({"action": "click", "coordinate": list(submit.point)})
        assert done and reward == want and info["success"] == (want > 0)


def test_expert_succeeds_online_on_every_memory_task():
    res = me.evaluate_online(experts.expert_policy, TASKS, [700_000, 700_001], max_steps=8, screenshots=False,
                             progress=False)
    assert res["overall"]["success_rate"] == 1.0, res["episodes"]
    assert {t: r["mean_steps"] for t, r in res["per_task"].items()} == \
        {"memory-code-1": 2, "memory-name-2": 4, "memory-code-3": 4,  # Next, [pages,] choose[, Submit]
         "memory-type-1": 3, "memory-type-3": 5,                      # Next, [page, click field,] type, Submit
         "memory-d4-type-1": 3, "memory-d4-type-3": 5, "memory-d8-type-1": 3, "memory-d8-type-3": 5}


def test_own_tasks_are_registered_everywhere():
    assert mt.MEMORY_TASKS == TASKS and experts.task_list(["memory"]) == TASKS
    assert experts.short_thought({"action": "click", "coordinate": [1, 2]}, None, "K7Q2") == "Noted: 'K7Q2'. Click."
    assert len(experts.task_list(["all"])) == 18 and not set(experts.task_list(["all"])) & set(TASKS)  # data/miniwob's set
    for task in TASKS:
        assert mt.is_task(task) and task in experts.EXPERTS
        assert "memory.html?" in mt.task_page(task)
    experts.check_tasks(TASKS, need_expert=True)
    with pytest.raises(ValueError, match="memory-code-9"):
        mt.task_page("memory-code-9")


# -----------------------------------------------------------------------------
# the shipped demonstrations


def test_shipped_memory_data_matches_its_manifest():
    manifest = json.loads((MINIWOB / "memory_manifest.json").read_text())
    assert manifest["tasks"] == sorted(SHIPPED) and set(manifest["own_tasks"]) == set(SHIPPED)
    bases = {s: m["seed_base"] for s, m in manifest["splits"].items()}
    assert bases == {"train": 400_000, "test": 500_000, "rl": 600_000}  # no other data or results file uses these
    for split, m in manifest["splits"].items():
        eps = [json.loads(x) for x in (MINIWOB / m["file"]).read_text().splitlines()]
        assert len(eps) == m["episodes"] == len(SHIPPED) * m["seeds_per_task"] and not m["skipped"]
        assert all(bases[split] <= e["seed"] < bases[split] + m["seeds_per_task"] for e in eps)
        for e in eps:  # step 0 notes the fact it shows; no later step shows it up to its use, which names it
            fact = re.match(r"I see the button 'Next' at \(\d+,\d+\)\. The (code|name) is '(\S+)' and I note it",
                            e["steps"][0]["thought"])[2]
            u = use_step(e["task"])
            assert f"'{fact}'" in e["steps"][0]["elements"]
            assert not any(fact in s["elements"] for s in e["steps"][1:u + 1])
            assert f"'{fact}'" in e["steps"][u]["thought"] and e["steps"][u]["action_content"] == {"action": "type", "text": fact}
            assert all((MINIWOB / st["screenshot"]).is_file() for st in e["steps"])


@pytest.mark.parametrize("name", ["train", "test", "rl", "train_varied", "test_varied", "rl_varied"])
def test_shipped_memory_data_replays_perfectly(name, capsys):
    path = MINIWOB / f"memory_{name}.jsonl"
    s = eval_sop.main(["--data", str(path), "--image-root", str(MINIWOB), "--per-task-limit", "4"])
    assert s["pg"] == 1.0 and s["tsr"] == 1.0 and s["episodes"] == 4 * len(SHIPPED)
    assert len(dataset.load_episodes(str(path))) > 0


def test_the_data_tool_writes_a_prefixed_family_beside_others(tmp_path):
    # --prefix: memory_{train,test,rl}.jsonl and memory_manifest.json beside a folder's other files, whose
    # files and images stay; --rl-seeds adds the rl split; overlapping seed ranges are refused
    out = tmp_path / "mw"
    (out / "images").mkdir(parents=True)
    (out / "images" / "enter-text-0-0.png").write_bytes(b"keep")
    (out / "train.jsonl").write_text("keep\n")
    base = [sys.executable, "tools/make_miniwob_data.py", "--out", str(out), "--tasks", "memory-type-1", "--prefix",
            "memory_", "--workers", "1", "--train-seeds", "1", "--train-seed-base", "400000", "--test-seeds", "1",
            "--test-seed-base", "500000"]
    p = subprocess.run(base + ["--rl-seeds", "1", "--rl-seed-base", "600000"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["images"] == 12  # 3 episodes x (Next, type, Submit, terminate)
    assert (out / "train.jsonl").read_text() == "keep\n" and (out / "images" / "enter-text-0-0.png").read_bytes() == b"keep"
    for split, seed in (("train", 400000), ("test", 500000), ("rl", 600000)):
        (ep,) = [json.loads(x) for x in (out / f"memory_{split}.jsonl").read_text().splitlines()]
        assert ep["seed"] == seed and all((out / st["screenshot"]).is_file() for st in ep["steps"])
        # the same episode as the shipped file's first of that split: the pages are deterministic per seed
        shipped = json.loads((MINIWOB / f"memory_{split}.jsonl").read_text().splitlines()[0])
        assert ep == shipped
    assert set(json.loads((out / "memory_manifest.json").read_text())["splits"]) == {"train", "test", "rl"}
    bad = subprocess.run(base + ["--rl-seeds", "2", "--rl-seed-base", "499999"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "test seeds 500000+1 and rl seeds 499999+2 overlap" in bad.stderr


@pytest.mark.parametrize("name", ["test", "test_varied"])
def test_at_the_using_step_only_the_agents_history_tells_the_fact(name):
    # The using step's real prompt under expert history (chat.step_prompt, the one SFT, RL and evaluation
    # use), with the screenshots a memory task is run with (1 at distance 1, the release's 2 beyond): the fact
    # occurs only in earlier assistant turns (the typing step's element list has an empty field); no kept
    # screenshot's element list holds it.
    import chat
    import gui
    from vlm import load_processor

    tok, proc = load_processor()
    for ep in dataset.load_episodes(str(MINIWOB / f"memory_{name}.jsonl"))[::8]:
        u = use_step(ep.task)
        k = 1 if u == 1 else 2
        fact = next(ln.split("'")[1] for ln in ep.steps[0].elements.splitlines() if ln.split()[1] == "b")
        history = [gui.expert_response(st, (168, 224), thought=st.thought) for st in ep.steps[:u]]
        spec = chat.PromptSpec(num_images=k, system_prompt="short")
        p = chat.step_prompt(tok, proc, spec, goal=ep.goal, step=ep.steps[u], screenshots=[(168, 224)] * (u + 1),
                             history=history, pixels=False)
        text = tok.decode(p.input_ids.tolist())
        assert p.image_steps == list(range(u + 1 - k, u + 1))
        assert text.count(fact) == sum(h.count(fact) for h in history) >= 1
        assert all(fact not in ep.steps[i].elements for i in p.image_steps)
