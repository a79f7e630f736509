"""A 4-rank Hugging Face Trainer DDP job (gloo on CPU, run by torchrun) traced by
FailslowCallback: a tiny MLP with a Trainer-compatible forward, built in code (no
download); every rank sleeps ``JOB_PAD_S`` per step, rank ``JOB_SLOW_RANK`` sleeps
``JOB_SLOW_S`` more from step ``JOB_SLOW_FROM`` on. Traces go to ``JOB_TRACE_DIR``."""

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

from failslow.collectors.hf import FailslowCallback  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self, slow: bool, slow_from: int, slow_s: float, pad_s: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 64))
        self.slow, self.slow_from, self.slow_s, self.pad_s = slow, slow_from, slow_s, pad_s
        self.calls = 0

    def forward(self, x, labels=None):
        slow = self.slow and self.calls >= self.slow_from
        self.calls += 1
        time.sleep(self.pad_s + (self.slow_s if slow else 0.0))
        out = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randn(n, 64, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


def main() -> None:
    steps = int(os.environ.get("JOB_STEPS", "44"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net(rank == int(os.environ.get("JOB_SLOW_RANK", "-1")),
                int(os.environ.get("JOB_SLOW_FROM", "28")),
                float(os.environ.get("JOB_SLOW_S", "0.15")), float(os.environ.get("JOB_PAD_S", "0.05")))
    callback = FailslowCallback(os.environ["JOB_TRACE_DIR"], job_id="hf")
    args = TrainingArguments(output_dir=os.path.join(os.environ["JOB_TRACE_DIR"], "out"),
                             per_device_train_batch_size=32, max_steps=steps, use_cpu=True,
                             ddp_backend="gloo", report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                             learning_rate=0.01, ddp_find_unused_parameters=False)
    Trainer(model=model, args=args, train_dataset=Data(32 * steps * world, 0),
            callbacks=[callback]).train()


if __name__ == "__main__":
    main()
