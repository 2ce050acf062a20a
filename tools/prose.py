#!/usr/bin/python3
"""Short sentences in the README and docs/*.md: `make prose` (run by `make check`).

For each Markdown file it prints the number of sentences, the average number of
words a sentence and how many sentences run over LONG words. It fails (exit 1)
when a file averages more than MAX_AVG words a sentence, or holds a sentence
over LONG words; each such sentence is printed with its file and line.

What counts:
- Skipped whole: fenced code blocks (``` or ~~~), table rows (lines that start
  with `|`), headings (`#`), HTML comments, front-matter-less blank lines.
- Text is cut into units: a paragraph (consecutive text lines), or one list
  item ("- ", "* ", "+ ", "1. ") with its indented continuation lines. A new
  list item or a blank line ends a unit.
- A unit is cut into sentences after `.`, `!` or `?` (optionally followed by a
  closing `)`, `"`, `'`, `*` or `_`) when white space or the unit's end comes
  next. Common abbreviations (e.g., i.e., etc., vs., cf.) do not end a sentence.
  Colons and semicolons do not end one either.
- What is left of a unit after its last full stop counts as one sentence (so a
  list item without a full stop is one sentence).
- A word is a run of non-space characters, after each inline code span
  (`...`) is made one word and each link [text](target) is made its text.
  Tokens without a letter or digit (a dash, an arrow) are not words.
"""
import argparse
import pathlib
import re
import sys

MAX_AVG = 20
LONG = 40

ABBREV = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.", "incl.", "no.")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
FENCE = re.compile(r"^\s*(```|~~~)")
END = re.compile(r"[.!?][)\"'*_]*(?=\s|$)")
WORD = re.compile(r"[A-Za-z0-9]")


def prose_units(text):
    """Yield (line number, unit text) for every paragraph and list item."""
    unit, start, fence, comment = [], 0, None, False
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1) == fence:
                fence = None
            continue
        if m:
            fence = m.group(1)
            if unit:
                yield start, " ".join(unit)
            unit = []
            continue
        if comment or line.lstrip().startswith("<!--"):
            comment = "-->" not in line
            continue
        s = line.strip()
        boundary = not s or s.startswith("|") or s.startswith("#") or LIST_ITEM.match(line)
        if boundary and unit:
            yield start, " ".join(unit)
            unit = []
        if not s or s.startswith("|") or s.startswith("#"):
            continue
        if not unit:
            start = n
        unit.append(LIST_ITEM.sub("", line, count=1).strip() if LIST_ITEM.match(line) else s)
    if unit:
        yield start, " ".join(unit)


def plain(unit):
    """The unit with code spans as one word and links as their text."""
    unit = re.sub(r"`[^`]*`", "CODE", unit)
    unit = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", unit)
    return unit


def sentences(unit):
    text = plain(unit)
    for a in ABBREV:
        text = re.sub(re.escape(a), a.replace(".", "\0"), text, flags=re.I)
    out, last = [], 0
    for m in END.finditer(text):
        out.append(text[last:m.end()])
        last = m.end()
    out.append(text[last:])
    return [s.replace("\0", ".").strip() for s in out if words(s)]


def words(sentence):
    return [w for w in sentence.split() if WORD.search(w)]


def measure(path):
    """(sentence count, average words, [(line, words, sentence)] over LONG)."""
    counts, long = [], []
    for line, unit in prose_units(path.read_text()):
        for s in sentences(unit):
            n = len(words(s))
            counts.append(n)
            if n > LONG:
                long.append((line, n, s))
    avg = sum(counts) / len(counts) if counts else 0.0
    return len(counts), avg, long


def main():
    global LONG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=pathlib.Path)
    ap.add_argument("--max-avg", type=float, default=MAX_AVG)
    ap.add_argument("--long", type=int, default=LONG)
    ap.add_argument("--report", action="store_true", help="print figures, never fail")
    a = ap.parse_args()
    LONG = a.long
    top = pathlib.Path(__file__).resolve().parent.parent
    files = a.files or [top / "README.md"] + sorted((top / "docs").glob("*.md"))
    bad = 0
    total_s = total_w = total_long = 0
    for f in files:
        n, avg, long = measure(f)
        total_s += n
        total_w += avg * n
        total_long += len(long)
        over = avg > a.max_avg
        name = f.relative_to(top) if f.is_relative_to(top) else f
        print(f"{'FAIL' if over or long else 'ok  '} {name}: "
              f"{n} sentences, {avg:.1f} words each, {len(long)} over {LONG}")
        for line, nw, s in long:
            print(f"     line {line}: {nw} words: {s[:100]}...")
        bad += over or bool(long)
    if total_s:
        print(f"all: {total_s} sentences, {total_w / total_s:.1f} words each, {total_long} over {LONG}")
    if bad and not a.report:
        print(f"prose: {bad} file(s) average over {a.max_avg:g} words a sentence or hold one over {LONG}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
