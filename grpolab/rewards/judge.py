"""The ``judge`` reward: AI feedback -- a language model scores each answer against a rubric (docs/judges.md).

    reward:
      weights: {judge: 1.0, correct: 0.0}           # correct at weight 0: logged beside it, never trained on
      judge: {model: bundled:smollm2-135m-instruct, rubric: configs/judge_rubric.txt, parse: yes_no}
      # or a served judge:  {endpoint: http://127.0.0.1:8000/v1, model: my-judge, rubric: ..., parse: tag}

**The judge** is a causal LM on the run's device (``model`` alone: grpolab.rewards.judge_local) or an OpenAI-compatible
endpoint (``endpoint`` + the served ``model`` name: grpolab.rewards.judge_http, with its time limit and retries).

**The rubric** is a text file. Its placeholders ``{question}`` (the problem's question), ``{answer}`` (pointwise) or
``{answers}`` (group: the group's answers, numbered ``Answer 1:`` ...) and the optional ``{reference}`` (the gold
answer) are filled in; every other brace is literal text, so a rubric may show JSON.

**Parse rules** (``parse``), each documented on the objective card:

- ``tag``: the number in the last ``<score>...</score>`` of the reply (group: exactly G tags, in answer order);
- ``json``: the last JSON object of the reply, its ``"score"`` (group: ``"scores"``, a list of G numbers);
- ``yes_no`` (local judge, pointwise): p_yes / (p_yes + p_no) of the next token (judge_local), no text generated; a
  reply whose yes + no probability is below ``min_yes_no_mass`` did not answer yes/no and is unparseable.

A tag or JSON score must lie in [min_score, max_score]; the reward is (score - min_score) / (max_score - min_score),
in [0, 1] (yes_no: the probability itself). **Modes**: ``pointwise`` judges each answer alone; ``group`` shows the
judge the G answers of one prompt together (consecutive completions of one problem) and takes G relative scores --
group-relative advantages only need those.

**Failures**: an unparseable reply, a score out of range, an HTTP error or a time-out makes only its sample (group
mode: its group) invalid, with the reason, never a silent 0; the extras ``judge/unparseable`` and ``judge/failed``
(0/1 per sample) count them per step (``reward/judge/unparseable``...), ``judge/cached`` the cache hits, and
``judge/score`` is the raw score. A local judge has no time limit (a forward pass cannot hang; abandoning a thread
that holds the model would leave it running); an endpoint's judgements have ``time_limit_s`` each.

**Cache**: judgements are stored in SQLite (``cache``: ``auto`` = the grpolab cache directory's ``judge.sqlite``,
``off``, or a file path), keyed by sha256 of (judge identity, rubric hash, parse rule and sampling settings, rendered
judge prompt -- which holds the question, reference and answer(s)). Only successful judgements are stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..errors import ConfigError
from .code import Scored
from .spec import RewardSpec

JUDGE_REWARD = "judge"
FIELD = "reward.judge"
PARSE_RULES = {
    "tag": "the number in the last <score>...</score> of the reply (group: exactly G tags, in answer order), "
    "in [min_score, max_score]; reward (score - min_score) / (max_score - min_score)",
    "json": 'the last JSON object of the reply: its "score" (group: "scores", a list of G numbers), in '
    "[min_score, max_score]; reward (score - min_score) / (max_score - min_score)",
    "yes_no": "p_yes / (p_yes + p_no) of the local judge's next token (yes/no spellings that are one token); "
    "unparseable when p_yes + p_no < min_yes_no_mass",
}
PLACEHOLDER = re.compile(r"\{(question|answer|answers|reference)\}")
TAG = re.compile(r"<score>\s*([-+]?\d+(?:\.\d+)?)\s*</score>", re.IGNORECASE)


class Unparseable(ValueError):
    """The judge replied, but not in the form the parse rule reads."""


def options_of(options: Any) -> dict[str, Any]:
    """A reward.judge section (dataclass or mapping) as a dict."""
    if options is None:
        return {}
    return dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options)


def read_rubric(path: str, mode: str) -> str:
    """The rubric template at `path`, checked for the placeholders `mode` needs; ConfigError naming the field."""
    if not path:
        raise ConfigError(f"{FIELD}.rubric: expected the path of a rubric file when reward.weights has `judge`")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{FIELD}.rubric: cannot read {path} ({type(e).__name__}: {e})") from None
    found = set(PLACEHOLDER.findall(text))
    needed = {"question", "answer"} if mode == "pointwise" else {"question", "answers"}
    wrong = "answers" if mode == "pointwise" else "answer"
    if not needed <= found or wrong in found:
        raise ConfigError(
            f"{FIELD}.rubric: {path} must contain {' and '.join('{' + n + '}' for n in sorted(needed))} "
            f"and not {{{wrong}}} for mode {mode}; it has {sorted(found) or 'no placeholders'}"
        )
    return text


def render(template: str, values: Mapping[str, str]) -> str:
    """The template with its placeholders filled; other braces stay as they are.

    >>> render('Q: {question} A: {answer} {"score": 1}', {"question": "1+1", "answer": "{2}"})
    'Q: 1+1 A: {2} {"score": 1}'
    """
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def numbered(answers: Sequence[str]) -> str:
    """The {answers} of group mode: ``Answer 1:\\n<text>`` blocks separated by blank lines."""
    return "\n\n".join(f"Answer {i}:\n{a}" for i, a in enumerate(answers, 1))


def parse_scores(reply: str, rule: str, group_size: int | None = None) -> list[float]:
    """The scores in a judge's reply by parse rule ``tag`` or ``json`` (module docstring): one (pointwise, group_size
    None) or group_size (group mode); Unparseable when they are not there.

    >>> parse_scores("fine. <score>7</score>", "tag")
    [7.0]
    >>> parse_scores('{"scores": [1, 9.5]}', "json", 2)
    [1.0, 9.5]
    """
    n = group_size or 1
    if rule == "tag":
        found = [float(x) for x in TAG.findall(reply)]
        if group_size is None and found:
            return found[-1:]
        if len(found) != n:
            raise Unparseable(f"expected {n} <score>N</score> tag(s), found {len(found)} in {reply[:80]!r}")
        return found
    obj = last_json_object(reply)
    value = obj.get("score" if group_size is None else "scores")
    scores = [value] if group_size is None else value
    if (
        not isinstance(scores, list)
        or len(scores) != n
        or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores)
    ):
        key = '"score" (a number)' if group_size is None else f'"scores" (a list of {n} numbers)'
        raise Unparseable(f"JSON without {key}: {json.dumps(obj)[:80]}")
    return [float(s) for s in scores]


def last_json_object(text: str) -> dict[str, Any]:
    """The last {...} of `text` that parses as a JSON object; Unparseable when there is none.

    >>> last_json_object('ok {"score": 3} and {"score": 4}')
    {'score': 4}
    """
    decoder = json.JSONDecoder()
    for start in reversed([m.start() for m in re.finditer(r"\{", text)]):
        try:
            obj, _ = decoder.raw_decode(text[start:])
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    raise Unparseable(f"no JSON object in {text[:80]!r}")


def to_reward(score: float, lo: float, hi: float) -> float:
    """(score - lo) / (hi - lo), a score on the rubric's scale as a reward in [0, 1]; out of range: Unparseable.

    >>> to_reward(7, 0, 10)
    0.7
    """
    if not (math.isfinite(score) and lo <= score <= hi):
        raise Unparseable(f"score {score:g} is outside [{lo:g}, {hi:g}]")
    return (score - lo) / (hi - lo)


class JudgeCache:
    """Judgements on disk (SQLite), keyed by sha256 of what determines them; thread-safe; ``path`` None = off. The
    file is opened at the first use."""

    def __init__(self, path: Path | None):
        self.path, self.lock, self.conn = path, threading.Lock(), None

    @staticmethod
    def key(*parts: Any) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def _open(self) -> sqlite3.Connection:
        if self.conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
            self.conn.execute("CREATE TABLE IF NOT EXISTS judgements (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self.conn.commit()
        return self.conn

    def get(self, key: str) -> Any:
        if self.path is None:
            return None
        with self.lock:
            row = self._open().execute("SELECT value FROM judgements WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, value: Any) -> None:
        if self.path is not None:
            with self.lock:
                self._open().execute("INSERT OR REPLACE INTO judgements VALUES (?, ?)", (key, json.dumps(value)))
                self.conn.commit()


def cache_path(setting: str) -> Path | None:
    """Where the cache lives for reward.judge.cache: auto (the grpolab cache directory), off, or a file path."""
    if setting == "off":
        return None
    if setting == "auto":
        from ..models.load import cache_dir

        return cache_dir() / "judge.sqlite"
    return Path(setting)


_IDENTITIES: dict[str, dict[str, Any]] = {}  # one probe per judge and process: the card and the reward share it


def check_options(o: Mapping[str, Any]) -> None:
    """What the config's types cannot say about reward.judge; ConfigError naming the field."""
    if not str(o.get("model") or "").strip():
        raise ConfigError(
            f"{FIELD}.model: expected the judge (a hub id, local directory or bundled: alias; with "
            f"{FIELD}.endpoint, the served model's name) when reward.weights has `judge`"
        )
    if o.get("parse") == "yes_no" and o.get("endpoint"):
        raise ConfigError(
            f"{FIELD}.parse: yes_no reads the judge's next-token probabilities, which needs a local "
            f"judge ({FIELD}.endpoint empty); use tag or json with an endpoint"
        )
    if o.get("parse") == "yes_no" and o.get("mode") == "group":
        raise ConfigError(f"{FIELD}.parse: yes_no gives one probability per prompt, so it needs mode pointwise")
    endpoint = str(o.get("endpoint") or "")
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(
            f"{FIELD}.endpoint: expected an http:// or https:// base URL (e.g. "
            f"http://127.0.0.1:8000/v1), got {endpoint!r}"
        )


class JudgeReward:
    """The batched reward ``(completions, problems) -> [Scored]`` of one judge (module docstring). ``local`` may be a
    ready judge_local.LocalJudge (tests plant tiny models)."""

    def __init__(self, options: Any, device: Any = None, local: Any = None):
        from .judge_http import endpoint_from
        from .judge_local import LocalJudge

        o = self.options = options_of(options)
        check_options(o)
        self.mode, self.rule = o["mode"], o["parse"]
        self.rubric = read_rubric(str(o["rubric"]), self.mode)
        self.rubric_sha256 = hashlib.sha256(self.rubric.encode()).hexdigest()
        self.lo, self.hi = float(o["min_score"]), float(o["max_score"])
        self.endpoint = endpoint_from(o) if o.get("endpoint") else None
        self.local = (
            None
            if self.endpoint
            else local or LocalJudge(str(o["model"]), device, o["dtype"], o["batch_size"], o["max_new_tokens"])
        )
        self.cache = JudgeCache(cache_path(str(o["cache"])))

    def identity(self) -> dict[str, Any]:
        """The judge's identity: a local judge's weights hash, or an endpoint's URL, model name and what it reports."""
        name = json.dumps([self.options.get("endpoint"), self.options["model"]])
        if name not in _IDENTITIES:
            _IDENTITIES[name] = (
                self.local.identity()
                if self.local is not None
                else {
                    "kind": "endpoint",
                    "base_url": self.endpoint.base_url,
                    "model": self.endpoint.model,
                    "reported": self.endpoint.reported_model(),
                }
            )
        return _IDENTITIES[name]

    def settings(self) -> dict[str, Any]:
        """The settings that change a judgement, besides the judge and the rubric (part of the cache key)."""
        o = self.options
        return {
            "parse": self.rule,
            "mode": self.mode,
            "min_score": self.lo,
            "max_score": self.hi,
            "temperature": o["temperature"],
            "max_new_tokens": o["max_new_tokens"],
            "min_yes_no_mass": o["min_yes_no_mass"],
        }

    def units(self, completions: Sequence[str], problems: Sequence[Any]) -> list[tuple[list[int], str]]:
        """(sample indices, rendered judge prompt) of each judgement: one per sample, or one per run of consecutive
        samples of one problem (group mode)."""
        runs: list[list[int]] = []
        for i, p in enumerate(problems):
            prev = problems[runs[-1][-1]] if runs else None
            if self.mode == "group" and prev is not None and (prev.uid, prev.question) == (p.uid, p.question):
                runs[-1].append(i)
            else:
                runs.append([i])
        out = []
        for idx in runs:
            p = problems[idx[0]]
            values = {"question": p.question, "reference": p.answer}
            if self.mode == "group":
                values["answers"] = numbered([completions[i] for i in idx])
            else:
                values["answer"] = completions[idx[0]]
            out.append((idx, render(self.rubric, values)))
        return out

    def _scores(self, prompts: Sequence[str], sizes: Sequence[int | None]) -> list[list[float] | Exception]:
        """Every prompt's raw scores (validated: parse rule, range), or the exception that says why there are none."""
        from .judge_http import JudgeCallError

        o = self.options
        if self.rule == "yes_no":
            out: list[list[float] | Exception] = []
            for p, mass in self.local.yes_probability(prompts):
                out.append(
                    [p]
                    if mass >= o["min_yes_no_mass"]
                    else Unparseable(
                        f"the judge put {mass:.3f} of its next-token probability on yes/no (< min_yes_no_mass "
                        f"{o['min_yes_no_mass']:g}): it did not answer yes or no"
                    )
                )
            return out

        def parsed(reply: str, size: int | None) -> list[float]:
            scores = parse_scores(reply, self.rule, size)
            for s in scores:
                to_reward(s, self.lo, self.hi)
            return scores

        if self.local is not None:
            return [_try(parsed, r, n) for r, n in zip(self.local.generate(prompts), sizes)]
        limit, retries = float(o["time_limit_s"]), int(o["retries"])
        workers = max(1, min(int(o["batch_size"]), len(prompts)))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpolab-judge")
        futures = [
            pool.submit(lambda p=p, n=n: parsed(self.endpoint.complete(p, limit, retries), n))
            for p, n in zip(prompts, sizes)
        ]
        rounds = math.ceil(len(prompts) / workers)
        wait(futures, timeout=limit * rounds + 2.0)  # a safety net: each judgement ends within `limit` on its own
        pool.shutdown(wait=False, cancel_futures=True)
        return [
            f.exception() or f.result() if f.done() else JudgeCallError(f"no judgement within {limit:g} s")
            for f in futures
        ]

    def __call__(self, completions: Sequence[str], problems: Sequence[Any]) -> list[Scored]:
        units = self.units(completions, problems)
        base = [self.identity(), self.rubric_sha256, self.settings()]
        keys = [JudgeCache.key(*base, prompt) for _, prompt in units]
        found = [self.cache.get(k) for k in keys]
        todo = [j for j, v in enumerate(found) if v is None]
        sizes = [len(units[j][0]) if self.mode == "group" else None for j in todo]
        fresh = dict(zip(todo, self._scores([units[j][1] for j in todo], sizes) if todo else []))
        out: list[Scored | None] = [None] * len(completions)
        for j, (idx, _) in enumerate(units):
            scores = found[j] if found[j] is not None else fresh[j]
            if not isinstance(scores, Exception):
                if found[j] is None:
                    self.cache.put(keys[j], scores)
                for i, s in zip(idx, scores):
                    value = s if self.rule == "yes_no" else to_reward(s, self.lo, self.hi)
                    out[i] = Scored(
                        value,
                        extras={
                            "judge/score": s,
                            "judge/cached": float(found[j] is not None),
                            "judge/unparseable": 0.0,
                            "judge/failed": 0.0,
                        },
                    )
                continue
            bad = isinstance(scores, Unparseable)
            extras = {"judge/cached": 0.0, "judge/unparseable": float(bad), "judge/failed": float(not bad)}
            why = f"{'unparseable' if bad else 'failed'}: {scores}"
            for i in idx:
                out[i] = Scored(None, extras=extras, error=why)
        return out  # type: ignore[return-value]


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # reported for its own sample
        return e


def judge_reward_spec(options: Any, device: Any = None) -> RewardSpec:
    """The RewardSpec of the `judge` reward for config section reward.judge (a dataclass or a mapping)."""
    reward = JudgeReward(options, device)
    where = reward.endpoint.base_url if reward.endpoint else "local"
    return RewardSpec(
        lambda completion, problem: reward([completion], [problem])[0],
        f"LLM judge {reward.options['model']} ({where}), {reward.mode}, parse {reward.rule}",
        time_limit_s=None,
        takes_problem=True,
        batch=reward,
    )


def judge_description(options: Any) -> dict[str, Any]:
    """What the objective card says of a run's judge, from the config alone (nothing is built, read or asked): the
    model and endpoint named, the rubric's path, the parse rule and mode, the scale and the call settings. The
    judge's identity and the rubric's sha256 are the manifest's (judge_record of the built reward)."""
    o = options_of(options)
    return {
        "model": o.get("model"),
        "endpoint": o.get("endpoint") or None,
        "rubric": o.get("rubric"),
        "parse": o.get("parse"),
        "parse_rule": PARSE_RULES.get(o.get("parse"), "unknown"),
        "mode": o.get("mode"),
        "scale": [float(o.get("min_score", 0.0)), float(o.get("max_score", 10.0))],
        "cache": o.get("cache"),
        **({"time_limit_s": o.get("time_limit_s"), "retries": o.get("retries")} if o.get("endpoint") else {}),
        "temperature": o.get("temperature"),
        "max_new_tokens": o.get("max_new_tokens"),
    }


def judge_record(reward: "JudgeReward") -> dict[str, Any]:
    """What the manifest records of the judge a run built: its identity (a local judge's weights hash, or an
    endpoint's URL, model name and what it reports) and the sha256 of the rubric it read."""
    return {"identity": reward.identity(), "rubric_sha256": reward.rubric_sha256}


def judge_card(cfg: Any) -> dict[str, Any]:
    """The objective card's ``judge`` entry (judge_description) when reward.weights names `judge`; nothing
    otherwise."""
    return {"judge": judge_description(cfg.reward.judge)} if JUDGE_REWARD in (cfg.reward.weights or {}) else {}
