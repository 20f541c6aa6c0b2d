"""Classification, profile "smoke": seconds per run, for tests and CI.

The embedded recipe cut to 30 training images (6 iterations of 8 over two epochs) and 40 validation
images, whatever the network.
"""

_base_ = ["./embedded.py"]

# The small sets made locally, so tests and CI never need the packaged real data.
datasets = dict(imagenet=dict(stand_in="digits"), cifar10=dict(stand_in="shapes10"))
overrides = dict(epochs=2, batch_size=8, train_limit=30, val_limit=40, warmup=2, log_interval=1)
