"""The documentation: the API reference builds from the docstrings (``mkdocs build --strict``),
covers every public op, and the project's pages link to files that exist and speak of the
software (no work-log "session N" or issue numbers)."""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
#: The pages written for readers of the project (the kernels' notes are checked by their build).
PROJECT_PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "examples" / "README.md",
                 *sorted((ROOT / "docs").glob("*.md")), *API_PAGES]


def _documented() -> set[str]:
    """Every object path the API pages render (``::: path``, and its ``members:`` list)."""
    paths = set()
    for page in API_PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"^::: (\S+)\n((?:    .*\n)*)", text + "\n", re.M):
            paths.add(match.group(1))
            members = re.search(r"members:\n((?:\s+- \S+\n)+)", match.group(2))
            if members:
                paths |= {f"{match.group(1)}.{m}" for m in re.findall(r"- (\S+)", members.group(1))}
    return paths


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None
                    or importlib.util.find_spec("mkdocstrings_handlers") is None,
                    reason="mkdocs and mkdocstrings-python are not installed "
                           "(pip install -e '.[docs]'; [dev] has them)")
def test_api_reference_builds_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ops = (site / "api" / "ops" / "index.html").read_text(encoding="utf-8")
    for name in ("softmax", "layer_norm", "matmul", "attention", "conv2d"):
        assert f'id="triton_workshop.ops.' in ops and name in ops, name
    # The docstrings themselves are on the page, not just the names.
    assert "validates its arguments" in ops
    assert (site / "api" / "nn" / "index.html").is_file()
    assert "patch_model" in (site / "api" / "transformers" / "index.html").read_text()


def test_every_public_op_and_module_has_an_api_entry():
    import triton_workshop as tw
    import triton_workshop.nn as twnn

    documented = _documented()
    leaves = {path.rsplit(".", 1)[-1] for path in documented}
    missing = []
    for module, names in ((tw, tw.__all__), (twnn, twnn.__all__)):
        for name in names:
            obj = getattr(module, name)
            if inspect.ismodule(obj) or not (callable(obj) or isinstance(obj, dict)):
                continue  # nn itself; DEVICE and INTERPRET are on the runtime page
            if getattr(obj, "__name__", name) not in leaves and name not in leaves:
                missing.append(f"{module.__name__}.{name}")
    assert not missing, f"add a '::: ...' line to a page of docs/api/ for: {missing}"


def test_api_pages_name_existing_objects():
    """Each ``::: path`` names a module or an attribute of one (the build says where, this says
    which, without mkdocs installed)."""
    for path in sorted(p for p in _documented() if p.count(".") >= 1):
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            module_name = ".".join(parts[:cut])
            try:
                obj = importlib.import_module(module_name)
            except ImportError:
                continue
            for attr in parts[cut:]:
                assert hasattr(obj, attr), f"{path}: {module_name} has no {attr}"
                obj = getattr(obj, attr)
            break
        else:
            pytest.fail(f"{path}: no importable module")


def _relative_links(page: Path):
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
            yield target.split("#", 1)[0]


@pytest.mark.parametrize("page", PROJECT_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_point_to_existing_files(page):
    broken = [t for t in _relative_links(page) if t and not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to missing paths: {broken}"


@pytest.mark.parametrize("page", PROJECT_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_speak_of_the_software_not_of_its_work_log(page):
    text = page.read_text(encoding="utf-8")
    found = re.findall(r"\b[Ss]essions? ?\d+|\bsession\d+|\b[Ii]ssues? #?\d+|(?<![\w/-])#\d+\b",
                       text)
    assert not found, f"{page.relative_to(ROOT)}: {found}"


def test_results_folders_are_named_by_date_gpu_and_commit():
    folders = [p.name for p in (ROOT / "docs" / "results").iterdir() if p.is_dir()]
    runs = [f for f in folders if f != "latest"]
    assert runs
    for name in runs:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9]+-[0-9a-f]{7,}", name), name
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    for name in runs:  # every run's files are linked from its section
        assert f"](results/{name}/)" in results, name


def test_api_pages_python_blocks_run():
    """The examples on the API pages run as written."""
    blocks = [(page, block) for page in API_PAGES
              for block in re.findall(r"```python\n(.*?)\n```", page.read_text(), flags=re.S)]
    assert blocks
    for page, block in blocks:
        exec(compile(block, str(page), "exec"), {})
