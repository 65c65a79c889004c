"""The Trainer's progress hook (grpolab/training/trainer.py, ``progress``): one line before each phase that can take
over ~20 s -- the model load, the sampler's copy, the first step's sampling and update, each held-out eval and
checkpoint write, a checkpoint's restore -- and nothing per token or per later step. Before it, 40-100 s passed
before the first step line with nothing said."""

from __future__ import annotations

from grpolab.config import from_dict


def tiny(model_dir: str, tmp_path, beta: float = 0.0) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 8, "num_test": 4}},
        "rollout": {"group_size": 2, "max_new_tokens": 3, "dtype": "float32"},
        "algorithm": {"beta": beta},
        "train": {
            "steps": 2,
            "prompts_per_step": 2,
            "micro_batch_size": 4,
            "precision": "fp32",
            "device": "cpu",
            "save_every": 1,
            "save_every_minutes": 0,
        },
        "eval": {"every_steps": 2, "num_problems": 3},
        "run": {"output_dir": str(tmp_path), "name": "p"},
    }


def test_a_run_tells_each_long_phase_once(tiny_model_dir, tmp_path, one_thread):
    from grpolab.training.trainer import Trainer

    told: list[str] = []
    (tmp_path / "p").mkdir()
    trainer = Trainer(from_dict(tiny(tiny_model_dir, tmp_path, beta=0.1)), tmp_path / "p", progress=told.append)
    assert told == [
        f"loading the model {tiny_model_dir}",
        "making the reference model (algorithm.beta > 0)",
        "preparing the sampler's copy of the model",
    ]
    told.clear()
    trainer.fit(lambda step, m: told.append(f"<step line {step}>"))
    assert told == [
        "step 1/2: sampling 2 prompts x 2 completions",
        "step 1/2: updating the policy",
        "<step line 1>",
        "step 1/2: writing checkpoint step-1",
        "step 2/2: held-out eval on 3 problems",
        "<step line 2>",
        "step 2/2: writing checkpoint step-2",
    ]

    told.clear()
    resumed = Trainer(
        from_dict(dict(tiny(tiny_model_dir, tmp_path), train={**tiny(tiny_model_dir, tmp_path)["train"], "steps": 3})),
        tmp_path / "p",
    )
    resumed.progress = told.append  # may be set after construction
    resumed.resume()
    resumed.fit()
    assert told[:3] == [
        f"restoring {tmp_path / 'p' / 'checkpoints' / 'step-2'}",
        "step 3/3: sampling 2 prompts x 2 completions",
        "step 3/3: updating the policy",
    ]


def test_without_a_hook_nothing_is_called_and_nothing_breaks(tiny_model_dir, tmp_path, one_thread):
    from grpolab.training.trainer import Trainer

    (tmp_path / "p").mkdir()
    raw = tiny(tiny_model_dir, tmp_path)
    raw["train"]["steps"] = 1
    with Trainer(from_dict(raw), tmp_path / "p") as trainer:
        assert trainer.progress is None
        trainer.fit()
        assert trainer.step == 1
