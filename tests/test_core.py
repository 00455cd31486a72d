"""kstore._core, the package's entry to the compiled modules: every public name of each concept
module is re-exported as the same object, and the concept modules import on their own."""
import importlib

import pytest

from kstore import _core

MODULES = ["_crc", "_mapping", "_record", "_format", "_decode", "_scan", "_lines",
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
