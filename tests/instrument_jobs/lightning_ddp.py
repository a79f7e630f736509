"""A 4-rank Lightning DDP job (gloo on CPU, run by torchrun) traced by FailslowCallback:
a tiny MLP; every rank sleeps ``JOB_PAD_S`` per batch, rank ``JOB_SLOW_RANK`` sleeps
``JOB_SLOW_S`` more from batch ``JOB_SLOW_FROM`` on. Traces go to ``JOB_TRACE_DIR``."""

import os
import time

import lightning as L
import torch

from failslow.collectors.lightning import FailslowCallback


class Net(L.LightningModule):
    def __init__(self, slow_rank: int, slow_from: int, slow_s: float, pad_s: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 64))
        self.slow_rank, self.slow_from, self.slow_s, self.pad_s = slow_rank, slow_from, slow_s, pad_s

    def training_step(self, batch, batch_idx):
        slow = self.global_rank == self.slow_rank and batch_idx >= self.slow_from
        time.sleep(self.pad_s + (self.slow_s if slow else 0.0))
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    steps = int(os.environ.get("JOB_STEPS", "44"))
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(int(os.environ.get("RANK", "0")))
    data = torch.utils.data.TensorDataset(torch.randn(32 * steps, 64, generator=g),
                                          torch.randn(32 * steps, 64, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    model = Net(int(os.environ.get("JOB_SLOW_RANK", "-1")), int(os.environ.get("JOB_SLOW_FROM", "28")),
                float(os.environ.get("JOB_SLOW_S", "0.15")), float(os.environ.get("JOB_PAD_S", "0.05")))
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]), strategy="ddp",
                        max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False,
                        callbacks=[FailslowCallback(os.environ["JOB_TRACE_DIR"], job_id="lightning")])
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
