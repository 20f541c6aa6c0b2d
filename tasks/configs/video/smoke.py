"""Video, profile "smoke": seconds, for tests and CI: the embedded recipe cut to 20 training clips (4
iterations of 8 over two epochs) and 20 validation clips."""

_base_ = ["./embedded.py"]

overrides = dict(epochs=2, batch_size=8, train_limit=20, val_limit=20, warmup=2, log_interval=1)
