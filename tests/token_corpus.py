"""A long-tailed text corpus for the --batch-by tokens tests: log-normal byte lengths, clipped to a maximum."""

import math
import random

WORDS = ["the", "of", "memory", "token", "batch", "gradient", "step", "plan", "budget", "a", "sample", "length"]


def long_tailed_lines(count: int, median: int, longest: int, seed: int = 0, shortest: int = 4,
                      sigma: float = 0.8) -> list[str]:
    """``count`` lines of log-normal length (in bytes: one token each with --tokenizer bytes), in shortest..longest.

    The first two lines are one of each extreme, so the profile's ends are known.
    """
    rng = random.Random(seed)
    lengths = [shortest, longest] + [max(shortest, min(longest, round(rng.lognormvariate(math.log(median), sigma))))
                                     for _ in range(count - 2)]
    lines = []
    for length in lengths:
        text = ""
        while len(text) < length:
            text += rng.choice(WORDS) + " "
        lines.append(text[:length].rstrip().ljust(length, "x"))
    return lines


def write_long_tailed(path, count: int, median: int, longest: int, seed: int = 0, **kwargs) -> str:
    path.write_text("\n".join(long_tailed_lines(count, median, longest, seed, **kwargs)) + "\n")
    return str(path)
