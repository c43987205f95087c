"""How a synthetic sample looks: drawn with PIL, written as JPEG bytes that depend on the image only."""

from __future__ import annotations

import io
import math

import numpy as np

_RGB = {
    "red": (215, 35, 35),
    "blue": (35, 75, 225),
    "green": (35, 165, 55),
    "yellow": (240, 215, 30),
    "purple": (135, 50, 185),
    "orange": (245, 135, 25),
    "pink": (245, 120, 185),
    "cyan": (30, 200, 215),
}
_BACKGROUND_LEVEL = {"grey": 128, "white": 236, "black": 22}
#: Half-extent of a shape as a fraction of the image side.
_RADIUS = {"small": 0.12, "large": 0.2}
#: Centres (x, y) as fractions of the image side.
_CENTRES = {
    "top left": (0.25, 0.25),
    "top right": (0.75, 0.25),
    "bottom left": (0.25, 0.75),
    "bottom right": (0.75, 0.75),
    "center": (0.5, 0.5),
}


def _outline(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Polygon vertices of a shape centred at (cx, cy) with half-extent r, turned by ``angle``."""
    if shape == "square":
        pts = [(1.1 * math.cos(a), 1.1 * math.sin(a)) for a in np.radians([45, 135, 225, 315])]
    elif shape == "diamond":  # a rhombus, narrower than tall, so that it never looks like a square
        pts = [(0.72 * math.cos(a), 1.12 * math.sin(a)) for a in np.radians([0, 90, 180, 270])]
    elif shape == "triangle":
        pts = [(1.15 * math.cos(a), 1.15 * math.sin(a) + 0.15) for a in np.radians([-90, 30, 150])]
    elif shape == "star":
        pts = [
            ((1.15 if k % 2 == 0 else 0.5) * math.cos(a), (1.15 if k % 2 == 0 else 0.5) * math.sin(a))
            for k, a in enumerate(np.radians(np.arange(10) * 36.0 - 90.0))
        ]
    elif shape == "cross":
        w = 0.36
        pts = [
            (-w, -1),
            (w, -1),
            (w, -w),
            (1, -w),
            (1, w),
            (w, w),
            (w, 1),
            (-w, 1),
            (-w, w),
            (-1, w),
            (-1, -w),
            (-w, -w),
        ]
    else:
        raise ValueError(f"unknown shape {shape!r}")
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + r * (x * c - y * s), cy + r * (x * s + y * c)) for x, y in pts]


def draw_image(attrs: dict, image_size: int, rng: np.random.Generator):
    """The attributes as an RGB image of side ``image_size``, supersampled, with colour, placement, rotation and
    noise jittered from ``rng``."""
    from PIL import Image, ImageDraw

    ss = max(1, math.ceil(256 / image_size))
    side = image_size * ss
    level = int(np.clip(_BACKGROUND_LEVEL[attrs["background"]] + rng.integers(-10, 11), 0, 255))
    img = Image.new("RGB", (side, side), (level, level, level))
    draw = ImageDraw.Draw(img)
    rgb = tuple(int(v) for v in np.clip(np.array(_RGB[attrs["colour"]]) + rng.integers(-14, 15, 3), 0, 255))
    r = _RADIUS[attrs["size"]] * side
    # The shape stays inside its quadrant (or the central square of the same size).
    slack = max(0.0, 0.25 * side - 1.15 * r - 0.02 * side)
    for where in attrs["quadrants"]:
        fx, fy = _CENTRES[where]
        cx = fx * side + rng.uniform(-slack, slack)
        cy = fy * side + rng.uniform(-slack, slack)
        if attrs["shape"] == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=rgb)
        else:
            draw.polygon(_outline(attrs["shape"], cx, cy, r, math.radians(rng.uniform(-10, 10))), fill=rgb)
    if ss > 1:
        img = img.reduce(ss)
    pixels = np.asarray(img, dtype=np.int16) + np.rint(rng.normal(0.0, 3.0, (image_size, image_size, 3))).astype(
        np.int16
    )
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def encode_jpeg(image, quality: int) -> bytes:
    """JPEG bytes at a fixed quality, 4:4:4 chroma (colour edges stay sharp at 64 px), no metadata."""
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality, subsampling=0, optimize=False)
    return buf.getvalue()
