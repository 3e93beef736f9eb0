"""Pathfinder (Linsley et al.; the Long Range Arena version): are the two markers joined by a path?

Each ``size`` x ``size`` grayscale image holds curved dashed paths (1 px wide, intensity
``PATH``) and two markers (3x3 squares, intensity ``MARKER``). Positive: both markers sit on the
two ends of one path. Negative: they sit on ends of two different paths. Both kinds carry the
same number of paths, the rest being distractors. Paths keep a clearance from each other, so
"connected" has an exact meaning that a test checks by flood fill: two pixels are neighbours
when their Chebyshev distance is at most ``LINK`` (bridging the dash gaps); markers are
connected iff such a walk over non-background pixels joins them.

Pixels become tokens (id = intensity + 1, 0 = padding): ``size**2`` tokens per image in raster
order. Pure numpy (no torch).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

from xsearch.errors import XSearchError
from xsearch.settings import option
from xsearch.tasks.common import SplitSizes, checked
from xsearch.tasks.encoding import Encoding

GENERATOR_VERSION = 1  # bump whenever the images drawn for given options change (it keys the task cache)
PATH, MARKER = 160, 255
LINK = 2  # neighbourhood radius that bridges the 1-pixel dash gaps
CLEARANCE = 5  # min Chebyshev distance between pixels of different paths (> marker radius + LINK + 1)
DASH, GAP = 3, 1
ENCODING = Encoding("tokens", ("<pad>", *(str(v) for v in range(256))))


def _walk(
    rng: random.Random, size: int, length: int, curvature: float, blocked: np.ndarray
) -> list[tuple[int, int]] | None:
    """A smooth random curve of ``length`` unit steps as ordered distinct pixels, avoiding ``blocked``.

    Starts on a free pixel; turns away from the border; gives up (None) on entering a blocked
    pixel or crossing itself, so the caller draws again.
    """
    margin = 2
    free = np.argwhere(~blocked[margin : size - margin, margin : size - margin])
    if len(free) == 0:
        return None
    y0, x0 = free[rng.randrange(len(free))] + margin
    x, y = float(x0), float(y0)
    angle = rng.uniform(0, 2 * math.pi)
    lo, hi = margin, size - 1 - margin
    pixels: list[tuple[int, int]] = [(int(y0), int(x0))]
    for _ in range(length):
        angle += rng.gauss(0.0, curvature)
        for turn in (0.0, 0.6, -0.6, 1.2, -1.2, 1.8, -1.8):
            nx, ny = x + math.cos(angle + turn), y + math.sin(angle + turn)
            if lo <= nx <= hi and lo <= ny <= hi:
                angle += turn
                break
        else:
            return None
        x, y = nx, ny
        px = (round(y), round(x))
        if px != pixels[-1]:
            if px in pixels or blocked[px]:
                return None
            pixels.append(px)
    return pixels if len(pixels) >= 4 else None


def _dilate(occ: np.ndarray, r: int) -> np.ndarray:
    """Chebyshev dilation of a boolean map by ``r``."""
    out = occ.copy()
    h, w = occ.shape
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            ys, yd = (slice(max(dy, 0), h), slice(0, h - max(dy, 0))) if dy >= 0 else (slice(0, h + dy), slice(-dy, h))
            xs, xd = (slice(max(dx, 0), w), slice(0, w - max(dx, 0))) if dx >= 0 else (slice(0, w + dx), slice(-dx, w))
            out[yd, xd] |= occ[ys, xs]
    return out


def pathfinder_image(
    rng: random.Random, *, size: int = 32, connected: bool, n_paths: int = 3, path_len: int = 22, curvature: float = 0.3
) -> np.ndarray:
    """One image (uint8 ``size x size``) with the requested label."""
    for _ in range(1000):
        img = np.zeros((size, size), dtype=np.uint8)
        blocked = np.zeros((size, size), dtype=bool)  # too close to a placed path's centre line
        paths = []
        for k in range(n_paths):
            for _ in range(300):
                p = _walk(rng, size, path_len, curvature, blocked)
                # the first path's ends lie apart, so its two markers never touch
                if p is not None and (k > 0 or max(abs(p[0][0] - p[-1][0]), abs(p[0][1] - p[-1][1])) >= size // 4):
                    break
            else:
                break
            paths.append(p)
            line = np.zeros((size, size), dtype=bool)
            line[tuple(zip(*p))] = True
            blocked |= _dilate(line, CLEARANCE - 1)
        if len(paths) < n_paths:
            continue
        for p in paths:
            for i, (y, x) in enumerate(p):
                if i % (DASH + GAP) < DASH or i == len(p) - 1:
                    img[y, x] = PATH
        ends = [paths[0][0], paths[0][-1]] if connected else [paths[0][0], paths[1][-1]]
        for y, x in ends:
            img[max(y - 1, 0) : y + 2, max(x - 1, 0) : x + 2] = MARKER
        return img
    raise XSearchError(
        f"could not place {n_paths} paths of length {path_len} in a {size}x{size} image; "
        "lower n_paths or path_len, or raise size"
    )


def default_path_len(size: int) -> int:
    """Steps of each path when ``path_len`` is not given."""
    return int(size * 0.7)


@dataclass
class PathfinderOptions(SplitSizes):
    """The options of the ``pathfinder`` task (and of the generator)."""

    size: int = option(32, "image side in pixels (size**2 tokens)", ge=16)
    n_paths: int = option(3, "paths per image, distractors included (a negative joins two paths)", ge=2)
    path_len: int | None = option(None, "steps of each path (default: 0.7 * size)", ge=4)
    curvature: float = option(0.3, "standard deviation of a path's turn per step (radians)", ge=0)
    seed: int = option(0, "seeds the generator")

    def rules(self) -> None:
        if self.path_len is None:
            self.path_len = default_path_len(self.size)


def pathfinder_samples(
    n: int, *, seed: int = 0, size: int = 32, n_paths: int = 3, path_len: int | None = None, curvature: float = 0.3
) -> list[tuple[np.ndarray, int]]:
    """``n`` images with balanced labels (1 = markers connected), fully determined by ``seed``.

    Raises:
        XSearchError: a value outside its declared range (``PathfinderOptions``; a negative needs two
            paths, so ``n_paths >= 2``), or paths that do not fit.
    """
    o = checked(PathfinderOptions, "pathfinder", {"size": size, "n_paths": n_paths, "path_len": path_len,
                                                  "curvature": curvature})  # fmt: skip
    size, n_paths, path_len, curvature = o.size, o.n_paths, o.path_len, o.curvature
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = i % 2 if rng.random() < 0.5 else 1 - i % 2
        img = pathfinder_image(rng, size=size, connected=bool(label), n_paths=n_paths, path_len=path_len,
                               curvature=curvature)  # fmt: skip
        out.append((img, label))
    return out


def image_to_ids(img: np.ndarray) -> list[int]:
    """Raster-order token ids (intensity + 1)."""
    return (img.reshape(-1).astype(np.int64) + 1).tolist()
