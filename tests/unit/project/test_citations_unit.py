"""The repository explains itself: comments, docstrings and docs cite code and
documents in it (docs/design.md "Section"), never a document or a path outside
it, nor a tracker's issue numbers it does not hold. Each citation of a section
of docs/*.md names a heading there (or the heading's words before its
parenthesis: "Which processes are ranks" for "Which processes are ranks
(observe/jobs/discovery.py, ...)"), and each test file cited by its path
(tests/unit/judge/test_replay.py) is there: tests move between the folders of
tests/ (tests/README.md), and what cites them follows."""
from __future__ import annotations

import os
import re

from conftest import REPO

# what is read: the code, the docs and the deployment files (not the saved data)
TREES = ("ddpwatch", "trainer", "rules", "tests", "benchmarks", "docs", "deploy",
         "systemd", "scripts", "grafana", ".ci")
FILES = ("README.md", "setup.py", "setup.cfg", "pyproject.toml", "dev.sh")
TEXT = (".py", ".md", ".yaml", ".yml", ".sh", ".cfg", ".toml", ".c", ".service",
        ".socket", ".sbatch", ".env", ".pth", "Containerfile", "run")
DATA = os.path.join("tests", "fixtures")  # saved snapshots and /proc trees: data

CITATION = re.compile(r'docs/([\w.-]+\.md) ("[^"]{1,100}"(?:,? "[^"]{1,100}")*)')
# assembled, so that this file does not match itself
OUTSIDE = re.compile("|".join((r"\bDESIGN" + r"\.md", r"FIELD-" + "NOTES", r"\bSTYLE" + r"\.md",
                               "/work" + "/", r"\b[Ii]ssue #?\d+")))
# a file of the test tree cited by its path (tests/support/diag.py), a test id's included
TEST_FILE = re.compile(r"\btests/[\w./-]*?\.py\b")


def sources(root: str = REPO):
    paths = [os.path.join(root, f) for f in FILES]
    for tree in TREES:
        for dirpath, dirs, files in os.walk(os.path.join(root, tree)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if rel.startswith(DATA + os.sep) and not name.endswith(".py"):
                    continue
                if name.endswith(TEXT):
                    paths.append(path)
    return [p for p in paths if os.path.isfile(p)]


def data_docs(root: str = REPO) -> list[str]:
    """What the saved data's own documents say (tests/fixtures/**/*.md), which
    sources() leaves out with the data."""
    out = []
    for dirpath, dirs, files in os.walk(os.path.join(root, DATA)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out.extend(os.path.join(dirpath, name) for name in files if name.endswith(".md"))
    return out


def joined(text: str) -> str:
    """Lines joined, indentation and comment marks dropped: a citation may wrap."""
    return re.sub(r"[ \t]*\n[ \t]*(?:#+[ \t]*)?", " ", text)


def headings(path: str) -> set[str]:
    with open(path) as f:
        return {line.lstrip("#").strip() for line in f if line.startswith("#")}


def cited(text: str):
    """(document, section) of every docs/... "Section" citation in `text`."""
    for match in CITATION.finditer(joined(text)):
        for section in re.findall(r'"([^"]+)"', match.group(2)):
            yield match.group(1), section


def names_a_heading(section: str, titles: set[str]) -> bool:
    return any(t == section or t.startswith(section + " (") for t in titles)


def test_every_cited_section_is_a_heading_of_its_document():
    docs, here = os.path.join(REPO, "docs"), os.path.abspath(__file__)
    wrong, count = [], 0
    for path in sources():
        if os.path.abspath(path) == here:  # its examples below
            continue
        with open(path, errors="replace") as f:
            text = f.read()
        for document, section in cited(text):
            count += 1
            target = os.path.join(docs, document)
            if not os.path.isfile(target):
                wrong.append(f"{os.path.relpath(path, REPO)}: docs/{document} does not exist")
            elif not names_a_heading(section, headings(target)):
                wrong.append(f'{os.path.relpath(path, REPO)}: docs/{document} has no "{section}"')
    assert count >= 20, f"only {count} citations found: the pattern broke"
    assert not wrong, "\n".join(wrong)


def test_nothing_cites_what_the_repository_does_not_hold():
    """Nothing outside it, and no file of tests/ that is not where it is cited:
    tests move between the folders of tests/ (tests/README.md)."""
    here = os.path.abspath(__file__)
    wrong = []
    for path in sources():
        if os.path.abspath(path) == here:
            continue
        with open(path, errors="replace") as f:
            for number, line in enumerate(f, 1):
                if OUTSIDE.search(line):
                    wrong.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}")
    test_files = 0
    for path in sources() + data_docs():
        with open(path, errors="replace") as f:
            text = f.read()
        for cited in sorted(set(TEST_FILE.findall(text))):
            test_files += 1
            if not os.path.isfile(os.path.join(REPO, cited)):
                wrong.append(f"{os.path.relpath(path, REPO)}: {cited} does not exist")
    assert test_files >= 100, f"only {test_files} test files cited: the pattern broke"
    assert not wrong, "\n".join(wrong)


def test_the_checks_themselves():
    text = ('x = 1  # as docs/design.md "Per-job state\n    # in one place" says;\n'
            '"""see docs/architecture.md "What a local user may\n    cost it", '
            '"Who may speak for the daemon"."""')
    assert list(cited(text)) == [("design.md", "Per-job state in one place"),
                                 ("architecture.md", "What a local user may cost it"),
                                 ("architecture.md", "Who may speak for the daemon")]
    titles = {"Which processes are ranks (observe/jobs/discovery.py)", "Verdicts"}
    assert names_a_heading("Which processes are ranks", titles)
    assert names_a_heading("Verdicts", titles) and not names_a_heading("Verdict", titles)
    assert OUTSIDE.search("(see " + "DESIGN" + ".md)") and OUTSIDE.search("Issue" + " 14:")
    assert not OUTSIDE.search("an issue with the design")
    text = ("(" + "tests" + "/unit/judge/test_replay.py, " + "tests" + "/support/diag.py); "
            + "tests" + "/nodes/test_two_nodes.py::test_x; unittests/a.py; " + "tests" + "/jobs")
    assert TEST_FILE.findall(text) == ["tests" + "/unit/judge/test_replay.py",
                                       "tests" + "/support/diag.py",
                                       "tests" + "/nodes/test_two_nodes.py"]
