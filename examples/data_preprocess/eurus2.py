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
"""Eurus-2-RL-Data, math or code subset, to verl's RL parquet: DIR/train.parquet and DIR/val.parquet.

--subset math: data_source "eurus2_math", prompt = the bare problem + "\\n" + "Let's think step by step and output
the final answer within \\boxed{}.", the LaTeX ground truth as is.
--subset code: data_source "eurus2_code", prompt = the bare problem + "\\n\\n" + an instruction to write a Python 3
program (stdin to stdout, or the named function for call-based problems) in a single ```python block; ground truth
= the test cases as verl's prime_code scorer reads them: a JSON string {"inputs": [str], "outputs": [str]} plus
"fn_name" for call-based problems. Code rows whose tests cannot be normalised are skipped and counted.

Eurus-2's system message and its own answer instructions are dropped; the origin (numina_*, apps, taco, ...) is
kept in extra_info["source"]. The hub's validation split becomes val. The written files are checked against
verl's schema.

    python examples/data_preprocess/eurus2.py --subset code --local-dir ~/data/troll/eurus_code
    python examples/data_preprocess/eurus2.py --subset math --train-file train.parquet --val-file validation.parquet

Without --train-file/--val-file the dataset is downloaded with datasets.load_dataset("PRIME-RL/Eurus-2-RL-Data").
"""

from __future__ import annotations

import sys

from troll_verl.recipes.data.common import base_parser, convert_and_write, input_files, load_records
from troll_verl.recipes.data.eurus2 import HF_PATH, HF_SPLITS, SUBSETS, build_eurus2_split


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__, default_local_dir="~/data/troll/eurus_<subset>")
    parser.add_argument("--subset", choices=SUBSETS, required=True, help="which rows to write: math or code")
    args = parser.parse_args(argv)
    files = input_files(parser, args)

    def convert(split: str):
        records = load_records(files[split], HF_PATH, None, HF_SPLITS[split])
        return build_eurus2_split(records, split, args.subset, args.max_samples)

    return convert_and_write(args.local_dir.replace("<subset>", args.subset), convert)


if __name__ == "__main__":
    sys.exit(main())
