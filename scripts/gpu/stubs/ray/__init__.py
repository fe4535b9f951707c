# Copyright 2026 The troll-verl authors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""An import-time stand-in for Ray, for scripts/gpu_check.sh only (never on a real install's path).

verl imports Ray in ``verl/__init__`` (through ``verl.protocol``) and in its worker modules, but the GPU check runs
verl's engine in one process, where verl only asks ``ray.is_initialized()``. Ray's wheel (76 MiB) cannot travel to a
bare GPU machine, so this module answers the imports: every attribute and submodule is a permissive placeholder,
``@ray.remote`` returns what it decorates, and calling anything that needs a Ray cluster raises.
"""

import importlib.abc
import importlib.machinery
import sys

__version__ = "0.0.0+troll-verl-gpu-check-stub"
__path__ = []  # a package, so that `import ray.util.placement_group` goes through the finder below


class _Placeholder:
    """Any attribute of the stubbed Ray: usable in annotations, as a base class and as a decorator."""

    def __init__(self, name: str):
        self._name = name

    def __repr__(self):
        return f"<ray stub {self._name}>"

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _Placeholder):
            return args[0]  # @ray.remote, @ray.method
        if self._name.rsplit(".", 1)[-1] in ("remote", "method", "options"):
            return self  # @ray.remote(num_gpus=1)
        raise RuntimeError(f"{self._name}() needs Ray, which scripts/gpu_check.sh stubs out (single process only)")

    def __mro_entries__(self, bases):
        return (object,)

    def __getitem__(self, key):
        return object

    def __or__(self, other):
        return object

    __ror__ = __or__

    def __bool__(self):
        return False


def _module_getattr(module_name):
    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{module_name}.{attr}")

    return __getattr__


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``ray.<anything>`` imports as a module whose attributes are placeholders."""

    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.startswith("ray.") else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = _module_getattr(module.__name__)


sys.meta_path.append(_Submodules())
__getattr__ = _module_getattr("ray")


def is_initialized() -> bool:
    return False


class ObjectRef:
    """verl checks ``isinstance(x, ray.ObjectRef)``: nothing is one here."""
