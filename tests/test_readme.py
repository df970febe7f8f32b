"""The README is the entrance: short enough to read at the door, and true about the workshop.

It says what mpviz is, the two set-up commands, the workshop's notebooks, one picture, and where
to go next; the rest (tracing, speed, internals) lives in docs/. A README that grows back past
MAX_LINES buries the two commands again; a notebook missing from its table is a lesson nobody
finds. Cheap: text is read, nothing is run.
"""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 150


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_the_readme_stays_at_most_150_lines():
    n = len(_readme().splitlines())
    assert n <= MAX_LINES, (
        f"README.md has {n} lines, more than {MAX_LINES}: it is the entrance (what mpviz is, the "
        f"two set-up commands, the workshop, one picture, where to go next). Fix: move the detail "
        f"to docs/ (TRACE.md, INTERNALS.md, PERFORMANCE.md) and link it")


def test_the_readme_gives_the_two_set_up_commands_as_commands():
    lines = _readme().splitlines()
    for command in ("./run workshop", "./run test"):
        assert f"    {command}" in lines, (
            f"README.md does not give `{command}` on a line of its own (an indented code line). "
            f"Fix: keep the two set-up commands as they are: one opens the workshop, one runs "
            f"the whole test suite")


def test_every_notebook_has_a_row_in_the_workshop_table():
    rows = set(re.findall(r"^\| `(\d\d_\w+)` \|", _readme(), re.M))
    notebooks = {f[:-len(".ipynb")] for f in os.listdir(os.path.join(ROOT, "notebooks"))
                 if re.fullmatch(r"\d\d_\w+\.ipynb", f)}
    assert notebooks - rows == set(), (
        f"notebooks with no row in README.md's workshop table: {sorted(notebooks - rows)}. "
        f"Fix: add a row `| `NN_name` | what you will see |`")
    assert rows - notebooks == set(), (
        f"README.md's workshop table names notebooks that do not exist: {sorted(rows - notebooks)}")


def _heading_anchors(text):
    """The anchors GitHub makes for a Markdown file's headings: lower case, punctuation dropped,
    spaces as hyphens, "-1", "-2" ... after a repeated one (code blocks hold no headings)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # a link: its words
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _broken_links(md_path):
    """[(target, why)] for each relative link in `md_path` that leads nowhere: a file that is
    not there, or a #heading that file does not have (web addresses are not followed)."""
    with open(md_path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(md_path), path)) if path else md_path
        if not os.path.exists(dest):
            broken.append((target, "no such file"))
        elif anchor and dest.endswith(".md"):
            with open(dest, encoding="utf-8") as f:
                if anchor not in _heading_anchors(f.read()):
                    broken.append((target, f"{os.path.relpath(dest, ROOT)} has no heading "
                                           f"whose anchor is #{anchor}"))
    return broken


def test_every_link_in_the_readme_and_docs_leads_to_a_file_and_heading_that_exist():
    docs = os.path.join(ROOT, "docs")
    files = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(docs))
                             if f.endswith(".md")]
    broken = [(f, target, why) for f in files
              for target, why in _broken_links(os.path.join(ROOT, f))]
    assert broken == [], (
        "links that lead nowhere (text moved out of the README, a heading renamed): "
        + "; ".join(f"{f}: ({target}) {why}" for f, target, why in broken)
        + ". Fix: point the link at the file and heading where the text is now")


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "there.md").write_text("# The pictures, and what they say\n\n## 6. Limits\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#the-pictures-and-what-they-say) [ok](there.md#6-limits) "
                    "[web](https://example.org/x#y) [gone](gone.md) "
                    "[renamed](there.md#what-the-pictures-say)\n```\n[in code](nowhere.md)\n```\n")
    assert [t for t, _ in _broken_links(str(page))] == ["gone.md", "there.md#what-the-pictures-say"]


def test_the_readmes_count_of_the_scenarios_is_the_catalogs():
    # test_text_truth holds the notebooks' counts to the catalog; the README's `mpviz list` line
    # ("the 28 scenarios") is the first count a new user reads
    import mpviz.scenarios as sc
    said = re.findall(r"(\d+) scenarios\b", _readme())
    assert said, "README.md no longer counts the scenarios: drop this test"
    assert {int(n) for n in said} == {len(sc.catalog())}, (
        f"README.md says {', '.join(said)} scenarios; `mpviz list` lists {len(sc.catalog())}. "
        f"Fix: write the catalog's number")
