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
"""Paired statistics of the learning studies: the t interval of paired differences, the exact sign-flip test,
Fisher's exact test, a bootstrap interval, the paired t test's power and the covariate-adjusted difference. Pure
Python, no verl.
"""

from __future__ import annotations

import bisect
import math
import random
import statistics

__all__ = [
    "T975",
    "t_interval",
    "sign_flip_p",
    "fisher_exact_p",
    "bootstrap_interval",
    "t_power",
    "adjusted_difference",
]

# two-sided 95 % quantiles of Student's t by degrees of freedom
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
}


def t_interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean of paired differences and its two-sided 95 % t interval (``n - 1`` degrees of freedom)."""
    if len(diffs) < 2:
        raise ValueError(f"a t interval needs at least 2 paired seeds, got {len(diffs)}")
    mean = statistics.mean(diffs)
    half = T975.get(len(diffs) - 1, 1.96) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


def sign_flip_p(diffs: list[float]) -> float:
    """Exact two-sided sign-flip p of the mean of paired differences: the share of the ``2**n`` sign assignments whose
    mean is at least as far from 0 as the observed one (the observed assignment included).

    Counted exactly by meeting in the middle: the ``2**(n/2)`` signed sums of each half, one half sorted, every pair
    counted by bisection (24 pairs: 2 × 4,096 sums instead of 16.8 million assignments).
    """
    n = len(diffs)
    if n == 0 or n > 40:
        raise ValueError(f"the exact sign-flip test takes 1 to 40 paired differences; n = {n}")
    observed = abs(sum(diffs)) - 1e-12
    if observed <= 0:  # a mean of 0: every assignment is as far from 0
        return 1.0

    def signed_sums(values: list[float]) -> list[float]:
        sums = [0.0]
        for v in values:
            sums = [x + v for x in sums] + [x - v for x in sums]
        return sums

    left, right = signed_sums(diffs[: n // 2]), sorted(signed_sums(diffs[n // 2 :]))
    hits = 0
    for x in left:
        hits += len(right) - bisect.bisect_left(right, observed - x)  # x + y >= observed
        hits += bisect.bisect_right(right, -observed - x)  # x + y <= -observed
    return hits / 2**n


def fisher_exact_p(a: int, n_a: int, b: int, n_b: int) -> float:
    """Two-sided Fisher exact p for ``a`` of ``n_a`` against ``b`` of ``n_b`` (tables as likely or less)."""
    total, k = n_a + n_b, a + b

    def prob(x):
        return math.comb(n_a, x) * math.comb(n_b, k - x) / math.comb(total, k)

    observed = prob(a)
    return min(1.0, sum(prob(x) for x in range(max(0, k - n_b), min(k, n_a) + 1) if prob(x) <= observed * (1 + 1e-9)))


def bootstrap_interval(diffs: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile 95 % bootstrap interval of the mean of ``diffs`` (seeds resampled with replacement; a fixed
    generator, so a report regenerates to the same digits). With 3 seeds it has few distinct values: read it beside
    the t interval, not instead."""
    rng = random.Random(seed)
    means = sorted(statistics.mean(rng.choices(diffs, k=len(diffs))) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def t_power(n: int, sd: float, effect: float, draws: int = 20_000, seed: int = 0) -> float:
    """Power of the two-sided 95 % paired t test with ``n`` pairs to detect a true mean difference ``effect`` when the
    differences have standard deviation ``sd`` (normal differences; Monte Carlo with a fixed generator)."""
    if n < 2 or sd <= 0:
        return float("nan")
    rng, quantile, hits = random.Random(seed), T975.get(n - 1, 1.96), 0
    for _ in range(draws):
        sample = [rng.gauss(effect, sd) for _ in range(n)]
        mean, half = statistics.mean(sample), quantile * statistics.stdev(sample) / math.sqrt(n)
        hits += mean - half > 0 or mean + half < 0
    return hits / draws


def adjusted_difference(diffs: list[float], covariate: list[float]) -> tuple[float, float, float]:
    """The intercept of the least-squares line of ``diffs`` on ``covariate`` (the difference at equal covariate) with
    its two-sided 95 % t interval (``n − 2`` degrees of freedom)."""
    n = len(diffs)
    if n < 3:
        raise ValueError(f"an adjusted difference needs at least 3 pairs, got {n}")
    mx, my = statistics.mean(covariate), statistics.mean(diffs)
    sxx = sum((x - mx) ** 2 for x in covariate)
    if sxx == 0:
        mean, lo, hi = t_interval(diffs)
        return mean, lo, hi
    slope = sum((x - mx) * (y - my) for x, y in zip(covariate, diffs, strict=True)) / sxx
    intercept = my - slope * mx
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(covariate, diffs, strict=True)) / (n - 2)
    se = math.sqrt(residual * (1 / n + mx**2 / sxx))
    half = T975.get(n - 2, 1.96) * se
    return intercept, intercept - half, intercept + half
