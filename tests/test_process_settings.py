"""Process-wide settings held for a run and put back after it (grpolab/training/process_settings.py): torch's
deterministic algorithms and NaN fill; the mallopt values are covered in tests/test_cpu_memory.py.

Before the fix a deterministic Trainer switched deterministic algorithms on for the rest of the process: a later
`deterministic: false` trainer ran deterministic while its manifest said it did not."""

from __future__ import annotations

import pytest
import torch

from grpolab.config import from_dict
from grpolab.training.process_settings import ProcessSettings
from grpolab.training.reproducibility import deterministic_state, set_deterministic_state

PROCESS_DEFAULT = (False, False, True)  # torch's own: off, not warn-only, NaN fill on


@pytest.fixture(autouse=True)
def torch_defaults():
    """Every test starts from torch's defaults and leaves them, whatever it does."""
    before = deterministic_state()
    set_deterministic_state(PROCESS_DEFAULT)
    yield
    set_deterministic_state(before)


def tiny(model_dir: str, tmp_path, name: str, deterministic: bool) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 8, "num_test": 4}},
        "rollout": {"group_size": 2, "max_new_tokens": 3, "dtype": "float32"},
        "train": {
            "steps": 1,
            "prompts_per_step": 2,
            "micro_batch_size": 4,
            "precision": "fp32",
            "device": "cpu",
            "deterministic": deterministic,
            "save_every_minutes": 0,
        },
        "speed": {"keep_freed_memory": False},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(tmp_path), "name": name},
    }


def trainer_of(raw: dict, tmp_path):
    from grpolab.training.trainer import Trainer

    (tmp_path / raw["run"]["name"]).mkdir()  # what grpolab.runs.start_run creates
    return Trainer(from_dict(raw), tmp_path / raw["run"]["name"])


def test_a_deterministic_run_puts_the_settings_back_and_a_later_one_is_not_deterministic(
    tiny_model_dir, tmp_path, one_thread
):
    during = []
    first = trainer_of(tiny(tiny_model_dir, tmp_path, "a", True), tmp_path)
    first.fit(lambda step, m: during.append(deterministic_state()))
    assert during == [(True, True, False)]  # the run itself: deterministic, warn only, no NaN fill
    assert deterministic_state() == PROCESS_DEFAULT  # back after fit
    second = trainer_of(tiny(tiny_model_dir, tmp_path, "b", False), tmp_path)
    second.fit(lambda step, m: during.append(deterministic_state()))
    assert during[1] == PROCESS_DEFAULT  # was (True, True, False): the first run's settings leaked into it
    first.fit()  # a second fit applies them again and puts them back (nothing left to train)
    assert deterministic_state() == PROCESS_DEFAULT


def test_close_and_with_put_them_back_without_fit(tiny_model_dir, tmp_path, one_thread):
    trainer = trainer_of(tiny(tiny_model_dir, tmp_path, "a", True), tmp_path)
    assert deterministic_state() == (True, True, False)
    trainer.close()
    trainer.close()  # idempotent
    assert deterministic_state() == PROCESS_DEFAULT
    with trainer_of(tiny(tiny_model_dir, tmp_path, "b", True), tmp_path):
        assert torch.are_deterministic_algorithms_enabled()
    assert deterministic_state() == PROCESS_DEFAULT


def test_a_trainer_that_fails_to_build_leaves_them_as_it_found_them(tmp_path):
    from grpolab.errors import GrpolabError
    from grpolab.training.trainer import Trainer

    raw = tiny(str(tmp_path / "no-such-model"), tmp_path, "a", True)
    with pytest.raises((GrpolabError, OSError)):
        Trainer(from_dict(raw), tmp_path / "a")
    assert deterministic_state() == PROCESS_DEFAULT


def test_each_run_computes_as_its_config_says_and_puts_back_what_it_found():
    """A run that is not deterministic turns deterministic algorithms off for itself even when the process (the user,
    or a deterministic trainer still alive) has them on; each puts back what it found, so closing in the reverse
    order of construction ends where the process started, the user's own setting included."""
    users = (True, False, True)  # the user's choice before any run: on, raising, with the NaN fill
    set_deterministic_state(users)
    a, c = ProcessSettings(True, False), ProcessSettings(False, False)
    a.apply()
    assert deterministic_state() == (True, True, False)
    c.apply()
    assert deterministic_state() == (False, False, True)  # c's run: not deterministic, as its manifest says
    c.restore()
    c.restore()  # once only
    assert deterministic_state() == (True, True, False)  # what c found: a's run
    a.apply()  # a's fit after c changed things: a's values again, and a still restores what it first found
    a.restore()
    assert deterministic_state() == users
    with ProcessSettings(True, False):
        assert deterministic_state() == (True, True, False)
    assert deterministic_state() == users
