"""Successive pages of one server, read for what changed: the poll's scanner.

The page is cut at its ``# TYPE`` lines and only the wanted families are read, each again
only when its text changed. A family whose names and labels stay while its values move is
read by where its values sit (:class:`Layout`); a page that fits the whole last page's layout
is cut into its values in a few passes (:meth:`PageScanner.by_layout`). Lines are parsed with
:mod:`inferwatch.collect.textparse`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain

from inferwatch.collect.textparse import (
    SAMPLE_NAME,
    SUFFIXES,
    ExpositionError,
    Scan,
    read_sample,
    scan_lines,
    too_many,
    truncated,
)

# The most samples of wanted names a page, or one family, may hold to have a layout of its
# own: a bigger page (a series budget raised for a huge server) is read family by family,
# where what a family costs besides its lines is nothing next to them, and a bigger family
# in full, as a layout of all its lines would double what the scanner holds for it.
LAYOUT_SAMPLES = 10_000

# How many layouts of one family a mapper remembers (the scanner's of its lines, the
# histograms' of their label texts): a family may alternate between a few (a series that
# comes and goes between polls).
LAYOUTS = 8

# The most characters of page text the scanner's layouts cover together (a layout holds
# about as much again): a few times a page of the default series budget. A layout that
# would take them past it makes the scanner forget the others; a bigger one is not kept.
LAYOUT_CHARS = 8 << 20


class Layout:
    """Where the values of a block's lines sit, from a block read in full.

    A block of as many lines whose every sample line of a wanted name starts with the same
    head (name, label set and the blanks before the value) as then, and whose other lines
    (comments, blanks, other names) are unchanged, holds the same samples with new values,
    where each value parses as a plain number: anything else (a timestamp, an exemplar, a
    line that changed its labels, a value the full reader handles specially) is read in
    full. The checks and the parse are passes in C over the block's lines. A whole page
    has a layout too (:class:`_PageLayout`): its lines that no wanted family holds are not
    looked at, and its values are parsed where they are read (a value that is not a
    number then has the page read in full).
    """

    def __init__(
        self,
        lines: int,
        heads: list[tuple[int, str]],
        other: list[tuple[int, str]],
        names: dict[str, tuple[list[int], list[str]]],
    ) -> None:
        self.lines = lines
        self.count = len(heads)  # samples of the wanted names
        self.chars = 0  # of the text it was made from (set by the scanner)
        self._sample_lines = _getter([i for i, _ in heads])
        self._heads = tuple(head for _, head in heads)
        starts: dict[int, slice] = {}  # one slice per length of head
        self._values = tuple(
            starts.setdefault(len(head), slice(len(head), None)) for _, head in heads
        )
        self._other_lines = _getter([i for i, _ in other])
        # Every other line, as it was, in one string: one comparison in C over contiguous
        # memory, not one per line with each line's object (a poll runs cold).
        self._other = "\n".join(text for _, text in other)
        # Each wanted name: the positions of its values and its samples' label texts (the
        # same tuple for every page of this layout).
        self.names = {
            name: (_getter(positions), tuple(texts)) for name, (positions, texts) in names.items()
        }

    def texts(self, lines: list[str]) -> tuple[str, ...] | None:
        """The texts of the wanted samples' values in line order if ``lines`` fit, else
        None (the values are not parsed)."""
        if len(lines) != self.lines or "\n".join(self._other_lines(lines)) != self._other:
            return None
        sample_lines = self._sample_lines(lines)
        if not all(map(str.startswith, sample_lines, self._heads)):
            return None
        return tuple(map(operator.getitem, sample_lines, self._values))

    def read(self, lines: list[str]) -> Scan | None:
        """The block's samples if ``lines`` fit this layout and their values are plain
        numbers, else None."""
        found = self.texts(lines)
        if found is None:
            return None
        try:
            values = list(map(float, found))
        except ValueError:
            return None
        return Scan(
            {
                name: list(zip(texts, get(values), strict=True))
                for name, (get, texts) in self.names.items()
            }
        )


@dataclass(frozen=True, eq=False)
class _PageLayout:
    """A whole page's layout: the lines of the wanted families' blocks (the untyped prologue
    among them) and every ``# TYPE`` line, at their places. A page with as many TYPE lines
    that fits it is cut into the same families at the same lines, so the lines of the
    other families need no look: they are skipped as :meth:`PageScanner.scan` skips them."""

    layout: Layout
    types: int  # the page's TYPE lines


def _getter(positions: list[int]) -> Callable[[Sequence], tuple]:
    """The items at ``positions`` of a list, as a tuple (of one or none too)."""
    if not positions:
        return lambda items: ()
    if len(positions) == 1:
        (k,) = positions
        return lambda items: (items[k],)
    return operator.itemgetter(*positions)


def _layout_of(
    lines: list[str],
    wanted: frozenset[str],
    at: Iterable[int] | None = None,
    texts: Scan | None = None,
) -> Layout | None:
    """The layout of the lines read in full (those at ``at``, all by default), or None when
    they have none: a malformed line, a timestamp, an exemplar or a value that is not a
    plain number. It keeps the label texts of ``texts`` (the lines' scan), not copies."""
    heads: list[tuple[int, str]] = []
    other: list[tuple[int, str]] = []
    names: dict[str, tuple[list[int], list[str]]] = {}
    for i in range(len(lines)) if at is None else at:
        line = lines[i]
        match = SAMPLE_NAME.match(line) if line and line[0] != "#" else None
        if match is None or match.group(1) not in wanted:
            other.append((i, line))
            continue
        if " # " in line:
            return None
        try:
            labels, value = read_sample(line, match.end())
        except ExpositionError:
            return None
        pos = line.rfind("}") + 1 if line.startswith("{", match.end()) else match.end()
        rest = line[pos:]
        head = line[: pos + len(rest) - len(rest.lstrip())]
        try:
            if repr(float(line[len(head) :])) != repr(value):
                return None
        except ValueError:
            return None
        positions, kept = names.setdefault(match.group(1), ([], []))
        read = texts.samples.get(match.group(1), ()) if texts is not None else ()
        if len(kept) < len(read) and read[len(kept)][0] == labels:
            labels = read[len(kept)][0]
        positions.append(len(heads))
        kept.append(labels)
        heads.append((i, head))
    return Layout(len(lines), heads, other, names)


def _page_layout(
    text: str, lines: list[str], wanted: frozenset[str], families: frozenset[str]
) -> _PageLayout | None:
    """The layout of a page (``lines``: ``text`` cut at its newlines), as the scanner cuts
    it into families: the lines before the first TYPE line, and those of each family whose
    name is wanted (or empty), are read; None when a TYPE line names no type."""
    at: list[int] = []
    reading = True  # the untyped prologue is read
    for i, line in enumerate(lines):
        if line.startswith("# TYPE "):
            rest = line[7:]
            space = rest.find(" ")
            if space < 0:
                return None
            reading = not rest[:space] or rest[:space] in families
            at.append(i)
        elif reading:
            at.append(i)
    layout = _layout_of(lines, wanted, at)
    return None if layout is None else _PageLayout(layout, _type_lines(text))


def _type_lines(text: str) -> int:
    """How many lines of the page are TYPE lines."""
    return text.count("\n# TYPE ") + text.startswith("# TYPE ")


class PageScanner:
    """Scans successive pages of one server, reusing what did not change.

    The page is cut at its ``# TYPE`` lines and only the wanted families' lines are read:
    the format requires all lines of a family to form one group after its TYPE line. Lines
    before the first TYPE line (untyped samples; a whole page without TYPE lines) are one
    block of their own. A family's lines are re-parsed only when its text differs from
    the last page, and the same list objects are returned for an unchanged family, so
    callers can reuse work of their own by identity. A family whose text changed but whose
    lines fit one of its last :data:`LAYOUTS` layouts has only its values parsed; its label
    texts are the very strings of the layout, so callers can compare them cheaply.

    A page whose every wanted family was known (unchanged, or fitting a layout) leaves a
    layout of the whole page: :meth:`by_layout` cuts a next page that fits one of the
    last :data:`LAYOUTS` of those with a few passes in C over its lines, and gives the texts
    of its values without cutting it into families.
    """

    def __init__(self, wanted: Collection[str], max_label_bytes: float = math.inf) -> None:
        self.wanted = frozenset(wanted)
        self.max_label_bytes = max_label_bytes
        self._families = _families(self.wanted)
        self._blocks: dict[str, tuple[str, Scan, int]] = {}  # key -> (text, samples, count)
        self._layouts: dict[str, list[Layout]] = {}
        self._pages: list[_PageLayout] = []  # the last pages' layouts, last fitted first
        self._full_reads = 0  # blocks read in full so far

    def by_layout(
        self, text: str, limit: float = math.inf
    ) -> tuple[Layout, tuple[str, ...]] | None:
        """The page's values by one of the last pages' layouts: (the layout, the texts of
        the wanted samples' values in line order, unparsed; :attr:`Layout.names` says
        whose) when the page fits one, else None, and then :meth:`scan` reads it. Raises
        :class:`ExpositionError` when a page that fits holds more than ``limit`` samples."""
        if not self._pages or (text and not text.endswith("\n")):
            return None
        return self._fit(text, None, limit)

    def _fit(
        self, text: str, lines: list[str] | None, limit: float
    ) -> tuple[Layout, tuple[str, ...]] | None:
        """:meth:`by_layout` of a page, cut into ``lines`` already or (None) when needed."""
        types = _type_lines(text)
        for n, page in enumerate(self._pages):
            if page.types != types:
                continue
            if lines is None:
                lines = text.split("\n")
            texts = page.layout.texts(lines)
            if texts is None:
                continue
            if page.layout.count > limit:
                raise too_many(limit)
            if n:
                self._pages.insert(0, self._pages.pop(n))
            return page.layout, texts
        return None

    def scan(self, text: str, limit: float = math.inf) -> Scan:
        """Like :func:`scan` of the wanted names, over the whole page."""
        if text and not text.endswith("\n"):
            raise truncated()
        full_reads = self._full_reads
        found = Scan()
        count = 0
        for family, chunk in self._chunks(text):
            if family and family not in self._families:
                continue
            key = family or "\n"  # the untyped prologue has no family name
            cached = self._blocks.get(key)
            if cached is None or cached[0] != chunk:
                # A TYPE line followed at once by another leaves a chunk of its own line only.
                block = chunk.partition("\n")[2] if family else chunk
                part = self._read(key, block, limit - count)
                cached = (chunk, part, part.count())
                self._blocks[key] = cached
            part = cached[1]
            count += cached[2]
            if count > limit:
                raise too_many(limit)
            for name, samples in part.samples.items():
                found.samples[name] = (
                    found.samples[name] + samples if name in found.samples else samples
                )
            found.malformed.update(part.malformed)
            for name, left_out in part.oversized.items():
                found.oversized[name] = found.oversized.get(name, 0) + left_out
        for name in found.malformed:
            found.samples.pop(name, None)  # a family announced twice, malformed once
        known = self._full_reads == full_reads and not found.malformed and not found.oversized
        if known and count <= LAYOUT_SAMPLES and len(text) <= LAYOUT_CHARS:
            self._remember_page(text)
        return found

    def _remember_page(self, text: str) -> None:
        """Keep the layout of a page whose families were all known, unless it fits one."""
        lines = text.split("\n")
        if self._fit(text, lines, math.inf) is not None:
            return
        page = _page_layout(text, lines, self.wanted, self._families)
        if page is not None:
            self._make_room(page.layout, len(text))
            self._pages.insert(0, page)
            del self._pages[LAYOUTS:]

    def _make_room(self, layout: Layout, chars: int) -> None:
        """Make room for a new layout made from ``chars`` characters (at most
        :data:`LAYOUT_CHARS`): the others are forgotten if, with them, the layouts would
        cover more."""
        kept = chain((page.layout for page in self._pages), *self._layouts.values())
        if sum(other.chars for other in kept) + chars > LAYOUT_CHARS:
            self._pages.clear()
            self._layouts.clear()
        layout.chars = chars

    def _read(self, key: str, block: str, limit: float) -> Scan:
        """A changed block's samples: by one of its layouts where it fits one, else in full
        (and its layout then remembered first, for a block of :data:`LAYOUT_SAMPLES` samples
        and :data:`LAYOUT_CHARS` characters at most, each of a label set within the bound)."""
        whole = block if not block or block.endswith("\n") else block + "\n"
        lines = whole.split("\n")
        layouts = self._layouts.setdefault(key, [])
        for n, layout in enumerate(layouts):
            part = layout.read(lines)
            if part is not None:
                if n:
                    layouts.insert(0, layouts.pop(n))
                return part
        self._full_reads += 1
        part = scan_lines(lines, self.wanted, limit, self.max_label_bytes)
        if part.count() > LAYOUT_SAMPLES or part.oversized or len(whole) > LAYOUT_CHARS:
            return part
        layout = _layout_of(lines, self.wanted, texts=part)
        if layout is not None:
            self._make_room(layout, len(whole))
            layouts = self._layouts.setdefault(key, [])  # anew, if it was just forgotten
            layouts.insert(0, layout)
            del layouts[LAYOUTS:]
        return part

    def _chunks(self, text: str) -> list[tuple[str, str]]:
        """(family, text of its TYPE line on) for each family; ("", prologue) first. The
        text of a family that left the page is forgotten, its layouts are not: a family that
        comes and goes (a server's state, a page of another replica behind one URL) is read
        by its layout when it comes back, and the page's layout is remembered again. They
        are bounded: only wanted families have layouts, :data:`LAYOUTS` each.

        The chunks are cut out of the page as it is, not out of a copy: a page of one huge
        family (a hostile page) would be held once more for the cut."""
        # A chunk after the first starts with "<family> <type>\n" and holds the family's
        # lines (and, at its end, the next family's # HELP line). The first precedes any TYPE
        # line, unless the page opens with one: then it is the first family's, whole.
        chunks = text.split("\n# TYPE ")
        if text.startswith("# TYPE "):
            out = [("", ""), (_family_of(chunks[0], len("# TYPE ")), chunks[0])]
        else:
            out = [("", chunks[0])]
        out += [(_family_of(c), c) for c in chunks[1:]]
        present = {family for family, _ in out}
        for family in self._blocks.keys() - present - {"\n"}:
            del self._blocks[family]
        return out


def _family_of(chunk: str, start: int = 0) -> str:
    """The family a chunk's TYPE line names, from ``start`` (past the ``# TYPE `` that the
    page's first chunk keeps)."""
    return chunk[start : chunk.find(" ", start, chunk.find("\n"))]


def _families(names: frozenset[str]) -> frozenset[str]:
    """The family names whose TYPE line may announce the given sample names."""
    return frozenset(names | {n[: -len(s)] for n in names for s in SUFFIXES if n.endswith(s)})
