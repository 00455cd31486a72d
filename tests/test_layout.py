"""kstore's module layout (issue 13), checked statically by tests/layout_check.py: no module-level
import cycle, no private name imported across modules, no module over 600 lines, no private
attribute reached across modules. `python tests/layout_check.py` lists every finding."""
import layout_check


def test_no_module_level_import_cycle():
    cycles = layout_check.import_cycles()
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_another_modules_private_names():
    found = layout_check.private_imports()
    assert not found, "\n".join(found)


def test_no_module_over_600_lines():
    found = layout_check.oversized(600)
    assert not found, "\n".join(found)


def test_no_private_attribute_used_across_modules():
    found = layout_check.private_attribute_uses()
    assert not found, "\n".join(found)
