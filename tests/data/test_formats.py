"""Image decoding: pixels as the files hold them."""
import numpy as np


def test_16_bit_images_are_scaled_not_clipped():
    import io

    from PIL import Image

    from fedsim.data.formats import _rgb8

    wide = (np.arange(64).reshape(8, 8) * 1000).astype(np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(wide).save(buffer, format="PNG")
    with Image.open(io.BytesIO(buffer.getvalue())) as img:
        assert img.mode.startswith("I;16")
        pixels = _rgb8(img)
    assert pixels.shape == (8, 8, 3) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels[..., 0], np.rint(wide * (255 / 65535)).astype(np.uint8))
    assert (pixels == 255).mean() < 0.1  # Pillow's own conversion made 98 % of them 255
