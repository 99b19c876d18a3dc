"""The results log and the README name commits, commands and 'a separate clone', never the folders of the
machine a run happened on (a reader's machine has none of them)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|tmp|root|home|mnt|scratch)/")


def test_no_machine_paths_in_the_log_and_readme():
    for name in ("results/LOG.md", "README.md"):
        hits = [f"{name}:{n}: {line.strip()[:80]}" for n, line in enumerate((REPO / name).read_text().splitlines(), 1)
                if MACHINE_PATH.search(line)]
        assert not hits, "machine paths: " + "; ".join(hits)


def test_the_pattern_catches_a_machine_path():
    assert MACHINE_PATH.search("in clone /work/run17, nothing reused")
    assert MACHINE_PATH.search("--out /tmp/ev")
    assert not MACHINE_PATH.search("out/eval/tmp/x and data/miniwob_click/test.jsonl")
