"""R-FCN ResNet-101 (tasks.rfcn), the model file the R-FCN configs start from, as MMDetection's
_base_/models files are for its detectors. Not a config to run alone: no data, schedule or runtime.

As R-FCN's paper: ResNet-101 without FPN, res5 dilated to stride 16, RPN on C4 with 3 scales x 3 ratios
of anchors, k = 7 position-sensitive score maps on C5 through a 1024-channel 1x1 reduction, OHEM with
128 RoIs per image, 300 test proposals, NMS at IoU 0.3. ImageNet-pretrained backbone from torchvision.
"""

model = dict(
    type="TwoStageDetector",
    data_preprocessor=dict(
        type="DetDataPreprocessor",
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=16,
    ),
    backbone=dict(
        type="ResNet",
        depth=101,
        num_stages=4,
        strides=(1, 2, 2, 1),
        dilations=(1, 1, 1, 2),
        out_indices=(2, 3),  # C4 for the RPN, the dilated C5 for the score maps
        frozen_stages=1,
        norm_cfg=dict(type="BN", requires_grad=True),
        norm_eval=True,
        style="pytorch",
        init_cfg=dict(type="Pretrained", checkpoint="torchvision://resnet101"),
    ),
    rpn_head=dict(
        type="SingleLevelRPNHead",
        level=0,
        in_channels=1024,
        feat_channels=512,
        anchor_generator=dict(
            type="AnchorGenerator", scales=[8, 16, 32], ratios=[0.5, 1.0, 2.0], strides=[16]
        ),
        bbox_coder=dict(type="DeltaXYWHBBoxCoder", target_means=[0.0] * 4, target_stds=[1.0] * 4),
        loss_cls=dict(type="CrossEntropyLoss", use_sigmoid=True, loss_weight=1.0),
        loss_bbox=dict(type="SmoothL1Loss", beta=1.0 / 9.0, loss_weight=1.0),
    ),
    roi_head=dict(
        type="RFCNRoIHead",
        bbox_roi_extractor=dict(
            type="PSRoIAlignExtractor", output_size=7, sampling_ratio=2, featmap_strides=[16]
        ),
        bbox_head=dict(
            type="RFCNBBoxHead",
            in_channels=2048,
            mid_channels=1024,
            roi_feat_size=7,
            num_classes=20,
            bbox_coder=dict(
                type="DeltaXYWHBBoxCoder", target_means=[0.0] * 4, target_stds=[0.1, 0.1, 0.2, 0.2]
            ),
            loss_cls=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0),
            loss_bbox=dict(type="SmoothL1Loss", beta=1.0, loss_weight=1.0),
        ),
    ),
    train_cfg=dict(
        rpn=dict(
            assigner=dict(
                type="MaxIoUAssigner",
                pos_iou_thr=0.7,
                neg_iou_thr=0.3,
                min_pos_iou=0.3,
                match_low_quality=True,
                ignore_iof_thr=-1,
            ),
            sampler=dict(
                type="RandomSampler", num=256, pos_fraction=0.5, neg_pos_ub=-1, add_gt_as_proposals=False
            ),
            allowed_border=0,
            pos_weight=-1,
            debug=False,
        ),
        rpn_proposal=dict(
            nms_pre=6000, max_per_img=2000, nms=dict(type="nms", iou_threshold=0.7), min_bbox_size=0
        ),
        rcnn=dict(
            assigner=dict(
                type="MaxIoUAssigner",
                pos_iou_thr=0.5,
                neg_iou_thr=0.5,
                min_pos_iou=0.5,
                match_low_quality=False,
                ignore_iof_thr=-1,
            ),
            sampler=dict(
                type="OHEMSampler", num=128, pos_fraction=0.25, neg_pos_ub=-1, add_gt_as_proposals=True
            ),
            pos_weight=-1,
            debug=False,
        ),
    ),
    test_cfg=dict(
        rpn=dict(nms_pre=6000, max_per_img=300, nms=dict(type="nms", iou_threshold=0.7), min_bbox_size=0),
        rcnn=dict(score_thr=0.05, nms=dict(type="nms", iou_threshold=0.3), max_per_img=100),
    ),
)
