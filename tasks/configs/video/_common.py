"""Video recipe entries every profile shares (tasks.recipes explains the layout).

SGD with momentum 0.9 and weight decay 1e-3 (Hara et al. 2018); DAIQ uses multistep schedules, so
x0.1 at 1/2 and 3/4 of the run (Hara et al. divide when the validation loss plateaus).
"""

momentum = 0.9
weight_decay = 1e-3
scheduler = "multistep"
milestones = (0.5, 0.75)
val_interval = None  # validate once, after the last epoch
augment = False
train_limit = None
val_limit = None
num_workers = 0
warmup = 3  # iterations left out of ms_per_iter
log_interval = 10
