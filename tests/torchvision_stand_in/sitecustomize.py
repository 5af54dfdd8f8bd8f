"""A stand-in for torchvision, for tests/vllm_run.py --torchvision-stand-in (Python imports this
module at start-up where its directory is on PYTHONPATH). vLLM's Qwen3.5 module imports its
vision encoder, which imports torchvision (through transformers' image processors), and the
package index has no torchvision for the CPU torch. Where torchvision is not installed,
`import torchvision...` gives modules whose every name is an object that raises if it is
called: the imports succeed, and any use of torchvision by the text model would fail loudly
(none does)."""

import importlib.util
import sys

if importlib.util.find_spec("torchvision") is None:
    import importlib.abc
    import importlib.machinery
    import types

    class Unusable:
        def __init__(self, name: str):
            self.name = name

        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return Unusable(f"{self.name}.{attr}")

        def __call__(self, *args, **kwargs):
            raise RuntimeError(f"{self.name}: torchvision is not installed (a stand-in for vLLM's imports)")

        def __mro_entries__(self, bases):  # (a class defined on one of its names)
            return (object,)

    class StandInModule(types.ModuleType):
        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return Unusable(f"{self.__name__}.{attr}")

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = StandInModule(spec.name)
            module.__path__, module.__version__ = [], "0.0.0"
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


