"""How a synthetic sample is worded: synonyms per attribute value, sentence patterns, zero-shot prompts."""

from __future__ import annotations

import numpy as np

from .attributes import COLOURS, SCATTERED

# Caption vocabulary: synonyms per attribute value (singular, plural for nouns).
_SHAPE_NOUNS = {
    "circle": (("circle", "circles"), ("disc", "discs")),
    "square": (("square", "squares"),),
    "triangle": (("triangle", "triangles"),),
    "star": (("star", "stars"),),
    "cross": (("cross", "crosses"), ("plus sign", "plus signs")),
    "diamond": (("diamond", "diamonds"), ("rhombus", "rhombi")),
}
_COLOUR_WORDS = {c: (c,) for c in COLOURS} | {"purple": ("purple", "violet"), "cyan": ("cyan", "turquoise")}
_SIZE_WORDS = {"small": ("small", "little", "tiny"), "large": ("large", "big")}
_COUNT_WORDS = {2: ("two", "a pair of"), 3: ("three",)}
_POSITION_PHRASES = {
    "top left": ("in the top left", "in the upper left corner", "at the top left"),
    "top right": ("in the top right", "in the upper right corner", "at the top right"),
    "bottom left": ("in the bottom left", "in the lower left corner", "at the bottom left"),
    "bottom right": ("in the bottom right", "in the lower right corner", "at the bottom right"),
    "center": ("in the center", "in the middle", "at the centre"),
    SCATTERED: ("scattered around", "spread across the picture"),
}
_BACKGROUND_WORDS = {"grey": ("grey", "gray"), "white": ("white",), "black": ("black", "dark")}
_PREFIXES = ("", "", "", "a picture of ", "an image of ", "a drawing of ")
#: Probability that a caption names the size / the position / the background.
_P_SIZE, _P_POSITION, _P_BACKGROUND = 0.8, 0.8, 0.75

#: Zero-shot prompts, in the captions' own words (no article before {c}: "an orange ...").
ZEROSHOT_TEMPLATES = (
    "{c}.",
    "one {c}.",
    "a picture of one {c}.",
    "an image of one {c}.",
    "there is one {c}.",
    "one small {c}.",
    "one big {c}.",
)


def _pick(rng: np.random.Generator, options):
    return options[rng.integers(len(options))]


def with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def make_caption(attrs: dict, rng: np.random.Generator) -> str:
    """One caption in varied words: shape, colour and count always, size, position and background by chance."""
    count = attrs["count"]
    singular, plural = _pick(rng, _SHAPE_NOUNS[attrs["shape"]])
    words = [_pick(rng, _COLOUR_WORDS[attrs["colour"]]), singular if count == 1 else plural]
    if rng.random() < _P_SIZE:
        words.insert(0, _pick(rng, _SIZE_WORDS[attrs["size"]]))
    core = " ".join(words)
    if count == 1:
        obj = "one " + core if rng.random() < 0.3 else with_article(core)
    else:
        obj = _pick(rng, _COUNT_WORDS[count]) + " " + core
    pos = _pick(rng, _POSITION_PHRASES[attrs["position"]]) if rng.random() < _P_POSITION else ""
    bg = _pick(rng, _BACKGROUND_WORDS[attrs["background"]]) if rng.random() < _P_BACKGROUND else ""
    pattern = int(rng.integers(5))
    if pattern == 1 and not bg:
        pattern = 0
    if pattern == 3 and not pos:
        pattern = 2
    sp_pos = " " + pos if pos else ""
    bg_on = f" on {with_article(bg)} background" if bg else ""
    if pattern == 0:
        return f"{_pick(rng, _PREFIXES)}{obj}{sp_pos}{bg_on}"
    elif pattern == 1:
        return f"{with_article(bg)} background with {obj}{sp_pos}"
    elif pattern == 2:
        verb = "is" if count == 1 or obj.startswith("a pair") else "are"
        return f"there {verb} {obj}{sp_pos}{bg_on}"
    elif pattern == 3:
        return f"{pos}, {obj}{bg_on}"
    else:
        bg_against = f" against {with_article(bg)} {_pick(rng, ('backdrop', 'background'))}" if bg else ""
        return f"{_pick(rng, _PREFIXES)}{obj}{bg_against}{sp_pos}"


def make_captions(attrs: dict, rng: np.random.Generator, k: int) -> list[str]:
    """``k`` captions of one image, distinct where the vocabulary allows (a few redraws)."""
    captions: list[str] = []
    for _ in range(k):
        text = make_caption(attrs, rng)
        for _retry in range(8):
            if text not in captions:
                break
            text = make_caption(attrs, rng)
        captions.append(text)
    return captions
