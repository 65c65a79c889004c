"""train.keep_freed_memory (grpolab/training/cpu_memory.py): the three mallopt settings, checked on a fake C library
(the values, independent of the machine's libc); what happens where there is no glibc or a setting is refused; and
that the trainer applies it only on a CPU and only when asked. (Other tests build real CPU trainers, so the test
process itself runs with the settings applied.)"""

from __future__ import annotations

import logging

import pytest

from grpolab.training import cpu_memory


class FakeLibc:
    def __init__(self, refuse: tuple[int, ...] = ()):
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 0 if param in self.refuse else 1


def test_the_three_settings_reach_mallopt():
    libc = FakeLibc()
    assert cpu_memory.keep_freed_memory(libc) is True
    # glibc's malloc.h: M_MMAP_MAX = -4, M_TRIM_THRESHOLD = -1, M_TOP_PAD = -2
    assert sorted(libc.calls) == sorted([(-4, 0), (-1, 1 << 30), (-2, 256 << 20)])


def test_a_refused_setting_is_reported_by_name(caplog):
    libc = FakeLibc(refuse=(-1,))
    with caplog.at_level(logging.WARNING, logger="grpolab.training.cpu_memory"):
        assert cpu_memory.keep_freed_memory(libc) is False
    assert "M_TRIM_THRESHOLD" in caplog.text and "M_MMAP_MAX" not in caplog.text


def test_without_glibc_the_run_says_so_and_goes_on(monkeypatch, caplog):
    monkeypatch.setattr(cpu_memory.platform, "system", lambda: "Darwin")
    assert cpu_memory.glibc() is None
    with caplog.at_level(logging.INFO, logger="grpolab.training.cpu_memory"):
        assert cpu_memory.keep_freed_memory() is False
    assert "not a glibc system (Darwin)" in caplog.text


@pytest.mark.parametrize("keep", [True, False])
def test_the_trainer_applies_it_on_a_cpu_when_asked(monkeypatch, tmp_path, tiny_model_dir, keep):
    from grpolab.config import from_dict
    from grpolab.training import trainer as trainer_module

    seen = []
    monkeypatch.setattr(trainer_module, "keep_freed_memory", lambda: seen.append(True))
    raw = {
        "model": {"name": tiny_model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 8, "num_test": 4}},
        "rollout": {"group_size": 2, "max_new_tokens": 4, "dtype": "float32"},
        "train": {"steps": 1, "prompts_per_step": 2, "precision": "fp32", "device": "cpu", "keep_freed_memory": keep},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(tmp_path), "name": "t"},
    }
    trainer_module.Trainer(from_dict(raw), tmp_path)
    assert seen == ([True] if keep else [])
