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
"""When the core may read a tensor's values back to the host.

A read on an accelerator (``.item()``, ``bool(tensor)``, ``.tolist()``, ``nonzero()``, a data-dependent shape)
waits for every kernel queued before it: a device sync. On the CPU it costs nothing, and it lets the solver stop
when every row has converged and the sparse support trim to its widest row. So the core reads values back on the
CPU only; elsewhere it works over fixed shapes with masks and stops nothing early (:func:`host_reads`).
``TROLL_SYNC_FREE=1`` gives the CPU the accelerator's behaviour, which is how the tests check that path here.
"""

from __future__ import annotations

import os

import torch

__all__ = ["SYNC_FREE_ENV", "host_reads"]

SYNC_FREE_ENV = "TROLL_SYNC_FREE"


def host_reads(tensor: torch.Tensor) -> bool:
    """Whether the core may read values of ``tensor`` back to the host: on the CPU, unless ``TROLL_SYNC_FREE=1``."""
    return tensor.device.type == "cpu" and os.environ.get(SYNC_FREE_ENV, "0") != "1"
