"""`ubiquityfs query` on real mounts, checked against a Python model.

* A seeded random tree (about 500 items: nested folders, names in upper and
  lower case, with accents in NFC and NFD form, several extensions, sizes
  0..20000, modification dates over ten years) is written on a mount. Then
  many predicates, by hand and from a small random grammar, are run through
  `ubiquityfs query MOUNT --predicate P [--sort KEYS] [--scope S] --json`, and
  the paths (in order; absolute, the model's are below the mountpoint) must
  equal those of the same predicate evaluated by the model below.
* `--watch` on device B follows what device A does on the same store: the
  initial results, the gathering-finished marker, then added / changed /
  removed, with the latency from A's change to B's event.

The model follows the documented semantics (Sources/UbiquityControl):
strings compare as Swift `String`s (canonical equivalence: NFC and NFD forms
of a name are equal), `[c]` / `[d]` fold case / diacritics before comparing,
LIKE's `?` is one character, dates compare at whole seconds (both sides
rounded down), `!=` is the negation of `==`; results are sorted by each sort
key in turn (strings by Unicode scalars of their NFC forms), ties by path;
the `documents` scope is what is below /Documents (not /Documents itself) and
`data` is everything outside /Documents (nor /Documents itself).
"""

from __future__ import annotations

import json
import math
import os
import queue
import random
import re
import subprocess
import threading
import time
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest

from conftest import BIN
from test_sync import SYNC_TIMEOUT, eventually, new_device

pytestmark = pytest.mark.daemon

DEFAULT_CONTAINER = "com.ubiquityfs.default"


# --------------------------------------------------------------------------
# The model: items and the predicate semantics
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    path: str  # below the mountpoint (the query reports mountpoint + path): "/dir/name", the name as created (NFC or NFD)
    name: str
    size: int
    is_dir: bool
    mtime_ns: int
    content_type: str

    @property
    def mtime_s(self) -> int:
        """Whole seconds, as predicates compare dates."""
        return self.mtime_ns // 1_000_000_000

    @property
    def mtime_sort(self) -> float:
        """The date as the daemon holds it (a Double of seconds), as sorting compares dates."""
        return float(self.mtime_ns // 1_000_000_000) + float(self.mtime_ns % 1_000_000_000) / 1e9

    @property
    def in_documents(self) -> bool:
        return self.path == "/Documents" or self.path.startswith("/Documents/")


CONTENT_TYPES = {".md": "text/markdown", ".txt": "text/plain", ".png": "image/png",
                 ".json": "application/json", "": "application/octet-stream"}


UTIS = {"inode/directory": "public.folder", "text/markdown": "net.daringfireball.markdown",
        "text/plain": "public.plain-text", "image/png": "public.png", "application/json": "public.json",
        "application/octet-stream": "public.data"}


def content_type(name: str, is_dir: bool) -> str:
    if is_dir:
        return "inode/directory"
    return CONTENT_TYPES[os.path.splitext(name)[1].lower()]


def nfc(s: str) -> str:
    return unicodedata.normalize("NFC", s)


def fold(s: str, mods: str = "") -> str:
    """`[c]`, `[d]`, `[cd]` folding, then NFC (the comparisons are by canonical equivalence)."""
    if "d" in mods:
        s = "".join(c for c in unicodedata.normalize("NFD", s) if not unicodedata.combining(c))
    if "c" in mods:
        s = s.lower()
    return nfc(s)


def s_cmp(value: str, op: str, literal: str, mods: str = "") -> bool:
    a, b = fold(value, mods), fold(literal, mods)
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def like(value: str, pattern: str, mods: str = "") -> bool:
    """LIKE: `*` any run, `?` one character (in NFC every character here is one code point)."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in fold(pattern, mods))
    return re.fullmatch(rx, fold(value, mods), re.S) is not None


def begins(value, lit, mods=""):
    return fold(value, mods).startswith(fold(lit, mods))


def ends(value, lit, mods=""):
    return fold(value, mods).endswith(fold(lit, mods))


def contains(value, lit, mods=""):
    return fold(lit, mods) in fold(value, mods)


def one_of(value, literals, mods=""):
    return fold(value, mods) in {fold(v, mods) for v in literals}


def D(text: str) -> int:
    """An ISO 8601 date literal -> whole seconds since 1970 (rounded down, as the query does)."""
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return math.floor(dt.timestamp())


def iso(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


SORT_ALIASES = {
    "name": "name", "nsmetadataitemfsnamekey": "name", "kmditemfsname": "name",
    "path": "path", "nsmetadataitempathkey": "path", "kmditempath": "path",
    "size": "size", "nsmetadataitemfssizekey": "size", "kmditemfssize": "size",
    "modificationdate": "modificationDate", "nsmetadataitemfscontentchangedatekey": "modificationDate",
    "kmditemfscontentchangedate": "modificationDate",
    "contenttype": "contentType", "nsmetadataitemcontenttypekey": "contentType",
    "isdirectory": "isDirectory",
}


def sort_value(item: Item, attribute: str):
    return {
        "name": lambda: nfc(item.name), "path": lambda: nfc(item.path), "size": lambda: item.size,
        "modificationDate": lambda: item.mtime_sort, "contentType": lambda: UTIS[item.content_type],
        "isDirectory": lambda: item.is_dir,
    }[attribute]()


def model_sorted(items: list[Item], sort: str | None) -> list[Item]:
    """Each key in turn ('-' descending), ties by path (NFC scalars), as Query.sorted."""
    out = sorted(items, key=lambda i: nfc(i.path))
    keys = [k.strip() for k in sort.split(",")] if sort else []
    for key in reversed(keys):
        descending = key.startswith("-")
        attribute = SORT_ALIASES[key.lstrip("+-").lower()]
        out.sort(key=lambda i: sort_value(i, attribute), reverse=descending)  # stable, also reversed
    return out


def in_scopes(item: Item, scopes: tuple[str, ...]) -> bool:
    if not scopes:
        return True
    return any(s == "all" or (s == "documents" and item.path.startswith("/Documents/"))
               or (s == "data" and not item.in_documents) for s in scopes)


# --------------------------------------------------------------------------
# The generated tree
# --------------------------------------------------------------------------

STEMS = ["report", "Report", "REPORT", "notes", "Notes", "café", "Café", "CAFÉ", "cafe", "résumé",
         "Resume", "RÉSUMÉ", "naïve", "Über", "über", "piñata", "photo", "IMG", "img", "draft",
         "Draft", "archive", "a b", "x", "l'été", "Ünïcødé"]
SUFFIXES = ["", "", "", "-1", "-2", "-10", " 2", "_v3", "-é", "-E"]
EXTENSIONS = [".md", ".md", ".txt", ".png", ".json", "", ".MD", ".Txt"]
SIZES = [0, 1, 1000, 1024, 20000]
YEAR_2015, YEAR_2025 = D("2015-01-01"), D("2025-01-01")
NEW_YEAR_2020 = D("2020-01-01")
# A few names the hand-written predicates name, whatever the random draw gives.
FIXED_DIRS = ["Documents", "Documents/Notes", "Documents/Notes/CAFÉ", "naïve"]
FIXED_FILES = ["café.md", "Documents/cafe\u0301.md", "Documents/Notes/CAFÉ/x.md", "naïve/notes.txt",
               "Documents/Café.json", "Documents/naïve", "report.md", "Documents/Notes/re\u0301sume\u0301.txt"]
# The first files get these (seconds, nanoseconds): exact and sub-second
# modification dates around one instant, for the whole-second comparisons.
ANCHOR_TIMES = [(NEW_YEAR_2020, 0), (NEW_YEAR_2020, 250_000_000), (NEW_YEAR_2020, 999_000_000),
                (NEW_YEAR_2020 - 1, 500_000_000), (NEW_YEAR_2020 + 1, 0)]


def random_mtime_ns(rng: random.Random) -> int:
    seconds = rng.randrange(YEAR_2015, YEAR_2025)
    # Nanoseconds below 0.999 s: the last ~120 ns of a second turn into the next
    # second in the daemon's Double (see test_mtime_just_below_a_whole_second_...).
    nanos = 0 if rng.random() < 0.15 else rng.randrange(999_000_000)
    return seconds * 1_000_000_000 + nanos


def variant(rng: random.Random, name: str) -> str:
    """The name in NFD form now and then (a different name for the filesystem)."""
    return unicodedata.normalize("NFD", name) if rng.random() < 0.35 else name


def build_spec(seed: int, n_dirs: int = 60, n_files: int = 420):
    """Directories (parents first) and files (rel, size, mtime_ns); no two names
    in one folder are canonically equivalent (their sort order would be arbitrary)."""
    rng = random.Random(seed)
    taken: dict[str, set[str]] = {}

    def fresh(parent: str, make) -> str:
        while True:
            name = make()
            if nfc(name) not in taken.setdefault(parent, set()):
                taken[parent].add(nfc(name))
                return f"{parent}/{name}" if parent else name

    dirs = {}
    for rel in FIXED_DIRS:
        dirs[fresh(os.path.dirname(rel), lambda: os.path.basename(rel))] = random_mtime_ns(rng)
    fixed_files = [fresh(os.path.dirname(rel), lambda: os.path.basename(rel)) for rel in FIXED_FILES]

    for _ in range(n_dirs):
        parent = rng.choice([""] + [d for d in dirs if d.count("/") < 3])
        rel = fresh(parent, lambda: variant(rng, rng.choice(STEMS) + rng.choice(SUFFIXES)))
        dirs[rel] = random_mtime_ns(rng)
    files = {}
    for i in range(n_files):
        if i < len(fixed_files):
            rel = fixed_files[i]
        else:
            parent = rng.choice([""] + list(dirs))
            rel = fresh(parent, lambda: variant(rng, rng.choice(STEMS) + rng.choice(SUFFIXES) + rng.choice(EXTENSIONS)))
        size = rng.choice(SIZES) if rng.random() < 0.2 else rng.randrange(20001)
        if i < len(ANCHOR_TIMES):
            seconds, nanos = ANCHOR_TIMES[i]
            mtime = seconds * 1_000_000_000 + nanos
        else:
            mtime = random_mtime_ns(rng)
        files[rel] = (size, mtime)
    return dirs, files, rng


def write_tree(root, dirs: dict, files: dict, rng: random.Random) -> list[Item]:
    for rel in dirs:
        # A mount of a whole container has its Documents folder already.
        os.makedirs(os.path.join(root, rel), exist_ok=rel == "Documents")
    for rel, (size, mtime) in files.items():
        path = os.path.join(root, rel)
        with open(path, "wb") as f:
            f.write(rng.randbytes(size))
        os.utime(path, ns=(mtime, mtime))
    for rel in sorted(dirs, key=lambda d: -d.count("/")):
        os.utime(os.path.join(root, rel), ns=(dirs[rel], dirs[rel]))
    items = [Item("/" + rel, os.path.basename(rel), 0, True, mtime, "inode/directory") for rel, mtime in dirs.items()]
    items += [Item("/" + rel, os.path.basename(rel), size, False, mtime, content_type(rel, False))
              for rel, (size, mtime) in files.items()]
    return items


def check_tree_on_disk(root, items: list[Item]) -> None:
    """The mount holds exactly the model's items (names byte for byte, sizes,
    nanosecond mtimes): a mismatch here is the filesystem's, not the query's."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            found["/" + os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    expected = {i.path: (i.size, i.mtime_ns) for i in items}
    assert found == expected, (
        f"tree on the mount differs: missing {sorted(expected.keys() - found.keys())[:5]}, "
        f"unexpected {sorted(found.keys() - expected.keys())[:5]}, differing "
        f"{[(p, found[p], expected[p]) for p in expected.keys() & found.keys() if found[p] != expected[p]][:5]}"
    )


# --------------------------------------------------------------------------
# Running queries
# --------------------------------------------------------------------------


def below(root: str, path: str) -> str:
    """The query reports absolute paths; the model's are below the mountpoint."""
    assert path.startswith(root + "/"), f"{path!a} is not below the mountpoint {root!a}"
    return path[len(root):]


def run_query(dev, predicate: str, sort: str | None = None, scopes: tuple[str, ...] = (), *,
              absolute: bool = False) -> list[dict]:
    """The results; `{root}` in the predicate is the mountpoint. Their paths
    are absolute; unless `absolute`, they are returned below the mountpoint."""
    root = str(dev.mountpoint)
    args = ["query", root, "--predicate", predicate.replace("{root}", root), "--json"]
    if sort:
        args += ["--sort", sort]
    for scope in scopes:
        args += ["--scope", scope]
    res = dev.cli(*args, timeout=60)
    assert res.returncode == 0, f"query failed:\n{res}"
    lines = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert all(line.get("event") == "result" for line in lines), f"non-result lines in {predicate!r}: {lines[:3]}"
    items = [line["item"] for line in lines]
    if not absolute:
        for item in items:
            item["path"] = below(root, item["path"])
    return items


def describe_mismatch(expected: list[str], actual: list[str]) -> str:
    missing = [p for p in expected if p not in set(actual)]
    unexpected = [p for p in actual if p not in set(expected)]
    text = f"expected {len(expected)} results, got {len(actual)}"
    if missing:
        text += f"\n  missing ({len(missing)}): {[ascii(p) for p in missing[:8]]}"
    if unexpected:
        text += f"\n  unexpected ({len(unexpected)}): {[ascii(p) for p in unexpected[:8]]}"
    if not missing and not unexpected:
        at = next(i for i, (e, a) in enumerate(zip(expected, actual)) if e != a)
        text += (f"\n  same items, order differs at {at}:\n    expected {[ascii(p) for p in expected[at:at + 4]]}"
                 f"\n    actual   {[ascii(p) for p in actual[at:at + 4]]}")
    return text


def check_query(dev, items: list[Item], predicate: str, matches, *, sort=None, scopes=(),
                problems: list[str] | None = None) -> list[str]:
    """Run the query and compare its paths, in order, with the model's; returns
    the expected paths. A difference is appended to `problems` (else it fails now)."""
    expected = [i.path for i in model_sorted([i for i in items if in_scopes(i, scopes) and matches(i)], sort)]
    actual = [r["path"] for r in run_query(dev, predicate, sort, scopes)]
    if actual != expected:
        message = f"query {predicate!r} sort={sort!r} scopes={scopes!r}: {describe_mismatch(expected, actual)}"
        if problems is None:
            pytest.fail(message, pytrace=False)
        problems.append(message)
    return expected


# --------------------------------------------------------------------------
# Hand-written predicates
# --------------------------------------------------------------------------

T = NEW_YEAR_2020

# (predicate, model, sort, scopes, may be empty)
CASES = [
    # ---- names: ==, !=, ordering, with and without [c] [d] [cd]
    ("name == 'café.md'", lambda i: s_cmp(i.name, "==", "café.md"), None, (), False),
    ("name == 'cafe\\u0301.md'", lambda i: s_cmp(i.name, "==", "cafe\u0301.md"), None, (), False),
    ("name ==[c] 'CAFÉ.MD'", lambda i: s_cmp(i.name, "==", "CAFÉ.MD", "c"), None, (), False),
    ("name ==[d] 'cafe.md'", lambda i: s_cmp(i.name, "==", "cafe.md", "d"), None, (), False),
    ("name ==[cd] 'CAFE.MD'", lambda i: s_cmp(i.name, "==", "CAFE.MD", "cd"), "-size", (), False),
    ("name != 'x.md' AND name !=[c] 'notes.txt'",
     lambda i: s_cmp(i.name, "!=", "x.md") and s_cmp(i.name, "!=", "notes.txt", "c"), None, (), False),
    ("name <> 'report.md' && isDirectory == NO",
     lambda i: s_cmp(i.name, "!=", "report.md") and not i.is_dir, None, (), False),
    ("name < 'N'", lambda i: s_cmp(i.name, "<", "N"), "name", (), False),
    ("name <= 'Notes'", lambda i: s_cmp(i.name, "<=", "Notes"), "-name", (), False),
    ("name > 'report'", lambda i: s_cmp(i.name, ">", "report"), "name,size", (), False),
    ("name >= 'Über'", lambda i: s_cmp(i.name, ">=", "Über"), None, (), False),
    ("name <[c] 'm'", lambda i: s_cmp(i.name, "<", "m", "c"), "name", (), False),
    # [c] folds to lower case: 'archive' > 'a_' (as 'r' > '_'), though 'ARCHIVE' < 'A_'.
    ("name <[c] 'A_'", lambda i: s_cmp(i.name, "<", "A_", "c"), "name", (), False),
    ("name =>[cd] 'RESUME'", lambda i: s_cmp(i.name, ">=", "RESUME", "cd"), None, (), False),
    ("name =<[d] 'cafe'", lambda i: s_cmp(i.name, "<=", "cafe", "d"), None, (), False),
    ("'photo' < name", lambda i: s_cmp(i.name, ">", "photo"), None, (), False),
    # ---- LIKE with * and ?
    ("name LIKE '*.md'", lambda i: like(i.name, "*.md"), None, (), False),
    ("name LIKE[c] '*.md'", lambda i: like(i.name, "*.md", "c"), "-size,name", (), False),
    ("name LIKE 'caf?.*'", lambda i: like(i.name, "caf?.*"), None, (), False),
    ("name LIKE[d] 'cafe*'", lambda i: like(i.name, "cafe*", "d"), None, (), False),
    ("name LIKE[cd] '*e*e*.?x?'", lambda i: like(i.name, "*e*e*.?x?", "cd"), None, (), False),
    ("name LIKE '??????'", lambda i: like(i.name, "??????"), None, (), False),
    ("name LIKE 'R*'", lambda i: like(i.name, "R*"), None, (), False),
    ("name LIKE '*-?.*'", lambda i: like(i.name, "*-?.*"), None, (), False),
    ("name like[c] 'img*.png'", lambda i: like(i.name, "img*.png", "c"), None, (), False),
    ("name LIKE 'l\\'été*'", lambda i: like(i.name, "l'été*"), None, (), False),
    # ---- BEGINSWITH, ENDSWITH, CONTAINS
    ("name BEGINSWITH 'cafe'", lambda i: begins(i.name, "cafe"), None, (), False),
    ("name BEGINSWITH[d] 'cafe'", lambda i: begins(i.name, "cafe", "d"), None, (), False),
    ("name BEGINSWITH[cd] 'CAFE'", lambda i: begins(i.name, "CAFE", "cd"), "name", (), False),
    ("name ENDSWITH '.md'", lambda i: ends(i.name, ".md"), None, (), False),
    ("name ENDSWITH[c] '.MD'", lambda i: ends(i.name, ".MD", "c"), None, (), False),
    ("name ENDSWITH[c] 'É.TXT'", lambda i: ends(i.name, "É.TXT", "c"), None, (), False),
    ("name CONTAINS 'é'", lambda i: contains(i.name, "é"), None, (), False),
    ("name CONTAINS 'e'", lambda i: contains(i.name, "e"), None, (), False),
    ("name CONTAINS[d] 'e'", lambda i: contains(i.name, "e", "d"), None, (), False),
    ("name CONTAINS[cd] 'UBER'", lambda i: contains(i.name, "UBER", "cd"), None, (), False),
    ("name CONTAINS[c] 'ÜNÏ'", lambda i: contains(i.name, "ÜNÏ", "c"), None, (), False),
    ("name CONTAINS ' '", lambda i: contains(i.name, " "), None, (), False),
    ('path BEGINSWITH "{root}/Documents/"', lambda i: begins(i.path, "/Documents/"), None, (), False),
    ("path CONTAINS[cd] '/cafe'", lambda i: contains(i.path, "/cafe", "cd"), "path", (), False),
    # ---- IN
    ("name IN {'x.md', 'notes.txt', 'Café.json', 'naïve'}",
     lambda i: one_of(i.name, ["x.md", "notes.txt", "Café.json", "naïve"]), None, (), False),
    ("name IN[cd] {'X.MD', 'NOTES.TXT', 'CAFE.JSON', 'NAIVE'}",
     lambda i: one_of(i.name, ["X.MD", "NOTES.TXT", "CAFE.JSON", "NAIVE"], "cd"), None, (), False),
    ("size IN {0, 1, 1024, 20000}", lambda i: i.size in {0, 1, 1024, 20000} , "size", (), False),
    ("mimeType IN {'image/png', 'application/json'}",
     lambda i: i.content_type in {"image/png", "application/json"}, None, (), False),
    # ---- sizes
    ("size == 1000", lambda i: i.size == 1000, None, (), False),
    ("size != 0", lambda i: i.size != 0, None, (), False),
    ("size < 1000", lambda i: i.size < 1000, "-size", (), False),
    ("size <= 1024 AND NOT isDirectory == YES", lambda i: i.size <= 1024 and not i.is_dir, "size", (), False),
    ("size > 15000", lambda i: i.size > 15000, "size,name", (), False),
    ("size >= 20000", lambda i: i.size >= 20000, None, (), False),
    ("5000 < size", lambda i: i.size > 5000, None, (), False),
    ("size BETWEEN {1000, 2000}", lambda i: 1000 <= i.size <= 2000, "-size", (), False),
    ("size > 1e4", lambda i: i.size > 10000, None, (), False),
    ("size < -1", lambda i: False, None, (), True),
    # ---- dates: DATE, CAST, offsets, fractions; whole seconds rounded down on both sides
    (f'modificationDate == DATE("2020-01-01")', lambda i: i.mtime_s == T, None, (), False),
    (f'modificationDate == DATE("2020-01-01T00:00:00.900Z")', lambda i: i.mtime_s == T, None, (), False),
    (f'modificationDate != DATE("2020-01-01T00:00:00Z")', lambda i: i.mtime_s != T, None, (), False),
    (f'modificationDate > DATE("2020-01-01T00:00:00Z")', lambda i: i.mtime_s > T, "modificationDate", (), False),
    (f'modificationDate >= CAST("2020-01-01T00:00:00Z", "NSDate")', lambda i: i.mtime_s >= T, None, (), False),
    (f'modificationDate < CAST({T}, "NSDate")', lambda i: i.mtime_s < T, "-modificationDate", (), False),
    (f'modificationDate <= DATE("2020-01-01T01:00:00+01:00")', lambda i: i.mtime_s <= T, None, (), False),
    ('modificationDate BETWEEN {DATE("2019-12-31T23:59:59Z"), DATE("2020-01-01T00:00:01Z")}',
     lambda i: T - 1 <= i.mtime_s <= T + 1, "modificationDate", (), False),
    ('kMDItemFSContentChangeDate < DATE("2017-06-01") OR '
     'NSMetadataItemFSContentChangeDateKey >= DATE("2023-03-15T12:30")',
     lambda i: i.mtime_s < D("2017-06-01") or i.mtime_s >= D("2023-03-15T12:30"), None, (), False),
    ('modificationDate > DATE("2030-01-01")', lambda i: False, None, (), True),
    # ---- booleans, contentType, downloadingStatus
    ("isDirectory == YES", lambda i: i.is_dir, "-name", (), False),
    ("isDirectory == TRUE", lambda i: i.is_dir, None, (), False),
    ("isDirectory = 0", lambda i: not i.is_dir, None, (), False),
    ("isDirectory != NO AND name BEGINSWITH[c] 'r'", lambda i: i.is_dir and begins(i.name, "r", "c"), None, (), False),
    ("isDirectory IN {YES}", lambda i: i.is_dir, None, (), False),
    ("mimeType == 'text/markdown'", lambda i: i.content_type == "text/markdown", None, (), False),
    ("mimeType == 'application/octet-stream'",
     lambda i: i.content_type == "application/octet-stream", None, (), False),
    ("mimeType BEGINSWITH 'text/'", lambda i: i.content_type.startswith("text/"), "contentType,-size", (), False),
    ("downloadingStatus == 'current'", lambda i: True, None, (), False),
    ("TRUEPREDICATE", lambda i: True, "isDirectory,-modificationDate", (), False),
    ("FALSEPREDICATE", lambda i: False, None, (), True),
    # ---- iCloud / Spotlight attribute names, any case
    ("NSMetadataItemFSNameKey LIKE[c] '*.json'", lambda i: like(i.name, "*.json", "c"), None, (), False),
    ("kMDItemFSName BEGINSWITH 'R'", lambda i: begins(i.name, "R"), None, (), False),
    ("NSMetadataItemFSSizeKey > 10000 AND kMDItemFSSize < 12000",
     lambda i: 10000 < i.size < 12000, "NSMetadataItemFSSizeKey", (), False),
    ("NSMetadataItemPathKey BEGINSWITH '{root}/Documents'", lambda i: begins(i.path, "/Documents"), None, (), False),
    ("kMDItemContentType == 'public.png'", lambda i: i.content_type == "image/png", "kMDItemFSName", (), False),
    ("NAME endswith[C] '.TXT'", lambda i: ends(i.name, ".TXT", "c"), None, (), False),
    # ---- AND, OR, NOT, parentheses, precedence (NOT > AND > OR)
    ("isDirectory == YES OR size > 15000 AND name ENDSWITH '.md'",
     lambda i: i.is_dir or (i.size > 15000 and ends(i.name, ".md")), None, (), False),
    ("(isDirectory == YES OR size > 15000) AND name ENDSWITH[c] '-1'",
     lambda i: (i.is_dir or i.size > 15000) and ends(i.name, "-1", "c"), None, (), False),
    ("NOT name LIKE[c] '*.md' AND NOT isDirectory == YES",
     lambda i: not like(i.name, "*.md", "c") and not i.is_dir, None, (), False),
    ("NOT (name LIKE[c] '*.md' OR isDirectory == YES)",
     lambda i: not (like(i.name, "*.md", "c") or i.is_dir), None, (), False),
    ("! (size < 5000 || size > 15000) && !isDirectory == YES",
     lambda i: not (i.size < 5000 or i.size > 15000) and not i.is_dir, None, (), False),
    ("NOT NOT name CONTAINS[cd] 'resume'", lambda i: contains(i.name, "resume", "cd"), None, (), False),
    ("(name BEGINSWITH[cd] 'cafe' OR name BEGINSWITH[cd] 'resume') AND "
     "(modificationDate < DATE(\"2020-01-01\") OR size >= 10000) AND isDirectory == NO",
     lambda i: (begins(i.name, "cafe", "cd") or begins(i.name, "resume", "cd"))
     and (i.mtime_s < T or i.size >= 10000) and not i.is_dir, "-modificationDate", (), False),
    ("name like[cd] '*e*' and size between {100, 10000} or path beginswith '{root}/Documents/'",
     lambda i: (like(i.name, "*e*", "cd") and 100 <= i.size <= 10000) or begins(i.path, "/Documents/"), None, (), False),
    # ---- sorting by several keys, '-' descending, ties by path
    ("isDirectory == NO", lambda i: not i.is_dir, "contentType,-size,name", (), False),
    ("TRUEPREDICATE", lambda i: True, "-isDirectory,name,-path", (), False),
    ("TRUEPREDICATE", lambda i: True, "kMDItemFSName,-kMDItemFSSize", (), False),
    ("size > 0", lambda i: i.size > 0, "+size,-modificationDate", (), False),
    ("name LIKE[c] '*.md'", lambda i: like(i.name, "*.md", "c"), "-contentType,-name", (), False),
    # ---- scopes: Documents at the mount root is the documents scope
    ("TRUEPREDICATE", lambda i: True, None, ("documents",), False),
    ("TRUEPREDICATE", lambda i: True, "name", ("data",), False),
    ("TRUEPREDICATE", lambda i: True, None, ("documents", "data"), False),
    ("isDirectory == YES", lambda i: i.is_dir, None, ("documents",), False),
    ("name ==[c] 'documents'", lambda i: s_cmp(i.name, "==", "documents", "c"), None, ("data",), True),
    ("name ==[c] 'documents'", lambda i: s_cmp(i.name, "==", "documents", "c"), None, ("documents",), True),
    ("name ==[c] 'documents'", lambda i: s_cmp(i.name, "==", "documents", "c"), None, ("all",), False),
    ("name LIKE[cd] '*cafe*' AND size > 100", lambda i: like(i.name, "*cafe*", "cd") and i.size > 100,
     "-size", ("documents",), False),
    ("size < 5000", lambda i: i.size < 5000, "-name", ("data",), False),
]


# --------------------------------------------------------------------------
# Random predicates from a small grammar
# --------------------------------------------------------------------------

NAME_SPELLINGS = ["name", "NSMetadataItemFSNameKey", "kMDItemFSName", "Name"]
SIZE_SPELLINGS = ["size", "NSMetadataItemFSSizeKey", "kMDItemFSSize"]
DATE_SPELLINGS = ["modificationDate", "NSMetadataItemFSContentChangeDateKey", "kMDItemFSContentChangeDate"]
PATH_SPELLINGS = ["path", "NSMetadataItemPathKey", "kMDItemPath"]
ORDER_OPS = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "=": "==", "<>": "!=",
             "=<": "<=", "=>": ">="}


def quote(s: str, rng: random.Random) -> str:
    q = rng.choice("'\"")
    return q + s.replace("\\", "\\\\").replace(q, "\\" + q) + q


def disguise(s: str, rng: random.Random, mods: str = "") -> str:
    """Another spelling of a string: case, accents, normalization form. Half
    of the time only one that the modifiers `mods` fold away (NFD always is)."""
    if rng.random() < 0.5:
        how = rng.choice([3, 5] + ([0, 1, 4] if "c" in mods else []) + ([2] if "d" in mods else []))
    else:
        how = rng.randrange(6)
    if how == 0:
        return s.upper()
    if how == 1:
        return s.lower()
    if how == 2:
        return "".join(c for c in unicodedata.normalize("NFD", s) if not unicodedata.combining(c))
    if how == 3:
        return unicodedata.normalize("NFD", s)
    if how == 4:
        return s.swapcase()
    return s


def random_atom(rng: random.Random, items: list[Item], focus: Item):
    """(text, model) of one comparison, mostly about the focus item."""
    item = focus if rng.random() < 0.8 else rng.choice(items)
    kind = rng.randrange(8)
    mods = rng.choice(["", "", "c", "d", "cd"])
    modtext = f"[{mods}]" if mods else ""
    if kind == 0:  # name ordering / equality
        op = rng.choice(list(ORDER_OPS))
        lit = disguise(item.name if rng.random() < 0.6 else item.name[:rng.randrange(1, 4)], rng, mods)
        return (f"{rng.choice(NAME_SPELLINGS)} {op}{modtext} {quote(lit, rng)}",
                lambda i: s_cmp(i.name, ORDER_OPS[op], lit, mods))
    if kind == 1:  # LIKE from a real name with wildcards punched in
        chars = list(nfc(item.name))
        for _ in range(rng.randrange(1, 3)):
            at = rng.randrange(len(chars))
            chars[at] = "?"
        if rng.random() < 0.7:
            a = rng.randrange(len(chars))
            b = rng.randrange(a, len(chars) + 1)
            chars[a:b] = ["*"]
        pattern = disguise("".join(chars), rng, mods)
        return (f"{rng.choice(NAME_SPELLINGS)} LIKE{modtext} {quote(pattern, rng)}",
                lambda i: like(i.name, pattern, mods))
    if kind == 2:  # BEGINSWITH / ENDSWITH / CONTAINS a piece of a real name
        name = nfc(item.name)
        a = rng.randrange(len(name))
        b = rng.randrange(a + 1, min(len(name), a + 5) + 1)
        piece = disguise(name[a:b], rng, mods)
        op, fn = rng.choice([("BEGINSWITH", begins), ("ENDSWITH", ends), ("CONTAINS", contains)])
        if op == "BEGINSWITH":
            piece = disguise(name[:b - a], rng, mods)
        elif op == "ENDSWITH":
            piece = disguise(name[len(name) - (b - a):], rng, mods)
        return (f"{rng.choice(NAME_SPELLINGS)} {op}{modtext} {quote(piece, rng)}",
                lambda i: fn(i.name, piece, mods))
    if kind == 3:  # IN
        names = [disguise(rng.choice(items).name, rng, mods) for _ in range(rng.randrange(1, 4))]
        return (f"{rng.choice(NAME_SPELLINGS)} IN{modtext} {{{', '.join(quote(n, rng) for n in names)}}}",
                lambda i: one_of(i.name, names, mods))
    if kind == 4:  # size
        op = rng.choice(list(ORDER_OPS) + ["BETWEEN", "IN"])
        attr = rng.choice(SIZE_SPELLINGS)
        if op == "BETWEEN":
            lo, hi = sorted(rng.randrange(20001) for _ in range(2))
            return f"{attr} BETWEEN {{{lo}, {hi}}}", lambda i: lo <= i.size <= hi
        if op == "IN":
            sizes = {rng.choice(items).size for _ in range(3)}
            return f"{attr} IN {{{', '.join(map(str, sorted(sizes)))}}}", lambda i: i.size in sizes
        n = item.size if rng.random() < 0.5 else rng.randrange(20001)
        py = ORDER_OPS[op]
        return f"{attr} {op} {n}", lambda i: s_num(i.size, py, n)
    if kind == 5:  # dates
        op = rng.choice(list(ORDER_OPS))
        py = ORDER_OPS[op]
        seconds = item.mtime_s if rng.random() < 0.4 else rng.randrange(YEAR_2015, YEAR_2025)
        literal = rng.choice([f'DATE("{iso(seconds)}")', f'CAST("{iso(seconds)}", "NSDate")',
                              f'CAST({seconds}, "NSDate")', f'DATE({seconds}.75)'])
        return f"{rng.choice(DATE_SPELLINGS)} {op} {literal}", lambda i: s_num(i.mtime_s, py, seconds)
    if kind == 6:  # path
        folder = rng.choice([i for i in items if i.is_dir])
        lit = disguise(folder.path + "/", rng, mods)
        return (f"{rng.choice(PATH_SPELLINGS)} BEGINSWITH{modtext} {quote('{root}' + lit, rng)}",
                lambda i: begins(i.path, lit, mods))
    value = rng.choice(["YES", "NO", "TRUE", "FALSE", "1", "0"])
    truth = value in ("YES", "TRUE", "1")
    op = rng.choice(["==", "!="])
    return f"isDirectory {op} {value}", lambda i: (i.is_dir == truth) == (op == "==")


def s_num(a, op, b) -> bool:
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def random_predicate(rng: random.Random, items: list[Item], focus: Item, want: bool, depth: int = 0):
    """(text, model) of a random predicate that is `want` for the focus item,
    so that a predicate seldom matches nothing (or everything) by accident."""
    roll = rng.random()
    if depth >= 2 or roll < 0.35:
        text, fn = random_atom(rng, items, focus)
        if fn(focus) != want:
            return f"{rng.choice(['NOT', '!', 'not'])} ({text})", lambda i: not fn(i)
        return text, fn
    if roll < 0.5:
        text, fn = random_predicate(rng, items, focus, not want, depth + 1)
        return f"{rng.choice(['NOT', '!', 'not'])} ({text})", lambda i: not fn(i)
    conjunction = rng.random() < 0.5
    # AND: both true for a true result, one false for a false one; OR the other way round.
    first = want if conjunction == want else rng.random() < 0.5
    second = want if conjunction == want else (not first if first == conjunction else rng.random() < 0.5)
    (lt, lf), (rt, rf) = (random_predicate(rng, items, focus, first, depth + 1),
                          random_predicate(rng, items, focus, second, depth + 1))
    if conjunction:
        return f"({lt}) {rng.choice(['AND', '&&', 'and'])} ({rt})", lambda i: lf(i) and rf(i)
    return f"({lt}) {rng.choice(['OR', '||', 'or'])} ({rt})", lambda i: lf(i) or rf(i)


SORT_CHOICES = ["name", "-name", "size", "-size", "modificationDate", "-modificationDate", "isDirectory",
                "-isDirectory", "path", "-path", "contentType", "kMDItemFSSize", "-NSMetadataItemFSNameKey"]


# --------------------------------------------------------------------------
# 1. query vs the model
# --------------------------------------------------------------------------


def test_query_results_match_a_model_of_the_tree(make_device):
    # The default container mounted as a container (not the drive view): all
    # of it at the mount's root, so --scope documents and data apply.
    dev = make_device("q", container=DEFAULT_CONTAINER)
    root = dev.mountpoint
    created_after = math.floor(time.time()) - 1
    dirs, files, rng = build_spec(seed=20251121)
    items = write_tree(root, dirs, files, rng)
    created_before = math.ceil(time.time()) + 1
    assert 450 <= len(items) <= 600, len(items)
    check_tree_on_disk(root, items)
    # The data really exercises the folding: NFC and NFD names, case variants.
    names = [i.name for i in items]
    assert any(n != nfc(n) for n in names) and any("é" in n for n in names)
    assert any("é" in nfc(n) for n in names if n != nfc(n))

    # Every item, with the metadata the model assumes.
    everything = run_query(dev, "TRUEPREDICATE")
    by_path = {r["path"]: r for r in everything}
    assert len(everything) == len(by_path) == len(items), describe_mismatch(
        [i.path for i in model_sorted(items, None)], [r["path"] for r in everything])
    for item in items:
        r = by_path.get(item.path)
        assert r is not None, f"{item.path!a} missing from TRUEPREDICATE"
        assert (r["name"], r["size"], r["isDirectory"], r["mimeType"], r["contentType"], r["modificationDate"]) == \
            (item.name, item.size, item.is_dir, item.content_type, UTIS[item.content_type], iso(item.mtime_s)), (item, r)
        assert created_after <= D(r["creationDate"]) <= created_before, (item, r)
        assert r["downloadingStatus"] == "current", r

    # Hand-written predicates.
    start = time.monotonic()
    nonempty = 0
    problems: list[str] = []
    for predicate, matches, sort, scopes, may_be_empty in CASES:
        expected = check_query(dev, items, predicate, matches, sort=sort, scopes=scopes, problems=problems)
        if not may_be_empty:
            if not expected:
                problems.append(f"vacuous case: the model expects nothing for {predicate!r} scopes={scopes}")
            nonempty += 1
        elif expected:
            problems.append(f"{predicate!r} scopes={scopes}: the model expects results, the case says empty")
    assert not problems, f"{len(problems)} of {len(CASES)} hand-written cases failed:\n" + "\n".join(problems)
    print(f"\n{len(CASES)} hand-written predicates ({nonempty} non-empty) over {len(items)} items "
          f"in {time.monotonic() - start:.1f}s")

    # creationDate is when the items were made (now), so only bounds can be modelled.
    check_query(dev, items, f"creationDate >= CAST({created_after}, 'NSDate') AND creationDate <= "
                f"CAST({created_before}, 'NSDate')", lambda i: True)
    check_query(dev, items, f"creationDate < CAST({created_after}, 'NSDate')", lambda i: False)

    # Random predicates from the grammar.
    grammar = random.Random(4242)
    start = time.monotonic()
    sizes = []
    informative = 0
    for n in range(40):
        scopes = grammar.choice([(), (), (), ("documents",), ("data",)])
        in_scope = [i for i in items if in_scopes(i, scopes)]
        want = grammar.random() < 0.8
        text, matches = random_predicate(grammar, items, grammar.choice(in_scope), want)
        sort = ",".join(grammar.sample(SORT_CHOICES, grammar.randrange(0, 4))) or None
        sizes.append(len(check_query(dev, items, text, matches, sort=sort, scopes=scopes, problems=problems)))
        informative += 0 < sizes[-1] < len(in_scope)
        if n < 6:
            print(f"  e.g. {text}  --sort {sort}  --scope {scopes}: {sizes[-1]} results")
    assert not problems, f"{len(problems)} of 40 random predicates failed:\n" + "\n".join(problems)
    print(f"40 random predicates in {time.monotonic() - start:.1f}s; result sizes {sizes}")
    assert informative >= 30, f"random predicates too often empty or everything: {sizes}"


def test_mtime_just_below_a_whole_second_compares_as_that_second(make_device):
    """Dates compare at whole seconds, both sides rounded down (docs/SEMANTICS.md),
    and are printed rounded down: a modification date of T + 0.5 s or
    T + 0.999999999 s is DATE(T) for a predicate and in the output (the second
    once came out as T + 1: a Double near 1.6e9 s steps in 2^-22 s)."""
    dev = make_device("e")
    root = dev.mountpoint
    for name, nanos in [("half.txt", 500_000_000), ("edge.txt", 999_999_999)]:
        (root / name).write_text(name)
        os.utime(root / name, ns=(T * 10**9 + nanos,) * 2)
        assert os.stat(root / name).st_mtime_ns == T * 10**9 + nanos
    found = [r["name"] for r in run_query(dev, 'modificationDate == DATE("2020-01-01T00:00:00Z")', "name")]
    printed = {r["name"]: r["modificationDate"] for r in run_query(dev, "size > 0")}
    assert found == ["edge.txt", "half.txt"], found
    assert printed == {"half.txt": iso(T), "edge.txt": iso(T)}, printed


# --------------------------------------------------------------------------
# 2. --watch on device B while device A changes things
# --------------------------------------------------------------------------


class Watch:
    """`ubiquityfs query --watch --json` as a subprocess; lines read by a thread
    into a queue with their arrival time, so no read ever blocks the test."""

    def __init__(self, dev, predicate: str, throttle: float):
        self.stderr_path = dev.logdir / "watch.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [str(BIN), "query", str(dev.mountpoint), "--watch", "--json", "--throttle", str(throttle),
             "--predicate", predicate],
            env=dev.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr,
            start_new_session=True,
        )
        self.root = str(dev.mountpoint)
        self.lines: queue.Queue = queue.Queue()
        self.log: list[tuple[float, dict]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            now = time.monotonic()
            try:
                event = json.loads(raw)
                if "path" in event.get("item", {}):
                    path = event["item"]["path"]
                    # Absolute; the tests name paths below the mountpoint.
                    event["item"]["path"] = path[len(self.root):] if path.startswith(self.root + "/") else "NOT BELOW: " + path
                self.lines.put((now, event))
            except ValueError:
                self.lines.put((now, {"event": "unparsable", "text": raw.decode(errors="replace")}))
        self.lines.put((time.monotonic(), None))

    def next(self, timeout: float) -> tuple[float, dict]:
        try:
            at, event = self.lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            raise AssertionError(f"no event within {timeout:.1f}s; so far: {self.summary()}") from None
        if event is None:
            self.close()
            raise AssertionError(f"watch ended (exit {self.proc.returncode}): "
                                 f"{self.stderr_path.read_text(errors='replace')!r}; so far: {self.summary()}")
        self.log.append((at, event))
        return at, event

    def until(self, accept, timeout: float, what: str) -> list[tuple[float, dict]]:
        """Events up to and including the first that `accept`s."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                at, event = self.next(deadline - time.monotonic())
            except AssertionError as e:
                raise AssertionError(f"waiting for {what}: {e}") from None
            seen.append((at, event))
            if accept(event):
                return seen

    def drain(self, seconds: float) -> list[dict]:
        out = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                out.append(self.next(left)[1])
            except AssertionError:
                break
        return out

    def summary(self) -> str:
        return "; ".join(f"{e.get('event')} {e.get('item', {}).get('path', e.get('count', ''))!s}"
                         for _, e in self.log[-12:])

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        self.proc.stdout.close()
        self._stderr.close()


def about(path):
    return lambda e: e.get("item", {}).get("path") == path


def test_watch_on_one_device_follows_changes_made_on_another(make_device):
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    A, B = a.mountpoint, b.mountpoint
    throttle = 0.2
    predicate = "name BEGINSWITH[c] 'report' AND name ENDSWITH '.md'"

    # Already there when the watch starts: two matching items, two that are not.
    os.mkdir(A / "sub")
    for rel, size in [("report-1.md", 10), ("sub/REPORT-2.md", 20), ("notes.md", 30), ("report.txt", 40)]:
        (A / rel).write_bytes(b"r" * size)
    for rel in ["report-1.md", "sub/REPORT-2.md", "notes.md", "report.txt"]:
        eventually(lambda: os.stat(B / rel), SYNC_TIMEOUT, what=f"{rel} on B")

    watch = Watch(b, predicate, throttle)
    latencies = {}
    try:
        # Initial results, one "result" event each, then gatheringFinished with the count.
        seen = watch.until(lambda e: e.get("event") == "gatheringFinished", 30, "gatheringFinished")
        initial = [e for _, e in seen[:-1]]
        assert [e["event"] for e in initial] == ["result", "result"], watch.summary()
        assert [e["item"]["path"] for e in initial] == ["/report-1.md", "/sub/REPORT-2.md"], initial
        assert [e["item"]["size"] for e in initial] == [10, 20], initial
        assert seen[-1][1]["count"] == 2, seen[-1]

        # A creates a matching file: "added" on B.
        with open(A / "report-new.md", "wb") as f:
            f.write(b"n" * 100)
        t0 = time.monotonic()
        events = watch.until(about("/report-new.md"), SYNC_TIMEOUT, "added /report-new.md")
        at, event = events[-1]
        assert event["event"] == "added" and event["item"]["size"] == 100, event
        assert event["item"]["name"] == "report-new.md" and event["item"]["isDirectory"] is False, event
        latencies["added"] = at - t0

        # A makes it bigger: "changed" with the new size (other changes of it may come first).
        with open(A / "report-new.md", "ab") as f:
            f.write(b"m" * 4900)
        t0 = time.monotonic()
        events = watch.until(lambda e: about("/report-new.md")(e) and e["item"]["size"] == 5000,
                             SYNC_TIMEOUT, "changed /report-new.md size 5000")
        for _, e in events:
            if about("/report-new.md")(e):
                assert e["event"] == "changed", e
        latencies["changed"] = events[-1][0] - t0

        # A renames it so that it no longer matches: "removed" (with the item as it was).
        os.rename(A / "report-new.md", A / "done-new.md")
        t0 = time.monotonic()
        events = watch.until(lambda e: about("/report-new.md")(e) and e["event"] == "removed",
                             SYNC_TIMEOUT, "removed /report-new.md")
        assert events[-1][1]["item"]["size"] == 5000, events[-1]
        for _, e in events:
            assert about("/report-new.md")(e) or e["event"] == "changed", e
        latencies["removed"] = events[-1][0] - t0

        # A creates a file that does not match: nothing. Once B has it, a matching
        # sentinel follows; up to the sentinel's "added", nothing may name the other.
        (A / "other.txt").write_bytes(b"o" * 5)
        eventually(lambda: os.stat(B / "other.txt"), SYNC_TIMEOUT, what="other.txt on B")
        (A / "Report-last.md").write_bytes(b"s" * 7)
        t0 = time.monotonic()
        events = watch.until(about("/Report-last.md"), SYNC_TIMEOUT, "added /Report-last.md")
        assert events[-1][1]["event"] == "added", events[-1]
        latencies["added (sentinel)"] = events[-1][0] - t0
        late = [e for _, e in events] + watch.drain(4 * throttle + 1)
        for e in late:
            path = e.get("item", {}).get("path")
            assert path not in ("/other.txt", "/done-new.md"), f"event for a non-matching item: {e}"
            assert e.get("event") == "changed" or path == "/Report-last.md", f"unexpected event: {e}"
    finally:
        watch.close()

    print("\nwatch latencies A -> B event (throttle %.1fs): %s"
          % (throttle, ", ".join(f"{k} {v:.2f}s" for k, v in latencies.items())))
    for what, seconds in latencies.items():
        assert seconds < SYNC_TIMEOUT, f"{what} took {seconds:.1f}s"


# --------------------------------------------------------------------------
# 3. Predicates as iCloud apps write them (issue #9)
# --------------------------------------------------------------------------


def test_predicates_as_icloud_apps_write_them(make_device):
    """The NSMetadataQuery spellings of the iCloud samples: `==` with
    wildcards, Apple's constant names, YES/NO/TRUE/FALSE."""
    dev = make_device("i", container=DEFAULT_CONTAINER)
    root = dev.mountpoint
    (root / "Documents" / "notes").mkdir(parents=True)
    (root / "Documents" / "notes" / "todo.txt").write_text("todo\n")
    (root / "Documents" / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    (root / "config.json").write_text("{}")
    everything = run_query(dev, "TRUEPREDICATE", "path")
    assert len(everything) == 5, everything
    paths = [r["path"] for r in everything]

    # `==` with `*` or `?` is a wildcard match, as LIKE; [c] still folds case.
    assert [r["path"] for r in run_query(dev, "NSMetadataItemFSNameKey == '*'", "path")] == paths
    assert [r["name"] for r in run_query(dev, "NSMetadataItemFSNameKey == '*.JPG'")] == []
    assert [r["name"] for r in run_query(dev, "NSMetadataItemFSNameKey ==[c] '*.JPG'")] == ["photo.jpg"]
    assert [r["name"] for r in run_query(dev, "NSMetadataItemFSNameKey == 'todo.tx?'")] == ["todo.txt"]
    assert [r["name"] for r in run_query(dev, "name != '*.*'", "path")] == ["Documents", "notes"]

    # Apple's constants for the downloading status and the boolean literals:
    # the same items as the strings and values they stand for.
    for status in ["Current", "Downloaded", "NotDownloaded"]:
        value = status[0].lower() + status[1:]
        expected = [r["path"] for r in everything if r["downloadingStatus"] == value]
        found = run_query(dev, f"NSMetadataUbiquitousItemDownloadingStatusKey == "
                               f"NSMetadataUbiquitousItemDownloadingStatus{status}", "path")
        assert [r["path"] for r in found] == expected, status
    assert {r["downloadingStatus"] for r in everything} == {"current"}

    def uploaded():
        assert [r["path"] for r in run_query(dev, "NSMetadataUbiquitousItemIsUploadedKey == YES", "path")] == paths
    eventually(uploaded, what="every item uploaded")
    for literal in ["NO", "FALSE", "no"]:
        assert run_query(dev, f"NSMetadataUbiquitousItemIsUploadedKey == {literal}") == [], literal
    assert len(run_query(dev, "NSMetadataUbiquitousItemIsUploadedKey == TRUE")) == 5

    # URL, display name and content type (a UTI; the MIME type stays mimeType).
    by_name = {r["name"]: r for r in run_query(dev, "TRUEPREDICATE", absolute=True)}
    assert by_name["photo.jpg"]["url"] == f"file://{root}/Documents/photo.jpg"
    assert by_name["notes"]["url"] == f"file://{root}/Documents/notes/"
    assert all(r["displayName"] == name for name, r in by_name.items())
    assert {name: (r["contentType"], r["mimeType"]) for name, r in by_name.items()} == {
        "Documents": ("public.folder", "inode/directory"), "notes": ("public.folder", "inode/directory"),
        "todo.txt": ("public.plain-text", "text/plain"), "photo.jpg": ("public.jpeg", "image/jpeg"),
        "config.json": ("public.json", "application/json")}
    url = f"file://{root}/Documents/notes/todo.txt"
    assert [r["name"] for r in run_query(dev, f"NSMetadataItemURLKey == '{url}'")] == ["todo.txt"]
    assert [r["name"] for r in run_query(dev, "NSMetadataItemContentTypeKey == 'public.jpeg'")] == ["photo.jpg"]
    assert [r["name"] for r in run_query(dev, "NSMetadataItemDisplayNameKey ENDSWITH '.json'")] == ["config.json"]

    # MATCHES: a regular expression over the whole string.
    assert [r["name"] for r in run_query(dev, "name MATCHES '[a-z]+\\\\.(txt|jpg)'", "name")] == ["photo.jpg", "todo.txt"]
    assert run_query(dev, "name MATCHES 'photo'") == []
    assert [r["name"] for r in run_query(dev, "name MATCHES[c] 'DOC.*'")] == ["Documents"]


def test_content_type_tree_and_quantifiers(make_device):
    """NSMetadataItemContentTypeTreeKey is each item's UTI conformance tree (a
    JSON array), compared as Spotlight compares multi-valued attributes (some
    type matches); ANY / SOME / ALL / NONE on the tree and on
    path.pathComponents, and `value IN collection`."""
    dev = make_device("t", container=DEFAULT_CONTAINER)
    root = dev.mountpoint
    (root / "Documents" / "notes").mkdir(parents=True)
    (root / "Documents" / "notes" / "todo.txt").write_text("todo\n")
    (root / "Documents" / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    (root / "Documents" / "readme.md").write_text("# hi\n")
    (root / "Documents" / "scan.pdf").write_bytes(b"%PDF-1.4\n")
    (root / "config.json").write_text("{}")
    (root / "blob.bin").write_bytes(b"\0" * 4)

    def names(predicate):
        return [r["name"] for r in run_query(dev, predicate, "name")]

    trees = {r["name"]: r["contentTypeTree"] for r in run_query(dev, "TRUEPREDICATE")}
    content = ["public.data", "public.item", "public.content"]
    assert trees == {
        "Documents": ["public.folder", "public.directory", "public.item"],
        "notes": ["public.folder", "public.directory", "public.item"],
        "todo.txt": ["public.plain-text", "public.text"] + content,
        "photo.jpg": ["public.jpeg", "public.image"] + content,
        "readme.md": ["net.daringfireball.markdown", "public.plain-text", "public.text"] + content,
        "scan.pdf": ["com.adobe.pdf", "public.data", "public.item", "public.composite-content", "public.content"],
        "config.json": ["public.json", "public.text"] + content,
        "blob.bin": ["public.data", "public.item"],
    }, trees
    for r in run_query(dev, "TRUEPREDICATE"):
        assert r["contentTypeTree"][0] == r["contentType"], r

    # The tree compared as a whole: some type matches.
    images = ["photo.jpg"]
    texts = ["config.json", "readme.md", "todo.txt"]
    assert names("NSMetadataItemContentTypeTreeKey == 'public.image'") == images
    assert names("'public.image' IN NSMetadataItemContentTypeTreeKey") == images
    assert names("ANY NSMetadataItemContentTypeTreeKey == 'public.text'") == texts
    assert names("SOME kMDItemContentTypeTree == 'public.text'") == texts
    assert names("contentTypeTree IN {'public.image', 'public.composite-content'}") == ["photo.jpg", "scan.pdf"]
    # `!=` is not `==`; ANY … != is NSPredicate's (some type differs).
    assert names("contentTypeTree != 'public.content'") == ["Documents", "blob.bin", "notes"]
    assert len(names("ANY contentTypeTree != 'public.content'")) == 8
    assert names("ALL contentTypeTree BEGINSWITH 'public.'") == ["Documents", "blob.bin", "config.json", "notes",
                                                                 "photo.jpg", "todo.txt"]
    assert names("NONE contentTypeTree == 'public.data'") == ["Documents", "notes"]
    assert names("contentTypeTree.@count == 2") == ["blob.bin"]

    # Path components: the absolute path's, "/" first.
    assert names("ANY NSMetadataItemPathKey.pathComponents == 'notes'") == ["notes", "todo.txt"]
    assert names("'Documents' IN path.pathComponents AND contentTypeTree == 'public.text'") == ["readme.md", "todo.txt"]
    assert names("ALL path.pathComponents != 'Documents'") == ["blob.bin", "config.json"]
    depth = len(root.parts)
    assert names(f"path.pathComponents.@count == {depth + 1} AND NONE contentTypeTree == 'public.folder'") == \
        ["blob.bin", "config.json"]

    # Errors come back as the CLI's, before anything is asked of the daemon.
    for predicate, message in [("ANY name == 'x'", "'ANY' needs a collection"),
                               ("'x' IN size", "IN needs a collection or a string"),
                               ("ALL contentTypeTree > 3", "is a string and cannot be compared with a number")]:
        res = dev.cli("query", str(root), "--predicate", predicate, "--json", timeout=60)
        assert res.returncode != 0 and message in res.text, (predicate, res)


def check_paths_open(items: list[dict]):
    """Each result's path is absolute and opens as it is: files read, folders list."""
    for r in items:
        path = r["path"]
        assert os.path.isabs(path), path
        if r["isDirectory"]:
            os.listdir(path)
        else:
            res = subprocess.run(["cat", path], capture_output=True)
            assert res.returncode == 0 and len(res.stdout) == r["size"], (path, res)


def test_paths_are_absolute_on_every_kind_of_mount(make_device):
    """NSMetadataItemPathKey is the item's absolute path on this machine, so
    results open as they are and `BEGINSWITH '/abs/mount/dir'` selects a
    folder: on a container mount, a `--scope documents` mount (whose root is
    the Documents folder) and the drive view (containers as folders)."""
    dev = make_device("p", container=DEFAULT_CONTAINER)
    root = dev.mountpoint
    (root / "Documents" / "notes").mkdir(parents=True)
    (root / "Documents" / "notes" / "todo.txt").write_text("todo\n")
    (root / "Documents" / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    (root / "config.json").write_text("{}")
    found = run_query(dev, "TRUEPREDICATE", "path", absolute=True)
    assert [r["path"] for r in found] == [f"{root}/Documents", f"{root}/Documents/notes",
                                          f"{root}/Documents/notes/todo.txt", f"{root}/Documents/photo.jpg",
                                          f"{root}/config.json"]
    check_paths_open(found)
    inside = run_query(dev, f"NSMetadataItemPathKey BEGINSWITH '{root}/Documents/notes/'", absolute=True)
    assert [r["path"] for r in inside] == [f"{root}/Documents/notes/todo.txt"]
    assert run_query(dev, "NSMetadataItemPathKey BEGINSWITH '/Documents'") == []
    # The depth filter of the samples: components as NSString counts them ("/" is one).
    depth = len(root.parts)  # pathlib counts "/" as a part too
    top = run_query(dev, f"NSMetadataItemPathKey.pathComponents.@count == {depth + 1}", "path", absolute=True)
    assert [r["path"] for r in top] == [f"{root}/Documents", f"{root}/config.json"]
    deepest = run_query(dev, f"path.pathComponents.@count > {depth + 2}", absolute=True)
    assert [r["path"] for r in deepest] == [f"{root}/Documents/notes/todo.txt"]
    # The shell way of the samples.
    res = subprocess.run(["sh", "-c", f"cat \"$({BIN} query {root} --json --predicate \"name == 'todo.txt'\" "
                                      "| python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[\"item\"][\"path\"])')\""],
                         capture_output=True, text=True, env=dev.env())
    assert res.returncode == 0 and res.stdout == "todo\n", res
    dev.unmount()

    # The same container mounted with --scope documents: its root is Documents.
    docs = make_device("d", container=DEFAULT_CONTAINER, mount=False)
    docs.mount_args = ("--scope", "documents")
    docs.mount()
    droot = docs.mountpoint
    def documents_shown():
        found = run_query(docs, "NSMetadataItemFSNameKey == '*'", "path", absolute=True)
        assert [r["path"] for r in found] == [f"{droot}/notes", f"{droot}/notes/todo.txt", f"{droot}/photo.jpg"], found
        return found
    check_paths_open(eventually(documents_shown, what="the documents scope on the second device"))
    inside = run_query(docs, f"NSMetadataItemPathKey BEGINSWITH '{droot}/notes'", absolute=True)
    assert [r["path"] for r in inside] == [f"{droot}/notes", f"{droot}/notes/todo.txt"]
    failed = docs.cli("query", str(droot), "--scope", "data", "--json", timeout=60)
    assert failed.returncode != 0 and "documents scope only" in failed.text, failed

    # The drive view: the container's Documents show as a folder by its display name.
    drive = make_device("v")
    vroot = drive.mountpoint
    def todo_in_drive():
        found = run_query(drive, "NSMetadataItemFSNameKey == 'todo.txt'", absolute=True)
        assert len(found) == 1, found
        return found
    found = eventually(todo_in_drive, what="todo.txt in the drive view")
    assert found[0]["path"].startswith(f"{vroot}/") and found[0]["path"].endswith("/notes/todo.txt"), found
    check_paths_open(found)
