"""Model zoo: :func:`build_model` maps a name and input shape onto an ``nn.Module``.

Every model takes float ``[N, C, H, W]`` and returns logits ``[N, num_classes]``.
"""

import math

from torch import nn

from torchyard_contract.spec import ModelName

MLP_HIDDEN = 128


def build_model(
    name: ModelName | str, input_shape: tuple[int, int, int], num_classes: int
) -> nn.Module:
    """Build ``name`` for inputs of ``input_shape`` (C, H, W); raises ``ValueError`` if unknown."""
    name = ModelName(name)
    channels = input_shape[0]
    if name is ModelName.mlp:
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(input_shape), MLP_HIDDEN),
            nn.ReLU(),
            nn.Linear(MLP_HIDDEN, num_classes),
        )
    if name is ModelName.cnn:
        return nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            # Adaptive pooling makes the head independent of H and W (8x8 digits, 32x32 CIFAR).
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, num_classes),
        )
    from torchvision.models import resnet18

    model = resnet18(num_classes=num_classes)
    # The ImageNet stem (7x7 stride 2 + maxpool) would shrink 8x8..32x32 inputs to nothing;
    # a 3x3 stride-1 stem is the usual small-image adaptation.
    model.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()  # type: ignore[assignment]
    return model
