"""R-FCN (Dai et al., NeurIPS 2016) as MMDetection 3 components, for UI8 Table 8's R-FCN row.

MMDetection 3 ships no R-FCN, so its parts are registered here in MMDetection's MODELS registry and a
config builds the detector as MMDetection's own ``TwoStageDetector`` (see
tasks/configs/detection/_rfcn_r101.py):

- backbone: ResNet without FPN, res5 dilated ("a trous": stride 1, dilation 2) so both outputs are at
  stride 16; outputs (C4, C5).
- ``SingleLevelRPNHead``: MMDetection's RPNHead on one backbone output (C4, as R-FCN's RPN), 3 scales x 3
  ratios of anchors at stride 16.
- ``RFCNBBoxHead``: on C5, a randomly initialised 1x1 convolution to 1024 channels with ReLU, then one
  1x1 convolution to the k*k*(C+1) position-sensitive score maps and one to the k*k*4 class-agnostic box
  maps (k = 7); a RoI's score is the average over its k*k bins ("voting by average").
- ``PSRoIAlignExtractor``: position-sensitive RoI pooling by ``torchvision.ops.ps_roi_align`` (autograd
  and meta kernels kept by torchvision; mmcv has no position-sensitive RoI op), as an MMDetection RoI
  extractor.
- ``RFCNRoIHead``: MMDetection's StandardRoIHead whose box branch makes the score maps on the whole C5
  map first and pools them per RoI after, which is what makes R-FCN fully convolutional.

The losses are MMDetection's BBoxHead losses: softmax cross-entropy over C+1 classes and smooth L1 on the
class-agnostic box deltas of the positives (IoU >= 0.5), weight 1, as in R-FCN (eq. 1). Training mines
hard RoIs with MMDetection's OHEMSampler (R-FCN trains with OHEM, B = 128 RoIs per image); the test keeps
300 RPN proposals and applies NMS at IoU 0.3, as R-FCN's paper.

Choices R-FCN's paper and UI8 leave open, or that differ here (each config says its own):
- MMDetection's OHEMSampler keeps the positive fraction (0.25) and ranks positives and negatives
  separately; R-FCN ranks all of an image's RoIs together.
- Proposals per training image (2000 after NMS here, as MMDetection's Faster R-CNN) and the RPN's
  feature width (512) are not fixed by UI8; R-FCN follows Faster R-CNN for both.
- torchvision's ps_roi_align samples each bin bilinearly (RoIAlign-style, sampling_ratio 2 here) where
  R-FCN's original layer averages the whole feature cells inside each bin; UI8 does not say which it used.
- Which layers are INT8: UI8 quantizes every convolution but the first and the last. The box-map
  convolution is registered last and stays float; the class score-map convolution (the position-sensitive
  score layer) and the 1024-channel reduction are INT8 (repro.layers.quantize_model's rule).
"""

from __future__ import annotations

import torch
from mmdet.models.dense_heads import RPNHead
from mmdet.models.roi_heads import StandardRoIHead
from mmdet.models.roi_heads.bbox_heads import BBoxHead
from mmdet.models.roi_heads.roi_extractors import BaseRoIExtractor
from mmdet.registry import MODELS
from torch import Tensor, nn
from torchvision.ops import PSRoIAlign

BOX_DIM = 4  # class-agnostic deltas (dx, dy, dw, dh)


@MODELS.register_module()
class SingleLevelRPNHead(RPNHead):
    """RPNHead on one of the backbone's outputs (`level`), the others left to the RoI head."""

    def __init__(self, level: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.level = level

    def forward(self, x: tuple[Tensor, ...]):
        return super().forward(x[self.level : self.level + 1])


@MODELS.register_module()
class PSRoIAlignExtractor(BaseRoIExtractor):
    """Position-sensitive RoIAlign (torchvision.ops.ps_roi_align) on one feature map.

    A (N, c*k*k, H, W) map gives (N_rois, c, k, k): bin (i, j) of output channel c is pooled from input
    channel (c*k + i)*k + j only.
    """

    def __init__(
        self, output_size: int = 7, sampling_ratio: int = 2, featmap_strides=(16,), init_cfg=None
    ) -> None:
        if len(featmap_strides) != 1:
            raise ValueError(f"PSRoIAlignExtractor pools one feature map; got strides {featmap_strides}")
        self.output_size = output_size
        super().__init__(
            roi_layer=dict(output_size=output_size, sampling_ratio=sampling_ratio),
            out_channels=0,  # the input's channels / k*k: set by the maps it is given
            featmap_strides=list(featmap_strides),
            init_cfg=init_cfg,
        )

    def build_roi_layers(self, layer_cfg, featmap_strides) -> nn.ModuleList:
        return nn.ModuleList([PSRoIAlign(spatial_scale=1 / s, **layer_cfg) for s in featmap_strides])

    def forward(self, feats: tuple[Tensor, ...], rois: Tensor, roi_scale_factor=None) -> Tensor:
        if roi_scale_factor is not None:
            rois = self.roi_rescale(rois, roi_scale_factor)
        return self.roi_layers[0](feats[0], rois.to(feats[0].dtype))


@MODELS.register_module()
class RFCNBBoxHead(BBoxHead):
    """R-FCN's score maps and voting; losses, targets and decoding are BBoxHead's (class-agnostic boxes)."""

    def __init__(
        self, in_channels: int = 2048, mid_channels: int = 1024, roi_feat_size: int = 7, **kwargs
    ) -> None:
        kwargs.setdefault("init_cfg", None)
        super().__init__(
            with_avg_pool=True,
            roi_feat_size=roi_feat_size,
            in_channels=mid_channels,
            reg_class_agnostic=True,
            **kwargs,
        )
        del self.fc_cls, self.fc_reg, self.avg_pool  # replaced by the score-map convolutions below
        bins = self.roi_feat_area
        self.reduce = nn.Conv2d(in_channels, mid_channels, 1)
        self.ps_cls = nn.Conv2d(mid_channels, bins * (self.num_classes + 1), 1)
        self.ps_reg = nn.Conv2d(mid_channels, bins * BOX_DIM, 1)  # last: stays float under INT8
        self.init_cfg = [
            dict(type="Normal", std=0.01, override=dict(name="reduce")),
            dict(type="Normal", std=0.01, override=dict(name="ps_cls")),
            dict(type="Normal", std=0.001, override=dict(name="ps_reg")),
        ]

    def score_maps(self, feat: Tensor) -> Tensor:
        """The k*k*(C+1) class maps and k*k*4 box maps of a C5 map, stacked along channels."""
        hidden = torch.relu(self.reduce(feat))
        return torch.cat([self.ps_cls(hidden), self.ps_reg(hidden)], dim=1)

    def forward(self, pooled: Tensor) -> tuple[Tensor, Tensor]:
        """Vote: average each RoI's k*k position-sensitive bins, then split class scores and box deltas."""
        votes = pooled.mean(dim=(2, 3))
        return votes[:, : self.num_classes + 1], votes[:, self.num_classes + 1 :]


@MODELS.register_module()
class RFCNRoIHead(StandardRoIHead):
    """StandardRoIHead whose box branch pools position-sensitive maps made on the last feature map."""

    def _bbox_forward(self, x: tuple[Tensor, ...], rois: Tensor) -> dict:
        maps = self.bbox_head.score_maps(x[-1])
        cls_score, bbox_pred = self.bbox_head(self.bbox_roi_extractor((maps,), rois))
        return dict(cls_score=cls_score, bbox_pred=bbox_pred, bbox_feats=None)
