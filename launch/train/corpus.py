"""The King James Bible from Debian's bible-kjv package, as plain verse text.

`bible -l100000 Gen1:1-Rev22:21` prints every chapter as a heading line ("Genesis 1"),
then one line per verse ("  1 In the beginning ..."; the huge line width keeps verses
unwrapped). We keep the verse text only: one verse per line, a blank line between
chapters, and each book is one document (books are separated by <|endoftext|> in the
token stream). Every HOLDOUT_EVERY-th chapter (counted over the whole Bible) is held out.
"""
import re
import subprocess

HOLDOUT_EVERY = 30
HOLDOUT_OFFSET = 15  # chapter k (0-based, Bible-wide) is held out when k % 30 == 15

_HEADING = re.compile(r"^(.+?) (\d+)$")
_VERSE = re.compile(r"^\s+(\d+) (.*)$")


def read_bible(bible_cmd="bible"):
    """-> list of (book, chapter number, [verse texts]) in canonical order."""
    out = subprocess.run([bible_cmd, "-l100000", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True, encoding="utf-8").stdout
    chapters = []
    for line in out.splitlines():
        if not line.strip():
            continue
        m = _VERSE.match(line)
        if m:
            verse = " ".join(m.group(2).split())
            chapters[-1][2].append(verse)
            continue
        m = _HEADING.match(line)
        if not m:
            raise ValueError(f"unexpected line from bible: {line[:80]!r}")
        chapters.append((m.group(1), int(m.group(2)), []))
    if len(chapters) != 1189 or sum(len(c[2]) for c in chapters) != 31102:
        raise ValueError(f"expected 1189 chapters / 31102 verses, got {len(chapters)} / "
                         f"{sum(len(c[2]) for c in chapters)}")
    return chapters


def chapter_text(verses):
    return "\n".join(verses) + "\n"


def split(chapters):
    """-> (train books: list of (book name, text)), held-out chapters: list of (book, n, text))."""
    books, held = [], []
    for k, (book, n, verses) in enumerate(chapters):
        text = chapter_text(verses)
        if k % HOLDOUT_EVERY == HOLDOUT_OFFSET:
            held.append((book, n, text))
            continue
        if not books or books[-1][0] != book:
            books.append([book, []])
        books[-1][1].append(text)
    return [(b, "\n".join(chs)) for b, chs in books], held


def heldout_text(held):
    """The held-out chapters in corpus order, a blank line between chapters (as in training)."""
    return "\n".join(t for _, _, t in held)
