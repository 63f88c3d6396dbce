"""DDP under Ray Train, as Ray's "Get Started with PyTorch" writes it: a
TorchTrainer with ScalingConfig(num_workers=2, use_gpu=False) runs train_func
in two Ray workers; ray.train.torch.prepare_model wraps the model in DDP (Gloo
on CPU workers). What ddpwatch sees of such a rank: the process title
"ray::RayTrainWorker" (not python), no RANK or MASTER_* in the exec-time
environment (Ray sets them with os.environ), training in a thread of its own
("TrainingThread") while the main thread idles in Ray's event loop, and a dozen
Ray processes beside the two ranks (raylet, GCS, agents, idle workers).

    python ray_ddp.py TMPDIR

TMPDIR holds Ray's session files and the run's results (ray.init's _temp_dir
must be short: Ray's socket paths are bounded). No dashboard; the faults of
faults.py (DDPWATCH_TEST_FAULT, DDPWATCH_TEST_STEPS) reach the workers through
Ray's runtime environment.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import STEPS, announce, maybe_hang  # noqa: E402

FORWARD = ("DDPWATCH_TEST_FAULT", "DDPWATCH_TEST_STEPS", "OMP_NUM_THREADS", "DDPWATCH_AUTO",
           "DDPWATCH_DIR", "PYTHONPATH")


def train_func(config):
    import torch
    import torch.nn as nn
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    model = ray.train.torch.prepare_model(
        nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)))
    announce(rank, ctx.get_local_rank(), ctx.get_world_size())
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    torch.manual_seed(rank)
    step = 0
    while STEPS <= 0 or step < STEPS:
        maybe_hang(rank, step)
        optimizer.zero_grad()
        loss_fn(model(torch.randn(8, 10)), torch.randn(8, 5)).backward()
        optimizer.step()
        step += 1


def main(tmp: str) -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    env = {k: os.environ[k] for k in FORWARD if k in os.environ}
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=os.path.join(tmp, "r"),
             runtime_env={"env_vars": env}, log_to_driver=True)
    trainer = TorchTrainer(train_func,
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(storage_path=os.path.join(tmp, "results"),
                                                name="ray_ddp"))
    trainer.fit()


if __name__ == "__main__":
    main(sys.argv[1])
