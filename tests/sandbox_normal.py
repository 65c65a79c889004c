"""What the hostile-program modules check after their attacks: a batch of normal programs still scores exactly, and
no process of a sandbox uid is left."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from grpolab.rewards.code import CodeRunner
from grpolab.sandbox import SandboxLimits
from grpolab.tasks.code import code_problem

COLLECTED_AT = time.time()  # before this session's first test: older sandbox directories are another run's


def assert_normal_programs_score_exactly(limits: SandboxLimits) -> None:
    """16 programs of four kinds (right, wrong on one test of three, a syntax error, right another way) score
    1, 2/3, 0 and 1 with the reasons None, wrong_answer, syntax, None."""
    problems, completions, expected = [], [], []
    for i in range(16):
        problems.append(
            code_problem(
                f"normal/{i}", "q", "", ("assert g(3) == 9", "assert g(-2) == 4", "assert g(0) == 0"), entry_point="g"
            )
        )
        body = ("return x * x", "return abs(x) * 3", "return x +", "return max(x, -x) ** 2")[i % 4]
        completions.append(f"```python\ndef g(x):\n    {body}\n```")
        expected.append((1.0, 2 / 3, 0.0, 1.0)[i % 4])
    scores = CodeRunner(limits).scores(completions, problems, all_pass=False)
    assert [s.value for s in scores] == pytest.approx(expected)
    assert [s.reason for s in scores[:4]] == [None, "wrong_answer", "syntax", None]


def sandbox_processes(uids) -> list[int]:
    """Pids of every process any of whose uids (real, effective, saved, fs) is one of `uids`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = next(ln for ln in Path(f"/proc/{entry}/status").read_text().splitlines() if ln.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if any(int(u) in uids for u in uid.split()[1:]):
                pids.append(int(entry))
    return pids


def sandbox_workdirs(uids) -> dict[str, list[str]]:
    """The sandbox working directories of `uids` made since this session was collected, each with what it holds
    (one left by a run of an earlier session, killed before it could clean up, is not this session's)."""
    tmp, out = tempfile.gettempdir(), {}
    for name in os.listdir(tmp):
        path = os.path.join(tmp, name)
        try:
            st = os.stat(path)
            if name.startswith("grpolab-sbx-") and st.st_uid in uids and st.st_ctime >= COLLECTED_AT:
                out[name] = sorted(os.listdir(path))
        except OSError:  # removed meanwhile
            continue
    return out
