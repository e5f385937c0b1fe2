"""A corpus this repository writes itself: seeded, template-built English sentences.

Used to train the fixtures' tokenizer (and as a base for the demo model's text). Being
generated, it is reproducible byte for byte and owes nothing to anyone else's writing.
"""

from __future__ import annotations

import random

SUBJECTS = ["the cat", "a small dog", "the old man", "my sister", "the farmer", "a young girl",
            "the teacher", "our neighbour", "the river", "a quiet bird", "the baker", "the sailor"]
VERBS = ["walks to", "looks at", "runs past", "sings about", "dreams of", "waits for", "paints",
         "carries", "finds", "follows", "builds", "remembers"]
OBJECTS = ["the market", "a red apple", "the green hill", "an open door", "the morning sun",
           "a wooden boat", "the long road", "a warm loaf of bread", "the village square",
           "a bright lamp", "the quiet forest", "an old letter"]
ENDINGS = ["every day", "at night", "in the rain", "before dinner", "with great care", "again and again",
           "near the sea", "after school", "in the spring", "without a word"]
EXTRAS = ["café au lait", "naïve résumé", "日本語のテキスト", "中文字符", "emoji 👍🏽 and 👨‍👩‍👧",
          "tabs\tand  spaces", "numbers 12345 and 3.14159", "x = f(y) + 2 * z", "ÄÖÜ äöü ß"]


def sentences(count: int, seed: int = 0, extras: bool = True) -> list[str]:
    """`count` sentences; with `extras`, one in eight carries non-ASCII or code-like text."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(ENDINGS)]
        sentence = " ".join(words)
        if extras and i % 8 == 7:
            sentence += ", " + rng.choice(EXTRAS)
        out.append(sentence[0].upper() + sentence[1:] + ".")
    return out
