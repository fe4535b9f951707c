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
"""GSM8K to verl's RL parquet: DIR/train.parquet (hub split train) and DIR/val.parquet (hub split test).

Rows: data_source "openai/gsm8k", ability "math", prompt = question + "\\n" + 'Let's think step by step and output
the final answer after "####".', ground truth = the number after "####" (commas removed). Records without a final
number are skipped and counted. The written files are checked against verl's schema.

    python examples/data_preprocess/gsm8k.py --local-dir ~/data/troll/gsm8k
    python examples/data_preprocess/gsm8k.py --train-file train.jsonl --val-file test.jsonl --local-dir out/

Without --train-file/--val-file the dataset is downloaded with datasets.load_dataset("openai/gsm8k", "main").
"""

from __future__ import annotations

import sys

from troll_verl.recipes.data.common import base_parser, convert_and_write, input_files, load_records
from troll_verl.recipes.data.gsm8k import HF_NAME, HF_PATH, HF_SPLITS, build_gsm8k_split


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__, default_local_dir="~/data/troll/gsm8k")
    args = parser.parse_args(argv)
    files = input_files(parser, args)

    def convert(split: str):
        records = load_records(files[split], HF_PATH, HF_NAME, HF_SPLITS[split])
        return build_gsm8k_split(records, split, args.max_samples)

    return convert_and_write(args.local_dir, convert)


if __name__ == "__main__":
    sys.exit(main())
