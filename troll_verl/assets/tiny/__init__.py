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
"""The built-in tiny model and task for the CPU end-to-end run (see :mod:`troll_verl.assets.tiny.assets`)."""

from ..common import Assets, default_cache_dir
from .assets import TinySpec, build_assets

__all__ = ["Assets", "TinySpec", "build_assets", "default_cache_dir"]
