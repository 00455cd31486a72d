"""Swapping rewritten segment files into a log crash-safely: the `.cleaned → .swap → final`
protocol (Kafka's replaceSegments, and LogLoader's completion of a swap a crash interrupted).

The writers (the cleaner, and the load's split of a segment whose offsets overflow) write the new
files under `.cleaned` names and make them durable; then swap_in renames them to `.swap`
(`.log` last, highest base first), fsyncs the directory, retires the old segments to `.deleted`
and drops the `.swap` suffix. At load, complete_swaps removes `.deleted`, `.cleaned` and temporary
files, discards a `.swap` whose promotion did not finish (one at or above a `.cleaned` left
behind) and completes the others: the segments in a swap's offset range go, the suffix is
dropped. So a crash at any step leaves the old segments or the new ones, never both or neither.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, TypeVar

from kstore.fileio import FileOps
from kstore.files import (CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX,
                          TIME_INDEX_SUFFIX, parse_name, segment_file)

if TYPE_CHECKING:
    from kstore.segment import LogSegment

#: a segment's files, in the order they are promoted to .swap (the .log last: a .log.swap means
#: its indexes are swapped too) and, reversed, made final
SEGMENT_SUFFIXES = (TIME_INDEX_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX)

_Swap = TypeVar("_Swap", bound=tuple[Any, ...])


def split_swaps(swaps: Iterable[_Swap],
                cleaned_bases: Iterable[int]) -> tuple[list[_Swap], list[_Swap]]:
    """The protocol's listing rule: which `.swap` files are live (a load completes them) and
    which are void (a load discards them). swaps are tuples whose first item is the file's base
    offset; cleaned_bases the base offsets of the `.cleaned` files present. swap_in renames the
    `.cleaned` files to `.swap` highest base first, so a `.cleaned` left behind means the swaps
    at or above its base belong to a promotion that did not finish: void. Returns (live, void).
    Used by the load (complete_swaps) and by the read-only listing (LogLoader), which must
    agree on it."""
    floor = min(cleaned_bases, default=None)
    live: list[_Swap] = []
    void: list[_Swap] = []
    for s in swaps:
        (void if floor is not None and s[0] >= floor else live).append(s)
    return live, void


def remove_cleaned(io: FileOps, dir_: str, base: int) -> None:
    """Remove the .cleaned files of one new segment (a clean that failed or was dropped)."""
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        path = segment_file(dir_, base, suffix, CLEANED_SUFFIX)
        if io.exists(path):
            io.unlink(path)


def remove_all_cleaned(io: FileOps, dir_: str) -> None:
    """After an aborted clean: every .cleaned file of the log (one clean per log at a time, so
    all are its own). Errors are ignored: the next load removes what is left."""
    try:
        for name in io.listdir(dir_):
            if name.endswith(CLEANED_SUFFIX):
                io.unlink(os.path.join(dir_, name))
    except OSError:
        pass


def swap_in(io: FileOps, dir_: str, new_bases: Iterable[int], old: Iterable[LogSegment],
            suffixes: tuple[str, ...] = SEGMENT_SUFFIXES) -> None:
    """Swap the durable `.cleaned` files of the segments at new_bases in for the segments old:
    rename them to `.swap`, fsync the directory, retire old to `.deleted` (its handlers
    closed), then drop the `.swap` suffix. Files of a new base with a suffix not in suffixes
    are stale (the split writes only .logs; their indexes are rebuilt) and removed before it
    becomes final. The directory fsync that makes the final names durable is the caller's (a
    crash before it is finished by complete_swaps)."""
    bases = sorted(new_bases)
    for base in reversed(bases):
        for suf in SEGMENT_SUFFIXES:
            if suf in suffixes:
                path = segment_file(dir_, base, suf, CLEANED_SUFFIX)
                if io.exists(path):
                    io.rename(path, segment_file(dir_, base, suf, SWAP_SUFFIX))
    io.fsync_dir(dir_)
    for seg in old:
        seg.close_handlers()
        seg.change_file_suffixes("", DELETED_SUFFIX)
    for base in bases:
        for suf in reversed(SEGMENT_SUFFIXES):
            if suf in suffixes:
                path = segment_file(dir_, base, suf, SWAP_SUFFIX)
                if io.exists(path):
                    io.rename(path, segment_file(dir_, base, suf))
            else:
                stale = segment_file(dir_, base, suf)
                if io.exists(stale):
                    io.unlink(stale)


def complete_swaps(io: FileOps, dir_: str, swap_end: Callable[[int], int],
                   names: Optional[list[str]] = None) -> Optional[list[str]]:
    """Kafka's LogLoader steps 1-2: drop `.deleted`, `.cleaned` and temporary files, discard
    the swaps that did not finish their promotion, complete the others. swap_end(base) is one
    past the last offset in the `.log.swap` at base: the segments in [base, end) are replaced.

    Returns the directory's names after it when it only removed files (the usual load: the
    loader parses this listing instead of making another), None when it completed a swap.
    names: the directory's listing if the caller just made it (start-up: no other process
    changes the directory meanwhile), else it is listed here."""
    if names is None:
        names = io.listdir(dir_)
    swaps, cleaned_offsets, cleaned_paths = [], [], []
    removed = set()
    for name in names:
        # most names are a live segment's or an index's: only the suffixed ones are parsed
        if name.endswith((DELETED_SUFFIX, ".tmp")):
            io.unlink(os.path.join(dir_, name))    # .tmp: an atomic write cut short
            removed.add(name)
        elif name.endswith(CLEANED_SUFFIX):
            p = parse_name(name, dir_)
            if p:
                cleaned_offsets.append(p[0])
            cleaned_paths.append(os.path.join(dir_, name))
            removed.add(name)
        elif name.endswith(SWAP_SUFFIX):
            p = parse_name(name, dir_)
            if p:
                swaps.append((p[0], p[1], os.path.join(dir_, name)))
    if not swaps and not cleaned_paths and not removed:
        return names
    live_swaps, void_swaps = split_swaps(swaps, cleaned_offsets)
    for _base, _suffix, path in void_swaps:
        io.unlink(path)         # a clean that did not finish swapping: discard it
        removed.add(os.path.basename(path))
    # the .cleaned files last: while one is left, the swaps above it stay void (for a crash
    # here, and for read-only readers listing meanwhile, see LogLoader.list_segment_bases)
    for path in cleaned_paths:
        io.unlink(path)
    for base, suffix, _path in sorted(live_swaps):
        if suffix != LOG_SUFFIX:
            continue
        end = swap_end(base)
        # delete the segments the swap replaces: [base, end)
        for name in io.listdir(dir_):
            p = parse_name(name, dir_)
            if p and not p[2] and base <= p[0] < end:
                io.unlink(os.path.join(dir_, name))
    for _base, _suffix, path in live_swaps:
        if io.exists(path):
            io.rename(path, path[: -len(SWAP_SUFFIX)])
    if live_swaps:
        io.fsync_dir(dir_)
        return None
    return [n for n in names if n not in removed]
