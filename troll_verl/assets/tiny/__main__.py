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
"""``python -m troll_verl.assets.tiny``: build (or find) the cached tiny assets and print their paths as JSON."""

import argparse
import json
import sys

from .assets import build_assets


def main(argv=None) -> None:
    """Build (or find) the tiny asset and print its paths as JSON; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-dir", default=None, help="default: $TROLL_VERL_CACHE or ~/.cache/troll_verl")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    assets = build_assets(args.cache_dir, force=args.force, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(assets.as_dict(), indent=2))


if __name__ == "__main__":
    main()
