"""The vLLM plugin's modules import one way only (names.py's docstring gives the order), read
from their source: vLLM is not installed here, and a cycle would show only once it is."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

import gguf_repack.integrations.vllm as plugin

PACKAGE = "gguf_repack.integrations.vllm"
SOURCES = {p.stem: p for p in Path(plugin.__file__).parent.glob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """Every module the file imports, at its top or inside a function (a cycle through a lazy
    import is a cycle all the same), as absolute names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: to this package (the plugin has no subpackages)
                base = PACKAGE if not base else f"{PACKAGE}.{base}"
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # `from . import quant`
    return found


def plugin_imports() -> dict[str, set[str]]:
    """{module: the plugin's modules it imports}, by short name (`__init__` for the package)."""
    return {name: {m.removeprefix(PACKAGE + ".") for m in imported_modules(path)
                   if m.startswith(PACKAGE + ".") and m.removeprefix(PACKAGE + ".") in SOURCES}
            for name, path in SOURCES.items()}


def test_the_plugins_modules_import_each_other_without_a_cycle():
    graph = plugin_imports()
    assert {"quant", "moe", "weights", "names"} <= set(graph)
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        pytest.fail(f"an import cycle among {PACKAGE}'s modules: {' -> '.join(e.args[1])}")
    # the layering names.py describes: each module below the ones that import it
    assert order.index("names") < order.index("moe") < order.index("quant") < order.index("weights")


def test_a_cycle_is_found(tmp_path):
    """The test above sees a lazy import inside a method, as moe.py's and quant.py's were."""
    (tmp_path / "a.py").write_text("from .b import X\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import Y\n")
    graph = {p.stem: {m.rpartition(".")[2] for m in imported_modules(p)} & {"a", "b"}
             for p in tmp_path.glob("*.py")}
    with pytest.raises(CycleError):
        list(TopologicalSorter(graph).static_order())


def test_names_imports_no_vllm_and_the_shared_names_stay_where_they_were():
    assert not {m for m in imported_modules(SOURCES["names"]) if m.split(".")[0] == "vllm"}
    names = importlib.import_module(f"{PACKAGE}.names")
    assert names.PLANE == "rp1_"
    assert names.decoder_layer("model.layers.12.mlp.experts") == 12
    assert names.decoder_layer("lm_head") is None
    # quant.PLANE, quant.decoder_layer and weights.mapping_for, as before the move (bound by
    # their imports; the modules themselves need vLLM to import)
    for module, expected in (("quant", {"PLANE", "decoder_layer"}),
                             ("moe", {"PLANE"}),
                             ("weights", {"PLANE", "decoder_layer", "mapping_for"})):
        tree = ast.parse(SOURCES[module].read_text())
        bound = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                 for alias in node.names}
        assert expected <= bound, module


def test_the_plugin_still_imports_without_vllm():
    """The package, its public alias and the entry point's target import lazily: vLLM is
    needed only when register() runs (in a fresh process: no module of this one cached)."""
    code = ("import sys; import gguf_repack.vllm, gguf_repack.integrations.vllm.names, "
            "gguf_repack.integrations.vllm.memory; "
            "from gguf_repack.integrations.vllm import register; "
            "assert gguf_repack.vllm.register is register; "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'vllm']")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
