"""``shapes``: a synthetic image task — one filled shape drawn with Pillow on a white square, and a question about it
that only the image answers. Rows are in verl's image layout (:mod:`hybridrl.data.images`): an ``<image>`` in the
prompt and the PNG bytes in ``images``; ``data_source="shapes"``, scored by exact match of the whole response
(:mod:`hybridrl.rewards.shapes`).

``question="colour"`` asks the shape's colour (``red``, ``green`` or ``blue``); ``question="count"`` draws 1 to
``max_count`` shapes of one colour and asks how many. Each image varies the shape (ellipse, rectangle, triangle), its
size and place, so the answer is in the pixels, not in a fixed picture. The training stream's row ``i`` is a pure
function of ``(seed, i)``; the held-out set is drawn from its own stream, the same for every seed; a fixed hash of
each drawing's parameters keeps the two disjoint.

``sft_examples`` are the format lesson: the same questions *without* their images, answered with the drawn answer —
a model can only learn from them which answers exist (a uniform guess), never which is right; that is RL's part.
"""

from __future__ import annotations

import hashlib
import io
import random
from dataclasses import dataclass
from typing import Any

from hybridrl.data.sft import SFTExample, sft_examples_from_rows
from hybridrl.data.synthetic import SYNTHETIC_TASKS

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220)}
QUESTIONS = {"colour": "What colour is the shape?", "count": "How many shapes?"}
_SPLIT_SALT = "hybridrl/shapes/split/v1"


@SYNTHETIC_TASKS.register("shapes")
@dataclass(frozen=True)
class ShapesTask:
    """Questions about a drawn image (module docstring)."""

    seed: int = 1
    question: str = "colour"
    max_count: int = 3
    image_size: int = 56
    num_train: int = 2048
    num_val: int = 64
    val_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.question not in QUESTIONS:
            raise ValueError(f"shapes task: question={self.question!r} must be one of {', '.join(QUESTIONS)}")
        if not 1 <= self.max_count <= 9:
            raise ValueError(f"shapes task: max_count must be in 1..9, got {self.max_count}")
        if not 28 <= self.image_size <= 448:
            raise ValueError(f"shapes task: image_size must be in 28..448 pixels, got {self.image_size}")
        for name in ("num_train", "num_val"):
            if getattr(self, name) < 1:
                raise ValueError(f"shapes task: {name} must be >= 1, got {getattr(self, name)}")

    def _drawing(self, rng: random.Random) -> tuple[tuple, str]:
        """``(parameters, answer)``: the colour, and each shape's kind and box, drawn from ``rng``."""
        colour = rng.choice(sorted(COLOURS))
        count = rng.randint(1, self.max_count) if self.question == "count" else 1
        size, shapes = self.image_size, []
        cell = size // count
        for index in range(count):  # one shape per vertical band, so shapes never overlap
            extent = rng.randint(max(cell // 3, 6), max(cell - 4, 8))
            left = index * cell + rng.randint(0, max(cell - extent, 0))
            top = rng.randint(0, size - min(extent, size))
            shapes.append((rng.choice(("ellipse", "rectangle", "triangle")), left, top, extent))
        return (colour, tuple(shapes)), colour if self.question == "colour" else str(count)

    def _png(self, parameters: tuple) -> bytes:
        from PIL import Image, ImageDraw

        colour, shapes = parameters
        image = Image.new("RGB", (self.image_size, self.image_size), "white")
        draw = ImageDraw.Draw(image)
        for kind, left, top, extent in shapes:
            box = (left, top, left + extent, top + extent)
            if kind == "triangle":
                draw.polygon([(left, top + extent), (left + extent // 2, top), (left + extent, top + extent)],
                             fill=COLOURS[colour])
            else:
                getattr(draw, kind)(box, fill=COLOURS[colour])
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()

    def is_held_out(self, parameters: tuple) -> bool:
        digest = hashlib.sha256(f"{_SPLIT_SALT}:{self.question}:{parameters}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.val_fraction

    def _row(self, parameters: tuple, answer: str, split: str, index: int) -> dict[str, Any]:
        return {"data_source": "shapes", "ability": "vision",
                "prompt": [{"role": "user", "content": f"<image>{QUESTIONS[self.question]}"}],
                "images": [{"bytes": self._png(parameters), "path": None}],
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index}}

    def _draw(self, stream: str, held_out: bool) -> tuple[tuple, str]:
        rng = random.Random(stream)
        for _ in range(10_000):
            parameters, answer = self._drawing(rng)
            if self.is_held_out(parameters) == held_out:
                return parameters, answer
        raise ValueError(f"shapes task: could not draw a {'held-out' if held_out else 'training'} image")

    def train_row(self, index: int) -> dict[str, Any]:
        return self._row(*self._draw(f"hybridrl/shapes/train/{self.seed}/{index}", False), "train", index)

    def train_rows(self, num_rows: int | None = None, start: int = 0) -> list[dict[str, Any]]:
        count = self.num_train if num_rows is None else num_rows
        return [self.train_row(index) for index in range(start, start + count)]

    def validation_rows(self) -> list[dict[str, Any]]:
        return [self._row(*self._draw(f"hybridrl/shapes/val/{index}", True), "val", index)
                for index in range(self.num_val)]

    def sft_examples(self, num_examples: int | None = None, start: int = 0) -> list[SFTExample]:
        """The format lesson: the questions without their images, with the drawn answers (module docstring)."""
        rows = [{**row, "images": [], "prompt": [{"role": "user", "content": QUESTIONS[self.question]}]}
                for row in self.train_rows(num_examples, start)]
        return sft_examples_from_rows(rows)
