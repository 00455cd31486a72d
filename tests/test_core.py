"""kstore._core, the package's entry to the compiled modules: every public name of each concept
module is re-exported as the same object, and the concept modules import on their own."""
import importlib

import pytest

import kstore
from kstore import _core

MODULES = ["_crc", "_mapping", "_record", "_format", "_decode", "_scan", "_index_copy", "_lines",
           "_column_input", "_encode", "_compact", "_columnar"]


@pytest.mark.parametrize("name", MODULES)
def test_core_re_exports_every_public_name(name):
    mod = importlib.import_module(f"kstore.{name}")
    public = [n for n, v in vars(mod).items()
              if not n.startswith("_") and getattr(v, "__module__", mod.__name__) == mod.__name__
              and not isinstance(v, type(importlib))]
    assert public, name
    for n in public:
        assert getattr(_core, n) is getattr(mod, n), f"kstore._core.{n} is not kstore.{name}.{n}"


def test_read_path_names_live_in_core():
    for n in ("log_read", "log_offset_for_timestamp", "read_at", "index_position",
              "find_offset_by_timestamp", "SegmentView", "IndexState"):
        assert getattr(_core, n).__module__ == "kstore._core"


def test_a_read_only_read_at_trailing_markers_finds_records_appended_after_them(tmp_path, watchdog):
    """read_records on a read-only log: a writer (another process) ends the log with transaction
    markers; read(pos) there returns nothing, and once the writer appends a record after them,
    read(pos) returns it. Before, a read below the end the view knew never refreshed it, and
    wait_for(pos) returned at once (the end is past pos): a read/wait_for tail loop never saw
    another record."""
    from batch_helpers import txn_batch
    from writer_process import WriterProcess
    watchdog(60)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)", "lg.append([(b'k', b'first')])",
              f"lg.append_batches({b''.join(txn_batch(1 + i, 4, control=1) for i in range(3))!r})")
        with kstore.StoreReader(d) as st:
            lg = st.log("t", 0)
            assert [r.value for r in lg.read(0)] == [b"first"]
            assert lg.read(1) == [] and lg.wait_for(1, 1) and lg.log_end_offset == 4
            w.run("lg.append([(b'k', b'after')])")
            assert [(r.offset, r.value) for r in lg.read(1)] == [(4, b"after")]
    finally:
        assert w.close() == 0
