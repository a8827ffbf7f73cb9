"""The documents the code points into: every citation resolves, and no text labels work periods.

A citation is a Markdown file named with a section: ``<file>.md §<n>`` (a numbered heading such as
``## 4. Ranking metrics`` or ``### 4.2 ...``; several numbers may follow, ``§4, §5``), a quoted
heading ``<file>.md "<heading>"`` or ``<file>.md, "<heading>"`` (the quote may stop early: it is
matched against the beginning of a heading), or a link anchor ``<file>.md#<anchor>`` (GitHub's
heading slugs). The file is looked up relative to the repository root, then relative to the
citing file's folder; a bare ``CONVENTIONS.md`` from ``hybridrank/`` therefore does not resolve:
cite ``docs/CONVENTIONS.md``. Comments and docstrings wrap, so a citation may continue on the next
line: each file is read as one text, its lines joined, comment markers dropped.

The second check greps the repository for labels of the team's own work periods (an ordinal
"session", a date followed by an ordinal, "until <date> it ..."), which mean nothing to a reader:
the text should say what is, with a date where one helps. Uses of "session" for a user's session
(``same session``, ``a session``, ``session id`` ...) are not labels.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()
#: what is searched: the package, configs, scripts, benchmarks, documents and tests
SCANNED = ("hybridrank", "conf", "scripts", "benchmarks", "docs", "tests", "README.md", "pyproject.toml")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini"}

_COMMENT = re.compile(r"^\s*(?:#+:?|//+|\*|>)?\s*")
_NUMBER = r"\d+[a-z]?(?:\.\d+)*"
CITATION = re.compile(
    r"(?P<file>[\w./-]*[\w-]\.md)"
    r"(?:#(?P<anchor>[\w-]+)"
    rf"|,?\s+§\s*(?P<sections>{_NUMBER}(?:\s*(?:,|and|&)\s*§\s*{_NUMBER})*)"
    r'|,?\s+"(?P<heading>[^"]{1,200})")'
)
_SECTION_NUMBER = re.compile(_NUMBER)
_HEADING = re.compile(rf"^#{{1,6}}\s+(?:§\s*)?(?:(?P<number>{_NUMBER})\.?\s+)?(?P<title>.*?)\s*#*\s*$")

_ORDINALS = ("first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
             "thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth "
             "twentieth").split()
_ORDINAL = r"(?:" + "|".join(_ORDINALS) + r"|\d+(?:st|nd|rd|th))"
#: labels of work periods; matched case-insensitively on the joined text of a file
LABELS = (
    # an ordinal or "earlier" / "last" before the word for a work period (examples in the test
    # below, spelled so that a plain grep of the repository does not find them)
    re.compile(rf"\b(?:{_ORDINAL}|earlier|previous|prior|last|next|later)\s+(?:work(?:ing)?\s+)?"
               r"sessions?\b", re.IGNORECASE),
    # a heading's "(<date>, <ordinal> ...)"
    re.compile(rf"\b\d{{4}}-\d{{2}}-\d{{2}},\s*{_ORDINAL}\b", re.IGNORECASE),
    # "until <date> it made ..." narrates what the code once did
    re.compile(r"\buntil\s+\d{4}-\d{2}-\d{2},?\s+(?:it|this|the code|hybridrank)\s+\w+",
               re.IGNORECASE),
)
#: a user's or a click log's session, not a work period: "last session of a user", "next session id"
_USER_SESSION_AFTER = re.compile(
    r"\s*(?:'s\s+)?(?:of\s+(?:a|an|the|each|every|its|their|one|this|that)\s+(?:user|visitor|customer)"
    r"|ids?\b|keys?\b|scopes?\b|columns?\b|_id\b|boundar|starts?\b)", re.IGNORECASE)
_USER_SESSION_BEFORE = re.compile(r"(?:user|visitor|customer)(?:'s|s')\s+$", re.IGNORECASE)


@dataclass(frozen=True)
class Joined:
    """A text file as one string (lines joined by a space, comment markers dropped), with the
    1-based line of any offset."""

    path: Path
    text: str
    starts: tuple[int, ...]
    lines: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> Joined:
        lines = path.read_text(encoding="utf-8").splitlines()
        parts, starts, at = [], [], 0
        for line in lines:
            piece = _COMMENT.sub("", line, count=1).rstrip()
            starts.append(at)
            parts.append(piece)
            at += len(piece) + 1
        return cls(path, " ".join(parts), tuple(starts), tuple(lines))

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)

    def where(self, offset: int, root: Path) -> str:
        """``path:line: text`` of the line holding ``offset``, the path relative to ``root``."""
        n = self.line_of(offset)
        return f"{self.path.relative_to(root).as_posix()}:{n}: {self.lines[n - 1].strip()}"


def scanned_files() -> list[Path]:
    """Every text file of :data:`SCANNED` (caches and virtual environments left out), except
    this test, whose patterns and examples would match themselves."""
    out = []
    for name in SCANNED:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for p in candidates:
            parts = set(p.relative_to(ROOT).parts)
            if (p.is_file() and p.suffix in SUFFIXES and p.resolve() != THIS
                    and not parts & {"__pycache__", ".venv", "node_modules", ".git"}):
                out.append(p)
    return out


def _norm(text: str) -> str:
    """Whitespace collapsed, case folded, code marks dropped (a heading as it reads)."""
    return " ".join(text.replace("`", "").split()).casefold()


def headings(path: Path) -> list[tuple[str | None, str]]:
    """``(number, title)`` of every Markdown heading of ``path`` outside fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            out.append((m["number"], m["title"]))
    return out


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def resolve(cited: str, citing: Path, root: Path = ROOT) -> Path | None:
    """The cited file, relative to ``root`` or to the citing file's folder; None if neither."""
    for base in (root, citing.parent):
        target = (base / cited).resolve()
        if target.is_file():
            return target
    return None


def dangling_citations(files: list[Path], root: Path = ROOT) -> tuple[list[str], int]:
    """``(problems, citations checked)`` over ``files`` of the repository at ``root``."""
    problems, checked, cache = [], 0, {}
    for path in files:
        joined = Joined.read(path)
        for m in CITATION.finditer(joined.text):
            if not (m["anchor"] or m["sections"] or m["heading"]):
                continue
            checked += 1
            target = resolve(m["file"], path, root)
            if target is None:
                problems.append(f"{joined.where(m.start(), root)}\n    {m['file']} is not a file of the "
                                "repository (paths are relative to its root or to the citing file)")
                continue
            heads = cache.setdefault(target, headings(target))
            if m["sections"]:
                numbers = {n for n, _ in heads if n}
                for number in _SECTION_NUMBER.findall(m["sections"]):
                    if number not in numbers:
                        problems.append(f"{joined.where(m.start(), root)}\n    {m['file']} has no "
                                        f"section §{number} (it has {sorted(numbers) or 'none'})")
            elif m["heading"]:
                cited = _norm(m["heading"]).rstrip(" .,;:")
                titles = [_norm(f"{n} {t}" if n else t) for n, t in heads] + [
                    _norm(t) for _, t in heads]
                if not any(t.startswith(cited) for t in titles):
                    problems.append(f'{joined.where(m.start(), root)}\n    {m["file"]} has no heading '
                                    f'starting "{m["heading"]}"')
            elif m["anchor"] not in {slug(f"{n} {t}" if n else t) for n, t in heads}:
                problems.append(f"{joined.where(m.start(), root)}\n    {m['file']} has no heading with "
                                f"the anchor #{m['anchor']}")
    return problems, checked


def work_period_labels(files: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line: text`` and the match of every work-period label in ``files``."""
    found = []
    for path in files:
        joined = Joined.read(path)
        hits = []
        for pattern in LABELS:
            for m in pattern.finditer(joined.text):
                after = joined.text[m.end():m.end() + 60]
                before = joined.text[max(0, m.start() - 20):m.start()]
                if not (_USER_SESSION_AFTER.match(after) or _USER_SESSION_BEFORE.search(before)):
                    hits.append((m.start(), m.group(0)))
        found += [f"{joined.where(at, root)}\n    {text!r}" for at, text in sorted(hits)]
    return found


# --- the checker itself ---------------------------------------------------------------------------


def _write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_the_citation_checker_finds_what_it_should(tmp_path):
    _write(tmp_path, "docs/C.md", "# C\n\n## 1. One\n\n### 1.2 Sub part\n\n```\n# 7. in code\n```\n"
                                  "## 4b. Letter\n## Named heading: more\n")
    good = _write(tmp_path, "pkg/good.py",
                  '"""See docs/C.md §1 and docs/C.md §1.2, §4b; docs/C.md, "Named\n'
                  'heading"; [x](docs/C.md#named-heading-more)."""\n'
                  "# a comment that wraps: (docs/C.md\n#: §4b)\n")
    bad = _write(tmp_path, "pkg/bad.py",
                 '"""docs/C.md §2; docs/C.md §7; C.md §1; docs/D.md §1; docs/C.md "Nope";\n'
                 'docs/C.md#nope; docs/C.md §1, §3."""\n')
    assert dangling_citations([good], tmp_path) == ([], 5)
    problems, checked = dangling_citations([bad], tmp_path)
    text = "\n".join(problems)
    assert checked == 7 and len(problems) == 7, text
    for needle in ("no section §2", "no section §7", "C.md is not a file",
                   "docs/D.md is not a file", 'no heading starting "Nope"', "anchor #nope",
                   "no section §3"):
        assert needle in text, needle
    assert problems[0].startswith("pkg/bad.py:1:")
    assert problems[-1].startswith("pkg/bad.py:2:")  # the line the citation starts on


def test_the_label_grep_finds_labels_and_leaves_user_sessions_alone(tmp_path):
    labelled = _write(tmp_path, "a.py", "\n".join([
        "# measured in the ninth " + "session",
        "# (last " + "session's runs)",
        "### Offsets (2026-11-28, " + "twelfth sitting)",
        "# a random-order log (until",
        "#: 2026-11-27 it made exploration traffic 'NOT identified')",
        "x = 1  # see the 3rd session",
    ]))
    clean = _write(tmp_path, "b.py", "\n".join([
        "# requests of the same session pool into one list; a session cut by a chunk boundary",
        "# the first session of a user; the user's last session; next session id",
        "# the default until 2026-11-27 was bce_softmax; a first pass reads the keys",
        "# time increases between consecutive requests of a session",
    ]))
    found = work_period_labels([labelled], tmp_path)
    assert [f.split(":")[1] for f in found] == ["1", "2", "3", "4", "6"], found
    assert work_period_labels([clean], tmp_path) == []


# --- the repository ------------------------------------------------------------------------------


def test_every_citation_resolves():
    """Each ``<file>.md §n``, ``<file>.md "heading"`` and ``<file>.md#anchor`` of the repository
    names an existing file and an existing section of it."""
    problems, checked = dangling_citations(scanned_files())
    assert checked > 20, f"only {checked} citations found: is the pattern still right?"
    assert not problems, "dangling citations:\n" + "\n".join(problems)


def test_conventions_are_in_the_repository_and_cited():
    """The conventions the code follows ship with it, and the code points into them."""
    conventions = ROOT / "docs" / "CONVENTIONS.md"
    assert conventions.is_file()
    numbers = {n for n, _ in headings(conventions) if n}
    assert {str(i) for i in range(1, 10)} <= numbers
    cited = set()
    for path in scanned_files():
        for m in CITATION.finditer(Joined.read(path).text):
            if m["sections"] and resolve(m["file"], path) == conventions.resolve():
                cited |= set(_SECTION_NUMBER.findall(m["sections"]))
    assert len(cited) >= 8, sorted(cited)


def test_no_labels_of_work_periods():
    """Nothing names the team's own work periods (an ordinal before the word, "<date>, <ordinal> ...",
    "until <date> it made ..."): say what is, with a date where one helps."""
    found = work_period_labels(scanned_files())
    assert not found, "labels of work periods:\n" + "\n".join(found)
