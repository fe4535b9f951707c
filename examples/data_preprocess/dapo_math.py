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
"""DAPO-Math-17k (train) and AIME-2024 (validation) to verl's RL parquet: DIR/train.parquet and DIR/val.parquet.

Rows: data_source "math_dapo" (train) / "aime2024" (val), ability "math", prompt = the bare problem (DAPO's
"Answer:" wrapper removed) + "\\n" + "Let's think step by step and output the final answer within \\boxed{}.",
ground truth from the record's reward_model. Both datasets repeat each problem many times: only the first record
per problem text is kept (--no-dedup keeps them all), and the duplicates are counted. The written files are
checked against verl's schema.

    python examples/data_preprocess/dapo_math.py --local-dir ~/data/troll/dapo_math
    python examples/data_preprocess/dapo_math.py --train-file dapo.parquet --val-file aime.parquet --local-dir out/

Without --train-file/--val-file both are downloaded with datasets.load_dataset (BytedTsinghua-SIA/DAPO-Math-17k and
BytedTsinghua-SIA/AIME-2024, split "train"); DAPO-Math-17k is ~1.8M rows.
"""

from __future__ import annotations

import sys

from troll_verl.recipes.data.common import base_parser, convert_and_write, input_files, load_records
from troll_verl.recipes.data.dapo_math import (
    HF_SPLIT,
    HF_TRAIN_PATH,
    HF_VAL_PATH,
    TRAIN_DATA_SOURCE,
    VAL_DATA_SOURCE,
    build_dapo_split,
)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__, default_local_dir="~/data/troll/dapo_math")
    parser.add_argument(
        "--no-dedup", action="store_true", help="keep repeated problems (default: keep the first record per problem)"
    )
    args = parser.parse_args(argv)
    files = input_files(parser, args)
    sources = {"train": (HF_TRAIN_PATH, TRAIN_DATA_SOURCE), "val": (HF_VAL_PATH, VAL_DATA_SOURCE)}

    def convert(split: str):
        hf_path, data_source = sources[split]
        records = load_records(files[split], hf_path, None, HF_SPLIT)
        return build_dapo_split(records, split, data_source, args.max_samples, dedup=not args.no_dedup)

    return convert_and_write(args.local_dir, convert)


if __name__ == "__main__":
    sys.exit(main())
