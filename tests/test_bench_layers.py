"""kernels.bench.layers reads MobileNetV2's depthwise convolutions off torchvision's model."""

from kernels.bench.layers import mobilenet_v2_depthwise


def test_mobilenet_v2_depthwise_shapes_are_read_off_the_model():
    layers = mobilenet_v2_depthwise(112)
    assert sum(count for *_, count in layers) == 17  # one per inverted-residual block
    assert layers[0] == (32, 56, 3, 1, 1, 1) and layers[-1] == (960, 4, 3, 1, 1, 3)
    assert all(k == 3 and p == 1 and s in (1, 2) for _, _, k, s, p, _ in layers)
    assert mobilenet_v2_depthwise(224)[0] == (32, 112, 3, 1, 1, 1)
