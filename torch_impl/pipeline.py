"""Pipeline parallel on the torch side: the ResNet cut into 2 stages (stem + layer1..2 | layer3..4 + classifier),
one per process under torchrun, run by torch.distributed.pipelining (PipelineStage + ScheduleGPipe over
micro-batches). jax_impl/pipeline.py mirrors it with shard_map + ppermute.

Every process builds the whole model from the same weights and trains its own stage (its optimizer sees
gradients on that stage's parameters only). The last stage computes the loss; the schedule scales the summed
micro-batch gradients by 1/micro-batches, so a step equals gradient accumulation over the same micro-batches
on the unsplit model (and, with GroupNorm, the whole batch). Evaluation and the saved weights need the whole
model: torch_impl/backend.py's ``gather`` sends the second stage's tensors to rank 0."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from common.config import PIPELINE_SPLIT_STAGE, RunConfig
from torch_impl.compilation import compile_options
from torch_impl.models import ResNet
from torch_impl.train import Optimizer, StepFn

STAGES = 2


def stage_modules(model: ResNet) -> list[nn.Sequential]:
    """The two halves of ``model``, sharing its modules (and so its parameters)."""
    layers = dict(model.stages())
    front = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool,
                          *(layer for stage, layer in layers.items() if stage < PIPELINE_SPLIT_STAGE))
    back = nn.Sequential(*(layer for stage, layer in layers.items() if stage >= PIPELINE_SPLIT_STAGE),
                         model.avgpool, nn.Flatten(1), model.fc)
    return [front, back]


def notes(config: RunConfig) -> list[str]:
    """What the result should say about this pipeline (jax_impl/pipeline.py's mirror). The process count is
    checked by parallel.start: devices x pipeline_stages processes."""
    return [f"pipeline: {STAGES} stages, GPipe over {config.pipeline_micro_batches} micro-batches "
            f"(torch.distributed.pipelining)"]


def make_train_step(config: RunConfig, model: ResNet, optimizer: Optimizer,
                    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> StepFn:
    """The trainer's step (images, labels, inject_inf) -> mean micro-batch loss, the same value on every rank, for
    this process's stage (its rank). The step's batch is the whole batch; the schedule cuts it into the pipeline's
    own micro-batches."""
    rank, device = dist.get_rank(), next(model.parameters()).device
    module = stage_modules(model)[rank]
    if config.compile == "compiled":
        module = torch.compile(module, **compile_options(config))
    # imported here, not with the module: torch.distributed.pipelining takes ~2 s to import, which every torch run
    # (the backend imports this module) paid before, pipelined or not
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stage = PipelineStage(module, rank, STAGES, device)
    schedule = ScheduleGPipe(stage, n_microbatches=config.pipeline_micro_batches, loss_fn=loss_fn, scale_grads=True)
    last = rank == STAGES - 1
    update, scheduler, _ = optimizer  # fp16 (GradScaler) is not built with the pipeline (common/config.py)

    def step(images: torch.Tensor, labels: torch.Tensor, inject_inf: bool = False) -> torch.Tensor:
        update.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        if last:
            schedule.step(target=labels, losses=losses)
        else:
            schedule.step(images)
        update.step()  # parameters without a gradient (the other stage's) are left alone
        scheduler.step()
        loss = torch.stack(losses).mean().detach() if last else torch.zeros((), dtype=images.dtype, device=device)
        dist.broadcast(loss, src=STAGES - 1)
        return loss

    return step
