"""The footnote every UI8 detection row carries: what UI8 does to a detector at the embedded scale, and why
its layers keep one method state across the calls of a step (measured; the runs are in the README)."""

UI8_DETECTION = (
    "UI8 on detection at the embedded scale (one seed each): direction-sensitive clipping picks, on "
    "RetinaNet's focal-loss gradient (a few large entries from positive anchors among many tiny ones from "
    "negatives), a clip value near 2^-10 of max|G|, where the cosine distance is lowest; the positives' "
    "gradient is clipped about a thousandfold and the classifier never learns (loss_cls stays at 1.11, mAP "
    "0.0). The same run with clip=False reaches mAP 9.1. One method state per call of a shared head conv "
    "(quantize_model(per_call_state=True): one clip value per FPN level) did not help (RetinaNet 0.0 either "
    "way; Faster R-CNN 15.1 with it, 26.7 without), nor did it change DAIQ beyond one seed's noise "
    "(one MCS state per call: RetinaNet 12.5 against 12.3, Faster R-CNN 52.8 against 54.1), so each layer "
    "keeps one state."
)
