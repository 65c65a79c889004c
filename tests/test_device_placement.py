"""Device placement: every tensor operation of a training step (rollout, reward, old/reference passes, update,
optimizer step, sampler sync) runs on train.device.

A TorchDispatchMode sees every aten operation with its tensor arguments. An operation mixing devices, or computing on
a device other than train.device, is a placement bug (on CUDA: a tensor forgotten on the host, which either crashes
or silently moves data every step). Allowed: explicit copies (``.to`` / ``.cpu()`` / ``copy_``) and host-side
bookkeeping that never touches the model -- per-completion rewards and their statistics live on the CPU by design.
On a machine without CUDA only the explicit ``device=cpu`` case runs.
"""

from __future__ import annotations

import earnable
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from grpolab.config import from_dict
from grpolab.training.trainer import Trainer

COPIES = {"aten._to_copy.default", "aten.copy_.default", "aten._local_scalar_dense.default", "aten.lift_fresh.default"}


class DeviceLog(TorchDispatchMode):
    """Records, per aten operation, the set of devices of its (non-scalar) tensor arguments and results."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, frozenset[str]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor) and t.dim() > 0]
        self.ops.append((str(func), frozenset(t.device.type for t in tensors)))
        return out


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", devices())
def test_every_operation_of_a_step_runs_on_the_train_device(tiny_model_dir, tmp_path, device):
    cfg = from_dict(
        {
            "model": {"name": tiny_model_dir},
            "task": {"name": "arithmetic", "options": {"num_train": 20, "num_test": 4}},
            "reward": earnable.reward_config(),
            "rollout": earnable.rollout_config(group_size=4),
            "algorithm": {"preset": "grpo", "beta": 0.04},  # a reference model too
            "train": {
                "steps": 1,
                "prompts_per_step": 2,
                "micro_batch_size": 4,
                "device": device,
                "save_every_minutes": 0,
            },
            "eval": {"every_steps": 0},
            "run": {"output_dir": str(tmp_path), "name": "placement"},
        }
    )
    (tmp_path / "placement").mkdir()
    trainer = Trainer(cfg, tmp_path / "placement")
    models = {"policy": trainer.policy, "reference": trainer.reference}
    for name, model in models.items():
        if model is not None:
            assert {p.device.type for p in model.parameters()} == {device}, name
    log = DeviceLog()
    with log:
        trainer.fit()
    assert trainer.step == 1
    model_ops = [(op, devs) for op, devs in log.ops if op not in COPIES and device in devs]
    mixed = sorted({op for op, devs in log.ops if op not in COPIES and len(devs) > 1})
    assert model_ops, "no operation ran on the train device"
    assert mixed == [], f"operations mixing devices: {mixed}"
    if device != "cpu":
        # what ran on the host is bookkeeping on rewards and advantages, never a matrix product of the model
        host = {op for op, devs in log.ops if devs == {"cpu"}}
        assert not host & {"aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.linear.default"}, host
    optimizer_state = [t for s in trainer.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert optimizer_state and {t.device.type for t in optimizer_state if t.dim() > 0} == {device}
