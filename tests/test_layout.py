"""The shape of the house a reader walks into: stage files short enough to read in one sitting, no
import circle among the product's modules, kernels/ standing alone, training independent of
evaluation. Parsed with ast, nothing imported."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ["train_sft.py", "train_semionline.py", "rollout.py", "patch.py", "advantage.py", "eval_sop.py"]
PRODUCT = sorted(p.stem for p in REPO.glob("*.py")) + ["kernels", "envs", "tools"]


def module_files():
    """{module name: path} of the product: top-level modules and the packages' modules."""
    files = {p.stem: p for p in REPO.glob("*.py")}
    for pkg in ("kernels", "envs", "tools"):
        files.update({f"{pkg}.{p.stem}": p for p in (REPO / pkg).glob("*.py") if p.stem != "__init__"})
    return files


def imports(path: Path, name: str) -> set[str]:
    """Product modules `path` imports (absolute and relative), as module names."""
    out = set()
    pkg = name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = f"{pkg}.{node.module}" if node.level and node.module else (pkg if node.level else node.module)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n and n.split(".")[0] in PRODUCT}
    return out


def graph():
    files = module_files()
    return {m: {i for i in imports(p, m) if i in files and i != m} for m, p in files.items()}


def test_stage_files_are_short():
    for f in STAGES:
        n = len((REPO / f).read_text().splitlines())
        assert n <= 700, f"{f}: {n} lines"  # a stage reads top to bottom: 300-700 lines (nanoGPT, nanochat)
    for m, p in module_files().items():
        n = len(p.read_text().splitlines())
        assert n <= 800, f"{p.relative_to(REPO)}: {n} lines"


def test_no_import_circle():
    g = graph()
    state = {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(g[m]):
            assert state.get(n) != "open", "import circle: " + " -> ".join(path + [n])
            if n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m, [m])


def test_kernels_stand_alone_and_training_does_not_import_evaluation():
    g = graph()
    assert any(m.startswith("kernels.") for m in g)
    for m, deps in g.items():
        if m.startswith("kernels."):
            assert all(d.startswith("kernels") for d in deps), (m, deps)
    assert "eval_sop" not in g["train_semionline"] and "eval_sop" not in g["train_sft"]
    assert not any(isinstance(n, ast.ClassDef) and n.name == "Sampler"
                   for n in ast.parse((REPO / "rollout.py").read_text()).body)
