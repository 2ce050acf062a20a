"""The README is a way in and the docs hold together: the README stays short
and maps every page of docs/ and every folder of src/, every relative link
resolves, tools/prose.py counts as its docstring says, `make docs` builds a
self-contained API reference, and bench/chart.py draws its charts."""
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import TOP

sys.path.insert(0, str(TOP / "tools"))
import prose  # noqa: E402

README = TOP / "README.md"
DOCS = sorted((TOP / "docs").glob("*.md"))


def test_readme_is_a_way_in():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for heading in ["## Quick start", "## The three calls", "## Where ckptd runs", "## Map of docs/",
                    "## Map of src/"]:
        assert heading in text, heading
    assert "make run" in text and "make check" in text


def test_readme_maps_every_doc_and_every_src_folder():
    text = README.read_text()
    for page in DOCS:
        assert f"(docs/{page.name})" in text, f"README's map of docs/ misses {page.name}"
    for folder in sorted(p for p in (TOP / "src").rglob("*") if p.is_dir()):
        rel = folder.relative_to(TOP).as_posix()
        assert f"`{rel}/`" in text, f"README's map of src/ misses {rel}/"


@pytest.mark.parametrize("doc", [README] + DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    for m in re.finditer(r"\]\(([^)#\s]+)(#[^)]*)?\)", text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_prose_counts_as_documented(tmp_path):
    f = tmp_path / "x.md"
    long = " ".join(["word"] * 45) + "."
    f.write_text("# A heading that is long " + "and longer " * 20 + "\n\n"
                 "```\n" + long + "\n```\n\n"
                 "| a table row | " + long + " |\n\n"
                 "Two short sentences here. See [a link](x.md), e.g. this one, with `a. b` code.\n\n"
                 "- a list item without a full stop\n"
                 "- another one\n  continued on a second line\n")
    n, avg, over = prose.measure(f)
    assert n == 4, (n, avg)  # the heading, code block and table row are skipped
    assert over == []
    f.write_text(long + "\n\nShort.\n")
    n, avg, over = prose.measure(f)
    assert n == 2 and avg == 23 and [o[1] for o in over] == [45]
    r = subprocess.run([sys.executable, str(TOP / "tools/prose.py"), str(f)], capture_output=True, text=True)
    assert r.returncode == 1 and "45 words" in r.stdout, r.stdout + r.stderr


def test_prose_of_the_docs_passes():
    r = subprocess.run([sys.executable, str(TOP / "tools/prose.py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_make_docs_builds_a_self_contained_api_reference(tmp_path):
    r = subprocess.run(["make", "-s", "-C", str(TOP), "docs", f"BUILD={tmp_path}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    html = (tmp_path / "docs/api.html").read_text()
    assert "cdn.redocly.com/redoc" not in html  # the script is inlined, not fetched
    assert "hydrate(__redoc_definition" in html and "const{RedocStandalone,hydrate,init}" in html
    assert "/v1/checkpoints/{id}/restore" in html


@pytest.mark.skipif(not shutil.which("gnuplot"), reason="gnuplot missing: make deps installs gnuplot-nox")
def test_chart_draws_both_svgs_from_data(tmp_path):
    sys.path.insert(0, str(TOP / "bench"))
    import chart
    points = [(1000, 10, {"overlay": (10.0, 2.0), "tar": (30.0, 20.0), "rsync": (40.0, 60.0),
                          "tar -x": (50.0, 300.0)}),
              (10000, 100, {"overlay": (12.0, 2.5), "tar": (45.0, 35.0), "btrfs": (5.0, 9.0),
                            "rsync": (90.0, 85.0), "tar -x": (190.0, 3000.0)})]
    table = chart.chart_write(points, out=tmp_path)
    for name in ("create.svg", "restore.svg"):
        svg = (tmp_path / name).read_text()
        assert svg.startswith("<?xml") and "<svg" in svg and "ckptd overlay" in svg and "btrfs" in svg
    assert "| 1,000 (10) | 10.0 / 2.0 |" in table and "| - |" in table  # btrfs missing at 1,000
    assert "NaN" in (tmp_path / "chart.dat").read_text()
