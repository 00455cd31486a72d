# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Text lines to per-partition columns for the console producer (split_lines), and Kafka's
murmur2 partitioner hash."""
from libc.stdint cimport uint8_t, uint32_t, int32_t, int64_t
from libc.string cimport memcpy, memcmp, memchr
from cpython.bytes cimport PyBytes_AS_STRING

from kstore._format cimport INT32_MAX

import numpy as np

from kstore.errors import InvalidRecordError

cdef uint8_t _empty_byte = 0


def murmur2(data):
    """Kafka's murmur2 of a bytes-like object, as a signed 32-bit int."""
    cdef const uint8_t[::1] mv = data
    cdef Py_ssize_t n = mv.shape[0]
    return <int32_t>murmur2_hash(&mv[0] if n else &_empty_byte, n)


cdef inline Py_ssize_t _find(const uint8_t* p, Py_ssize_t start, Py_ssize_t end,
                             const uint8_t* pat, Py_ssize_t plen) noexcept nogil:
    """Position of the first pat in p[start:end), or -1."""
    cdef const uint8_t* q
    while end - start >= plen:
        q = <const uint8_t*>memchr(p + start, pat[0], <size_t>(end - start - plen + 1))
        if q == NULL:
            return -1
        start = q - p
        if memcmp(q, pat, <size_t>plen) == 0:
            return start
        start += 1
    return -1


cdef inline Py_ssize_t _line_end(const uint8_t* p, Py_ssize_t s, Py_ssize_t end,
                                 Py_ssize_t* next_nl) noexcept nogil:
    """Position of the first \\n or \\r in p[s:end), or end. next_nl caches the first \\n at
    or after an earlier s (start it at -1): searched again only once s passes it, so input
    whose lines end at \\r alone is not rescanned to its next \\n (or its end) per line."""
    cdef const uint8_t* nl
    cdef const uint8_t* cr
    if next_nl[0] < s:
        nl = <const uint8_t*>memchr(p + s, 10, <size_t>(end - s)) if s < end else NULL
        next_nl[0] = (nl - p) if nl != NULL else end
    cr = <const uint8_t*>memchr(p + s, 13, <size_t>(next_nl[0] - s)) if s < next_nl[0] else NULL
    return (cr - p) if cr != NULL else next_nl[0]


def split_lines(const uint8_t[::1] data, sep, int n_parts, int partition, int sticky,
                bint final):
    """Split text lines (a console producer's input) into per-partition columns, in two nogil
    passes and no per-line Python objects.

    Lines end at \\n, \\r or \\r\\n, as Java's BufferedReader.readLine (Kafka's console producer);
    with final=False the bytes after the last line end are left for the next call, and so is a
    line ending at a \\r that is the last byte (a \\n may follow in the next call). sep (bytes or None) splits each line into key and value at
    its first occurrence. A line's partition is `partition` when >= 0, else Kafka's default
    partitioner over its key (toPositive(murmur2) % n_parts) when keyed, else `sticky`.

    Returns (consumed, lines, parts, bad): bytes consumed, lines split, and per partition None
    or (count, key, value) in ColumnInput's form (key None when unkeyed). bad is -1, or the
    (start, end) of the first line without the separator: splitting stopped before it, the
    lines ahead of it are in parts and consumed ends at its start.
    """
    cdef Py_ssize_t n = data.shape[0]
    cdef const uint8_t* p = &data[0] if n else &_empty_byte
    cdef const uint8_t* pat = NULL
    cdef Py_ssize_t plen = 0, limit = 0, nlines = 0, i, j, s, e, k, q, bad_s = -1, bad_e = -1
    cdef Py_ssize_t next_nl = -1
    cdef const uint8_t* nl
    cdef bytes sepb
    if n_parts <= 0 or partition >= n_parts or not 0 <= sticky < n_parts:
        raise ValueError(f"partition {partition} / sticky {sticky} outside {n_parts} partitions")
    if sep is not None:
        sepb = bytes(sep)
        plen = len(sepb)
        if plen == 0:
            raise ValueError("the key separator must not be empty")
        pat = <const uint8_t*>PyBytes_AS_STRING(sepb)
    # the lines to split: up to the last line end, or everything when final
    with nogil:
        s = 0
        while s < n:
            e = _line_end(p, s, n, &next_nl)
            if e == n:
                break
            if p[e] == 13 and e + 1 == n and not final:
                break                    # "\r" last: its "\n" may come in the next call
            nlines += 1
            s = e + 2 if p[e] == 13 and e + 1 < n and p[e + 1] == 10 else e + 1
        limit = s
        if final and limit < n:
            nlines += 1
            limit = n
    starts = np.empty(nlines, dtype=np.int64)
    seps = np.empty(nlines, dtype=np.int64)
    ends = np.empty(nlines, dtype=np.int64)
    parts_of = np.empty(nlines, dtype=np.int32)
    counts = np.zeros(n_parts, dtype=np.int64)
    kbytes = np.zeros(n_parts, dtype=np.int64)
    vbytes = np.zeros(n_parts, dtype=np.int64)
    cdef int64_t[::1] st = starts, sp = seps, en = ends, cnt = counts, kb = kbytes, vb = vbytes
    cdef int32_t[::1] pt = parts_of
    cdef int32_t part
    with nogil:
        s = 0
        next_nl = -1
        for i in range(nlines):
            e = _line_end(p, s, limit, &next_nl)
            q = e + 2 if e + 1 < limit and p[e] == 13 and p[e + 1] == 10 else e + 1
            k = -1
            if pat != NULL:
                k = _find(p, s, e, pat, plen)
                if k < 0:
                    bad_s, bad_e = s, e
                    nlines = i
                    limit = s
                    break
            if partition >= 0:
                part = partition
            elif k >= 0:
                part = <int32_t>((murmur2_hash(p + s, k - s) & 0x7fffffff) % <uint32_t>n_parts)
            else:
                part = sticky
            st[i], sp[i], en[i], pt[i] = s, k, e, part
            cnt[part] += 1
            if k >= 0:
                kb[part] += k - s
                vb[part] += e - (k + plen)
            else:
                vb[part] += e - s
            s = q
    for j in range(n_parts):
        if kb[j] > INT32_MAX or vb[j] > INT32_MAX:
            raise InvalidRecordError("more than 2 GiB of keys or values in one call")
    # one fill pass: every partition's rows go to its own slice of shared buffers, at the row,
    # key byte and value byte its cursor has reached (bases are prefix sums of the counts)
    row_base = np.zeros(n_parts, dtype=np.int64)
    row_base[1:] = np.cumsum(counts + 1)[:n_parts - 1]
    kbase = np.zeros(n_parts, dtype=np.int64)
    kbase[1:] = np.cumsum(kbytes)[:n_parts - 1]
    vbase = np.zeros(n_parts, dtype=np.int64)
    vbase[1:] = np.cumsum(vbytes)[:n_parts - 1]
    voff = np.zeros(nlines + n_parts, dtype=np.int32)
    vdat = np.empty(int(vbytes.sum()), dtype=np.uint8)
    koff = np.zeros(nlines + n_parts, dtype=np.int32) if pat != NULL else voff   # unused unkeyed
    kdat = np.empty(int(kbytes.sum()), dtype=np.uint8) if pat != NULL else vdat
    rows = np.zeros(n_parts, dtype=np.int64)
    kused = np.zeros(n_parts, dtype=np.int64)
    vused = np.zeros(n_parts, dtype=np.int64)
    cdef int64_t[::1] rb = row_base, kbs = kbase, vbs = vbase, rw = rows, ku = kused, vu = vused
    cdef int32_t[::1] ko = koff, vo = voff
    cdef uint8_t[::1] kdm = kdat, vdm = vdat
    cdef uint8_t* kd = &kdm[0] if kdm.shape[0] else NULL      # NULL only when nothing is copied
    cdef uint8_t* vd = &vdm[0] if vdm.shape[0] else NULL
    cdef Py_ssize_t a
    with nogil:
        for i in range(nlines):
            j = pt[i]
            if sp[i] >= 0:
                a = sp[i] - st[i]
                if a:
                    memcpy(kd + kbs[j] + ku[j], p + st[i], <size_t>a)
                ku[j] += a
                ko[rb[j] + rw[j] + 1] = <int32_t>ku[j]
                a = en[i] - (sp[i] + plen)
                if a:
                    memcpy(vd + vbs[j] + vu[j], p + sp[i] + plen, <size_t>a)
            else:
                a = en[i] - st[i]
                if a:
                    memcpy(vd + vbs[j] + vu[j], p + st[i], <size_t>a)
            vu[j] += a
            rw[j] += 1
            vo[rb[j] + rw[j]] = <int32_t>vu[j]
    out = []
    for j in range(n_parts):
        if cnt[j] == 0:
            out.append(None)
            continue
        r0, r1 = row_base[j], row_base[j] + cnt[j] + 1
        value = (voff[r0:r1], vdat[vbase[j]:vbase[j] + vb[j]], None)
        key = (koff[r0:r1], kdat[kbase[j]:kbase[j] + kb[j]], None) if pat != NULL else None
        out.append((int(cnt[j]), key, value))
    bad = -1
    if bad_s >= 0:
        bad = (bad_s, bad_e)
    return limit, nlines, out, bad
