"""Ray Train's side of bench/ray.py: TorchTrainer, elastic ScalingConfig(num_workers=(2, 3)),
FailureConfig, the same model and step as ray_step.py, a checkpoint every CHECKPOINT_EVERY
steps to resume from after a failure. Run by the bench with RAY_ADDRESS set."""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ray_step import STEPS, model_and_optimizer, record, step  # noqa: E402

EVERY = int(os.environ.get("CHECKPOINT_EVERY", "5"))


def loop(config):
    os.environ.update(config)  # Ray's workers have the raylet's environment, not the driver's
    import ray.train
    import ray.train.torch
    model, optimizer = model_and_optimizer()
    model = ray.train.torch.prepare_model(model)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            saved = torch.load(os.path.join(folder, "state.pt"))
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start = saved["step"]
    context = ray.train.get_context()
    for n in range(start, STEPS):
        step(model, optimizer, n)
        if context.get_world_rank() == 0:
            record(n + 1, context.get_world_size())
        if (n + 1) % EVERY == 0:
            with tempfile.TemporaryDirectory() as folder:
                if context.get_world_rank() == 0:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "step": n + 1}, os.path.join(folder, "state.pt"))
                ray.train.report({"step": n + 1}, checkpoint=ray.train.Checkpoint.from_directory(folder)
                                 if context.get_world_rank() == 0 else None)


def main():
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    import ray_step
    ray.cloudpickle.register_pickle_by_value(ray_step)  # the nodes need not import it
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
    knobs = {k: os.environ[k] for k in ("STEP_LOG", "TOTAL_STEPS", "STEP_SLEEP") if k in os.environ}
    trainer = TorchTrainer(
        loop, train_loop_config=knobs, scaling_config=ScalingConfig(num_workers=(2, 3), use_gpu=False),
        run_config=RunConfig(storage_path=os.environ["STORAGE"], name="bench",
                             failure_config=FailureConfig(max_failures=-1)))
    trainer.fit()


if __name__ == "__main__":
    main()
