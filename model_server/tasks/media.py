"""Image bytes in and out: decoding user-supplied PNG/JPEG/... bytes (with limits and actionable errors)
and encoding generated images as PNG.  Pillow only; no torch here."""

from __future__ import annotations

import io
import warnings
from typing import Any

from model_server.errors import InvalidInput

# A decoded RGB image of this many pixels is ~150 MB; anything larger is refused before decoding, so a
# small compressed "bomb" cannot make the server allocate gigabytes.
MAX_IMAGE_PIXELS = 50_000_000


def decode_image(data: bytes, item: int) -> Any:
    """Encoded image bytes -> an RGB ``PIL.Image`` (fully decoded), or ``InvalidInput`` naming ``item``."""
    from PIL import Image

    if not data:
        raise InvalidInput(f"image {item} is empty")
    try:
        with warnings.catch_warnings():
            # Pillow warns (and later raises) about decompression bombs; we apply our own limit below.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise InvalidInput(
                    f"image {item} is {width}x{height}, over the limit of {MAX_IMAGE_PIXELS} pixels"
                )
            image.load()  # decode now: a truncated file fails here, not inside the model
            return image.convert("RGB")
    except InvalidInput:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        # UnidentifiedImageError is an OSError; truncated/corrupt data raises OSError or SyntaxError.
        raise InvalidInput(f"image {item} is not a decodable image (PNG, JPEG, ...): {exc}") from None


def warmup_png(side: int = 64) -> bytes:
    """A small, plain PNG: the image tasks' warm-up input."""
    from PIL import Image

    return encode_png(Image.new("RGB", (side, side), (127, 127, 127)))


def encode_png(image: Any) -> bytes:
    """A ``PIL.Image`` -> PNG bytes."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
