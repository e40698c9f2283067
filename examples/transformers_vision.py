"""transformers' image models -- classifiers, semantic segmenters and backbones -- built
from their configs with random weights (nothing is downloaded), for export:

    python examples/transformers_vision.py resnet -o resnet.pte [--tiny]

``build(name, tiny)`` returns ``(module, (pixels,))``: the module takes a (1, 3, H, W)
image and returns the model's logits (a backbone: its feature maps). ``tiny`` keeps
each family's structure with one block per stage and narrow layers, at 64x64: what the
test suite exports (tests/models/test_transformers_vision.py); without it the config's
defaults, at 224x224 unless the family says otherwise: what bench/bench_vision.py times.

Weights are drawn so that activations keep their scale through the depth (transformers'
initializers with a BatchNorm's running statistics make most logits ~1e-30, which
would compare nothing); a family's own parameters (layer scales, embeddings) are drawn
around their initial values.
"""

import argparse
import os

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from configs: nothing to download

TINY_SIZE = 64
DEFAULT_SIZE = 224

# name -> (the output's field, transformers class, input size at full size or None for
# DEFAULT_SIZE, the tiny model's config overrides); a segmenter or classifier whose
# family is also here otherwise is named "<model type>-segmentation" / "-classification".
CLASSIFY, SEGMENT, BACKBONE, ENCODER = "logits", "logits", "feature_maps", "last_hidden_state"
VIT_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, patch_size=8)
SWIN_TINY = dict(embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4], window_size=2)
PVT_TINY = dict(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64], num_attention_heads=[1, 2, 2, 4])
SEGMENTING_VIT_TINY = dict(VIT_TINY, num_hidden_layers=4, out_indices=[1, 2, 3, 4])
VIT_BACKBONE_TINY = dict(VIT_TINY, out_indices=[1, 2])
STAGES_TINY = dict(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64])
FAMILIES = {
    "beit": (CLASSIFY, "BeitForImageClassification", None, dict(VIT_TINY, use_relative_position_bias=True)),
    "bit": (CLASSIFY, "BitForImageClassification", None, dict(depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 96, 128],
                                                              embedding_size=16, num_groups=8)),
    "clip": (CLASSIFY, "CLIPForImageClassification", None, dict(vision_config=VIT_TINY)),
    "convnext": (CLASSIFY, "ConvNextForImageClassification", None, dict(depths=[1, 1, 1, 1],
                                                                        hidden_sizes=[16, 32, 48, 64])),
    "convnextv2": (CLASSIFY, "ConvNextV2ForImageClassification", None, dict(depths=[1, 1, 1, 1],
                                                                            hidden_sizes=[16, 32, 48, 64])),
    "cvt": (CLASSIFY, "CvtForImageClassification", None, dict(depth=[1, 2, 3], embed_dim=[16, 32, 64],
                                                              num_heads=[1, 2, 2])),
    "data2vec-vision": (CLASSIFY, "Data2VecVisionForImageClassification", None,
                        dict(VIT_TINY, use_relative_position_bias=True)),
    "deit": (CLASSIFY, "DeiTForImageClassification", None, VIT_TINY),
    "dinov2": (CLASSIFY, "Dinov2ForImageClassification", None, VIT_TINY),
    "dinov2_with_registers": (CLASSIFY, "Dinov2WithRegistersForImageClassification", None, VIT_TINY),
    "donut-swin": (ENCODER, "DonutSwinModel", None, SWIN_TINY),
    "efficientnet": (CLASSIFY, "EfficientNetForImageClassification", None,
                     dict(width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320)),
    "focalnet": (CLASSIFY, "FocalNetForImageClassification", None, dict(embed_dim=16, depths=[1, 1, 1, 1])),
    "hgnet_v2": (CLASSIFY, "HGNetV2ForImageClassification", None, dict(depths=[1, 1, 1, 1])),
    "hiera": (CLASSIFY, "HieraForImageClassification", None, dict(embed_dim=16, depths=[1, 1, 1, 1],
                                                                  num_heads=[1, 1, 2, 2])),
    "ijepa": (CLASSIFY, "IJepaForImageClassification", None, VIT_TINY),
    "levit": (CLASSIFY, "LevitForImageClassification", None, dict(hidden_sizes=[32, 48, 64], depths=[1, 1, 1],
                                                                  num_attention_heads=[1, 2, 2], key_dim=[8, 8, 8])),
    "metaclip_2": (CLASSIFY, "MetaClip2ForImageClassification", None, dict(vision_config=VIT_TINY)),
    "mobilenet_v1": (CLASSIFY, "MobileNetV1ForImageClassification", None, dict(depth_multiplier=0.25)),
    "mobilenet_v2": (CLASSIFY, "MobileNetV2ForImageClassification", None, dict(depth_multiplier=0.25)),
    "mobilevit": (CLASSIFY, "MobileViTForImageClassification", 256, dict(hidden_sizes=[16, 24, 32],
                                                                         neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64])),
    "mobilevitv2": (CLASSIFY, "MobileViTV2ForImageClassification", 256, dict(width_multiplier=0.25)),
    "poolformer": (CLASSIFY, "PoolFormerForImageClassification", None, dict(depths=[1, 1, 1, 1],
                                                                            hidden_sizes=[16, 32, 48, 64])),
    "pvt": (CLASSIFY, "PvtForImageClassification", None, PVT_TINY),
    "pvt_v2": (CLASSIFY, "PvtV2ForImageClassification", None, PVT_TINY),
    "regnet": (CLASSIFY, "RegNetForImageClassification", None, dict(depths=[1, 1, 1, 1], hidden_sizes=[24, 48, 96, 192],
                                                                    embedding_size=16, groups_width=8)),
    "resnet": (CLASSIFY, "ResNetForImageClassification", None, dict(depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 96, 128],
                                                                    embedding_size=16)),
    "segformer": (CLASSIFY, "SegformerForImageClassification", None, dict(depths=[1, 1, 1, 1],
                                                                          hidden_sizes=[16, 32, 48, 64])),
    "siglip": (CLASSIFY, "SiglipForImageClassification", None, dict(vision_config=VIT_TINY)),
    "swiftformer": (CLASSIFY, "SwiftFormerForImageClassification", None, dict(depths=[1, 1, 1, 1],
                                                                              embed_dims=[16, 24, 32, 48])),
    "swin": (CLASSIFY, "SwinForImageClassification", None, SWIN_TINY),
    "swinv2": (CLASSIFY, "Swinv2ForImageClassification", None, SWIN_TINY),
    "textnet": (CLASSIFY, "TextNetForImageClassification", None, dict(depths=[1, 1, 1, 1])),
    "vit": (CLASSIFY, "ViTForImageClassification", None, VIT_TINY),
    "vit_msn": (CLASSIFY, "ViTMSNForImageClassification", None, VIT_TINY),
    "segformer-segmentation": (SEGMENT, "SegformerForSemanticSegmentation", 512,
                               dict(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64], decoder_hidden_size=32)),
    "mobilevit-segmentation": (SEGMENT, "MobileViTForSemanticSegmentation", 512,
                               dict(hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                    aspp_out_channels=32)),
    "beit-segmentation": (SEGMENT, "BeitForSemanticSegmentation", 640, SEGMENTING_VIT_TINY),
    "data2vec-vision-segmentation": (SEGMENT, "Data2VecVisionForSemanticSegmentation", 640, SEGMENTING_VIT_TINY),
    "mobilenet_v2-segmentation": (SEGMENT, "MobileNetV2ForSemanticSegmentation", 512, dict(depth_multiplier=0.25)),
    "mobilevitv2-segmentation": (SEGMENT, "MobileViTV2ForSemanticSegmentation", 512, dict(width_multiplier=0.25,
                                                                                         aspp_out_channels=32)),
    "tipsv2_dpt": (SEGMENT, "Tipsv2DptForSemanticSegmentation", None, {}),
    "upernet": (SEGMENT, "UperNetForSemanticSegmentation", 512, dict(
        backbone_config=dict(model_type="convnext", **STAGES_TINY, out_features=["stage1", "stage2", "stage3", "stage4"]),
        hidden_size=32, auxiliary_in_channels=48, auxiliary_channels=16)),
    "perceiver": (CLASSIFY, "PerceiverForImageClassificationConvProcessing", None, dict(
        d_latents=64, num_latents=32, num_blocks=1, num_self_attends_per_block=1, num_self_attention_heads=2,
        num_cross_attention_heads=1, d_model=64)),
    "pp_lcnet-classification": (ENCODER, "PPLCNetForImageClassification", None, {}),
    "dpt": (SEGMENT, "DPTForSemanticSegmentation", 384, dict(VIT_TINY, num_hidden_layers=4,
                                                              backbone_out_indices=[0, 1, 2, 3],
                                                              neck_hidden_sizes=[8, 16, 32, 64], fusion_hidden_size=32)),
    "dinov3_convnext": (BACKBONE, "DINOv3ConvNextBackbone", None, STAGES_TINY),
    "dinov3_vit": (BACKBONE, "DINOv3ViTBackbone", None, VIT_BACKBONE_TINY),
    "vitdet": (BACKBONE, "VitDetBackbone", None, VIT_BACKBONE_TINY),
    "vitpose_backbone": (BACKBONE, "VitPoseBackbone", None, VIT_BACKBONE_TINY),
    "maskformer-swin": (BACKBONE, "MaskFormerSwinBackbone", None, SWIN_TINY),
    "rt_detr_resnet": (BACKBONE, "RTDetrResNetBackbone", None, dict(depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 96, 128],
                                                                    embedding_size=16)),
    "lw_detr_vit": (BACKBONE, "LwDetrViTBackbone", None, VIT_BACKBONE_TINY),
    "pixio": (BACKBONE, "PixioBackbone", None, VIT_BACKBONE_TINY),
    "tipsv2": (BACKBONE, "Tipsv2VisionBackbone", None, VIT_TINY),
    "rf_detr_dinov2": (BACKBONE, "RfDetrDinov2Backbone", None, VIT_BACKBONE_TINY),
    "sapiens2": (BACKBONE, "Sapiens2Backbone", None, VIT_BACKBONE_TINY),
    "uvdoc_backbone": (BACKBONE, "UVDocBackbone", None, {}),
    "pp_lcnet": (BACKBONE, "PPLCNetBackbone", None, {}),
    "pp_lcnet_v3": (BACKBONE, "PPLCNetV3Backbone", None, {}),
    "pp_lcnet_v4": (BACKBONE, "PPLCNetV4Backbone", None, {}),
}


# Named checkpoints' shapes, one per family: what bench/bench_vision.py times (the
# config's defaults where they are that checkpoint's).
NAMED = {
    "ResNet-50": ("resnet", {}),
    "ConvNeXt-T": ("convnext", {}),
    "ConvNeXtV2-T": ("convnextv2", {}),
    "Swin-T": ("swin", {}),
    "ViT-B/16": ("vit", {}),
    "DeiT-S": ("deit", dict(hidden_size=384, num_attention_heads=6, intermediate_size=1536)),
    "DINOv2-S": ("dinov2", dict(hidden_size=384, num_attention_heads=6)),
    "MobileNetV2": ("mobilenet_v2", {}),
    "EfficientNet-B0": ("efficientnet", dict(width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280)),
    "RegNetY-400MF": ("regnet", dict(depths=[1, 3, 6, 6], hidden_sizes=[48, 104, 208, 440], groups_width=8,
                                     layer_type="y", embedding_size=32)),
    "MobileViTV2-1.0": ("mobilevitv2", {}),
    "LeViT-128S": ("levit", dict(num_attention_heads=[4, 6, 8], depths=[2, 3, 4])),
    "PoolFormer-S12": ("poolformer", {}),
    "SegFormer-B0": ("segformer", {}),
    "BEiT-B/16": ("beit", {}),
}


def _config(name: str, tiny: bool, overrides: dict):
    """The family's default config, with the overrides passed to the config's
    constructor (which derives what depends on them: a backbone's stage names)."""
    from transformers import AutoConfig

    size = input_size(name, tiny)
    model_type = name.rsplit("-", 1)[0] if name.endswith(("-segmentation", "-classification")) else name
    config = AutoConfig.for_model(model_type, **(FAMILIES[name][3] if tiny else {}), **overrides)
    vision = getattr(config, "vision_config", None) or config
    if hasattr(vision, "image_size"):
        vision.image_size = [size, size] if isinstance(vision.image_size, (list, tuple)) else size
    return config


def input_size(name: str, tiny: bool) -> int:
    return TINY_SIZE if tiny else FAMILIES[name][2] or DEFAULT_SIZE


class Pixels(nn.Module):
    """An image in, the model's logits (or a backbone's feature maps) out."""

    def __init__(self, model, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, pixel_values):
        out = getattr(self.model(pixel_values=pixel_values), self.field)
        return tuple(out) if isinstance(out, (list, tuple)) else out


def _draw(model: nn.Module, seed: int) -> None:
    """Weights that keep activations at their scale: fan-in scaled matrices and
    kernels, norms near the identity, running statistics near a unit Gaussian's."""
    generator = torch.Generator().manual_seed(seed)

    def normal(tensor, mean=0.0, std=1.0):
        tensor.copy_(torch.randn(tensor.shape, generator=generator) * std + mean)

    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                if name == "weight" and param.dim() >= 2:
                    normal(param, std=(param[0].numel()) ** -0.5)
                elif name == "weight":  # a norm's scale
                    normal(param, mean=1.0, std=0.1)
                elif name == "bias":
                    normal(param, std=0.1)
                else:  # a family's own: layer scales, embeddings, tokens
                    normal(param, mean=param.mean().item(), std=0.1)
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                normal(module.running_mean, std=0.1)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)


def build(name: str, tiny: bool = False, overrides: dict | None = None, seed: int = 0):
    """``(module, (pixels,))`` for the family ``name`` of ``FAMILIES``, its config's
    defaults changed by ``overrides`` (a ``NAMED`` checkpoint's shape)."""
    import transformers

    task, class_name, _, _ = FAMILIES[name]
    model = getattr(transformers, class_name)(_config(name, tiny, overrides or {})).eval()
    _draw(model, seed)
    size = input_size(name, tiny)
    pixels = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed))
    return Pixels(model, task).eval(), (pixels,)


def main() -> None:
    import etmlx

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=sorted(FAMILIES))
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--tiny", action="store_true", help="one block per stage, narrow, 64x64")
    args = parser.parse_args()
    module, inputs = build(args.name, args.tiny)
    etmlx.export(module, inputs, args.output)
    print(f"wrote {args.output}: {args.name}, input {tuple(inputs[0].shape)}")


if __name__ == "__main__":
    main()
