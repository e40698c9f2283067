"""``grid_sampler_2d`` (``F.grid_sample``) against eager PyTorch: every padding mode,
both corner conventions, bilinear and nearest, grids reaching outside the image, and
the regular grids of ``affine_grid`` whose points fall exactly between pixels."""

import pytest
import torch
import torch.nn.functional as F
from ruletest import declined_reason, delegated, untested_rules


def _grid(batch=2, rows=5, columns=7):
    """Random points, some outside [-1, 1] (up to 1.6 away)."""
    return torch.rand(batch, rows, columns, 2) * 3.2 - 1.6


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample(mode, padding_mode):
    image = torch.randn(2, 3, 6, 9)

    def fn(image, grid):
        return tuple(F.grid_sample(image, grid, mode=mode, padding_mode=padding_mode, align_corners=corners)
                     for corners in (False, True))

    delegated(fn, (image, _grid()), nodes=["TakeAlongAxis"])


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_on_an_affine_grid(mode):
    """Identity, half-pixel shifts and a zoom: points exactly on and between pixels."""
    theta = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], [[0.5, 0.0, 1 / 9], [0.0, 2.0, -1 / 6]]])
    image = torch.randn(2, 3, 6, 9)

    def fn(image, theta):
        grids = [F.affine_grid(theta, [2, 3, 6, 9], align_corners=c) for c in (False, True)]
        return tuple(F.grid_sample(image, g, mode=mode, align_corners=c) for g, c in zip(grids, (False, True)))

    delegated(fn, (image, theta), nodes=["TakeAlongAxis"])


def test_one_pixel_wide_images_reflect_to_their_only_pixel():
    def fn(image, grid):
        return F.grid_sample(image, grid, padding_mode="reflection", align_corners=True)

    delegated(fn, (torch.randn(1, 2, 1, 1), _grid(1, 3, 3)), nodes=["TakeAlongAxis"])


def test_bicubic_and_half_precision_are_declined():
    image, grid = torch.randn(1, 2, 4, 4), _grid(1, 3, 3)
    assert "bicubic" in declined_reason(lambda i, g: F.grid_sample(i, g, mode="bicubic", align_corners=False),
                                        (image, grid), "aten::grid_sampler_2d")
    assert "half precision" in declined_reason(lambda i, g: F.grid_sample(i, g, align_corners=False),
                                               (image.half(), grid.half()), "aten::grid_sampler_2d")


def test_every_sampling_rule_is_tested(whole_file):
    assert untested_rules("sampling") == set()
