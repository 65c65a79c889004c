"""The `judge` reward against a scripted OpenAI-compatible server on 127.0.0.1 (no outside network): scoring, group
mode, malformed replies, 429 / 500 with recovery, a hanging endpoint, the cache, batched == one by one, and a local
judge's yes/no probabilities on the tiny model."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from grpolab.config import from_dict
from grpolab.errors import ConfigError, GrpolabError
from grpolab.rewards import RewardSet
from grpolab.rewards.judge import JudgeReward, judge_record, parse_scores
from grpolab.tasks.base import Problem

POINTWISE = "Q: {question}\nReference: {reference}\nAnswer: {answer}\nReply <score>N</score>, N in 0..10."
GROUP = "Q: {question}\nReference: {reference}\n{answers}\nReply one <score>N</score> per answer, in order."


class Server:
    """A scripted chat-completions endpoint: ``reply(prompt, attempt)`` -> (status, body text, headers); every
    request to /chat/completions is counted."""

    def __init__(self, reply):
        self.reply, self.requests, self.lock = reply, [], threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = json.dumps(
                    {
                        "data": [
                            {
                                "id": "scripted",
                                "object": "model",
                                "created": time.time(),
                                "owned_by": "test",
                                "version": "v1",
                            }
                        ]
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = data["messages"][0]["content"]
                with outer.lock:
                    outer.requests.append(prompt)
                    attempt = sum(p == prompt for p in outer.requests)
                status, text, headers = outer.reply(prompt, attempt)
                body = (
                    json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})
                    if status == 200 and text is not None
                    else (text or "")
                ).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None  # a client that gave up (the hanging test)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(reply):
        servers.append(Server(reply))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def ok(text):
    return 200, text, {}


def answer_of(prompt):
    return prompt.split("Answer: ")[1].split("\n")[0]


def digit_judge(prompt, attempt):
    """Scores an answer by its last digit: 'x7' -> <score>7</score> (a judge whose scores we can compute by hand)."""
    return ok(f"Looks fine. <score>{answer_of(prompt)[-1]}</score>")


def judge(tmp_path, server, rubric=POINTWISE, **over):
    path = tmp_path / "rubric.txt"
    path.write_text(rubric)
    opts = {
        "model": "scripted",
        "endpoint": server.url,
        "rubric": str(path),
        "parse": "tag",
        "mode": "pointwise",
        "min_score": 0.0,
        "max_score": 10.0,
        "min_yes_no_mass": 0.5,
        "temperature": 0.0,
        "max_new_tokens": 64,
        "dtype": "float32",
        "batch_size": 4,
        "time_limit_s": 5.0,
        "retries": 3,
        "cache": str(tmp_path / "cache.sqlite"),
        "api_key_env": "",
    }
    return JudgeReward({**opts, **over})


P = Problem(uid="a/1", question="3+4", answer="7")
Q = Problem(uid="a/2", question="9-5", answer="4")


def test_pointwise_scores_are_the_rubric_scale_mapped_to_0_1_and_batched_equals_one_by_one(tmp_path, serve):
    server = serve(digit_judge)
    answers = ["a3", "b7", "c0", "d10", "e5"]
    batched = judge(tmp_path, server, cache="off")([*answers], [P] * 5)
    assert [s.value for s in batched] == [0.3, 0.7, 0.0, 0.0, 0.5]  # "d10": last digit 0
    assert [s.extras["judge/score"] for s in batched] == [3.0, 7.0, 0.0, 0.0, 5.0]
    single = judge(tmp_path, server, cache="off", batch_size=1)
    assert [single([a], [P])[0].value for a in answers] == [s.value for s in batched]
    assert "Reference: 7" in server.requests[0] and "Q: 3+4" in server.requests[0]


def test_group_mode_one_call_per_prompt_group_scores_in_answer_order(tmp_path, serve):
    def grouped(prompt, attempt):
        n = len(re.findall(r"^Answer \d+:", prompt, re.M))
        return ok(" ".join(f"<score>{2 * i}</score>" for i in range(n)))

    server = serve(grouped)
    out = judge(tmp_path, server, rubric=GROUP, mode="group", cache="off")(["x", "y", "z", "u", "v"], [P, P, P, Q, Q])
    assert [s.value for s in out] == [0.0, 0.2, 0.4, 0.0, 0.2]
    first, second = sorted(server.requests, key=lambda p: "Q: 9-5" in p)  # sent concurrently: any order
    assert len(server.requests) == 2 and "Answer 3:\nz" in first and "Q: 9-5" in second and "Answer 3" not in second


def test_group_mode_with_the_wrong_number_of_scores_invalidates_that_group_only(tmp_path, serve):
    server = serve(
        lambda prompt, a: ok("<score>5</score>") if "3+4" in prompt else ok("<score>1</score><score>2</score>")
    )
    out = judge(tmp_path, server, rubric=GROUP, mode="group", cache="off")(["x", "y", "u", "v"], [P, P, Q, Q])
    assert [s.value for s in out[:2]] == [None, None] and "expected 2 <score>N</score> tag(s), found 1" in out[0].error
    assert [s.value for s in out[2:]] == [0.1, 0.2]


def test_malformed_json_and_wrong_format_make_only_their_sample_invalid_with_the_reason(tmp_path, serve):
    replies = {
        "good": '{"score": 8}',
        "broken": '{"score": 8',
        "noscore": '{"verdict": "fine"}',
        "prose": "I would give it an eight.",
        "range": '{"score": 11}',
    }
    server = serve(lambda prompt, a: ok(replies[answer_of(prompt)]))
    rs = RewardSet({"judge": 1.0}, judge=judge(tmp_path, server, parse="json", cache="off").options)
    results = rs.score_many(list(replies), [P] * 5)
    assert results[0].total == pytest.approx(0.8) and not results[0].invalid
    for r, why in zip(results[1:], ["no JSON object", 'JSON without "score"', "no JSON object", "outside [0, 10]"]):
        assert r.invalid and why in r.error and "judge: ValueError: unparseable" in r.error, r.error
    assert [r.extras["judge/unparseable"] for r in results] == [0.0, 1.0, 1.0, 1.0, 1.0]


def test_429_with_retry_after_and_500_are_retried_until_they_recover(tmp_path, serve):
    def flaky(prompt, attempt):
        if "b7" in prompt and attempt == 1:
            return 429, "slow down", {"Retry-After": "1"}
        if "c2" in prompt and attempt <= 2:
            return 500, "oops", {}
        return digit_judge(prompt, attempt)

    server = serve(flaky)
    t0 = time.monotonic()
    out = judge(tmp_path, server, cache="off")(["a3", "b7", "c2"], [P] * 3)
    assert [s.value for s in out] == [0.3, 0.7, 0.2]
    assert time.monotonic() - t0 >= 1.0  # the Retry-After second was waited
    assert sum("b7" in p for p in server.requests) == 2 and sum("c2" in p for p in server.requests) == 3


def test_errors_past_the_retries_or_a_retry_after_past_the_limit_fail_that_sample(tmp_path, serve):
    def broken(prompt, attempt):
        if "b7" in prompt:
            return 429, "busy", {"Retry-After": "60"}
        if "c2" in prompt:
            return 503, "down", {}
        if "d1" in prompt:
            return 401, "bad key", {}
        return digit_judge(prompt, attempt)

    server = serve(broken)
    out = judge(tmp_path, server, cache="off", retries=1)(["a3", "b7", "c2", "d1"], [P] * 4)
    assert out[0].value == 0.3
    assert "would pass the time limit" in out[1].error and out[1].extras["judge/failed"] == 1.0
    assert "HTTP 503" in out[2].error and "2 attempt(s)" in out[2].error
    assert "HTTP 401" in out[3].error and "1 attempt(s)" in out[3].error  # not retried


def test_a_hanging_endpoint_ends_within_the_time_limit_and_the_other_samples_are_scored(tmp_path, serve):
    release = threading.Event()

    def hangs(prompt, attempt):
        if "b7" in prompt:
            release.wait(30)
        return digit_judge(prompt, attempt)

    server = serve(hangs)
    t0 = time.monotonic()
    out = judge(tmp_path, server, cache="off", time_limit_s=1.0)(["a3", "b7", "c5"], [P] * 3)
    elapsed = time.monotonic() - t0
    release.set()
    assert elapsed < 3.5, elapsed
    assert out[0].value == 0.3 and out[2].value == 0.5
    assert out[1].value is None and "time limit of 1 s" in out[1].error


def test_the_cache_answers_a_repeated_judgement_without_a_call_and_a_changed_rubric_misses(tmp_path, serve):
    server = serve(digit_judge)
    first = judge(tmp_path, server)(["a3", "b7"], [P, P])
    again = judge(tmp_path, server)(["a3", "b7", "c5"], [P, P, P])  # a new judge object: read from disk
    assert [s.value for s in again] == [0.3, 0.7, 0.5] and [s.value for s in first] == [0.3, 0.7]
    assert [s.extras["judge/cached"] for s in again] == [1.0, 1.0, 0.0]
    assert len(server.requests) == 3  # a3, b7 once each, then c5
    judge(tmp_path, server, rubric=POINTWISE + " Be strict.")(["a3"], [P])
    assert len(server.requests) == 4
    failed = serve(lambda prompt, a: ok("no score"))
    for _ in range(2):  # a failure is not cached: asked again
        assert judge(tmp_path, failed, cache=str(tmp_path / "c2.sqlite"))(["a3"], [P])[0].value is None
    assert len(failed.requests) == 2


def test_record_names_the_endpoint_and_rubric_hash_and_a_changed_rubric_changes_it(tmp_path, serve):
    server = serve(digit_judge)
    a = judge_record(judge(tmp_path, server))
    assert a["identity"] == {
        "kind": "endpoint",
        "base_url": server.url,
        "model": "scripted",
        "reported": {"id": "scripted", "owned_by": "test", "version": "v1"},
    }
    b = judge_record(judge(tmp_path, server, rubric=POINTWISE + " Be strict."))
    assert a["rubric_sha256"] != b["rubric_sha256"]


def test_describing_the_judge_builds_nothing(tmp_path, monkeypatch):
    """The objective card is derived from the config alone: no judge is built, no endpoint asked, no rubric read."""
    from grpolab.card import objective_card
    from grpolab.rewards import judge as judge_module

    def refuse(*args, **kwargs):
        raise AssertionError("the card built the judge")

    monkeypatch.setattr(judge_module.JudgeReward, "__init__", refuse)
    options = {"endpoint": "http://127.0.0.1:9/v1", "model": "m", "rubric": str(tmp_path / "absent.txt")}
    cfg = from_dict({"reward": {"weights": {"judge": 1.0}, "judge": options}})
    card = objective_card(cfg)["judge"]
    assert card["rubric"] == str(tmp_path / "absent.txt") and card["endpoint"] == "http://127.0.0.1:9/v1"
    assert card["parse"] == "tag" and "<score>" in card["parse_rule"] and card["scale"] == [0.0, 10.0]


def test_config_errors_name_the_field(tmp_path, serve):
    server = serve(digit_judge)
    with pytest.raises(ConfigError, match=r"reward.judge.parse: yes_no .* local"):
        judge(tmp_path, server, parse="yes_no")
    with pytest.raises(ConfigError, match=r"reward.judge.rubric: .* must contain \{answers\}"):
        judge(tmp_path, server, mode="group")  # a pointwise rubric in group mode
    with pytest.raises(ConfigError, match=r"reward.judge.rubric: cannot read"):
        JudgeReward({**judge(tmp_path, server).options, "rubric": str(tmp_path / "missing.txt")})
    with pytest.raises(ConfigError, match=r"reward.judge.max_score: expected > reward.judge.min_score"):
        from_dict({"reward": {"judge": {"min_score": 5, "max_score": 5}}})
    with pytest.raises(ConfigError, match=r"reward.judge.retries"):
        from_dict({"reward": {"judge": {"retries": -1}}})
    with pytest.raises(ConfigError, match=r"reward.judge.model: expected the judge"):
        RewardSet({"judge": 1.0}, judge=from_dict({}).reward.judge)


def test_parse_rules_by_hand():
    assert parse_scores("<score>2</score> then <SCORE> 9 </score>", "tag") == [9.0]
    assert parse_scores('x {"a": 1} y {"score": 3.5}', "json") == [3.5]
    assert parse_scores('{"scores": [1, 2, 3]}', "json", 3) == [1.0, 2.0, 3.0]


def test_local_judge_yes_no_probability_batched_equals_one_by_one(tmp_path, tiny_model_dir, one_thread):
    import torch

    from grpolab.rewards.judge_local import NO, YES, LocalJudge, single_token_ids

    rubric = tmp_path / "r.txt"
    rubric.write_text("Q: {question}\nReference: {reference}\nAnswer: {answer}\nCorrect? Yes or No.")
    local = LocalJudge(tiny_model_dir, "cpu", "float32", batch_size=3)
    opts = {
        "model": tiny_model_dir,
        "endpoint": "",
        "rubric": str(rubric),
        "parse": "yes_no",
        "mode": "pointwise",
        "min_score": 0.0,
        "max_score": 10.0,
        "min_yes_no_mass": 0.0,
        "temperature": 0.0,
        "max_new_tokens": 8,
        "dtype": "float32",
        "batch_size": 3,
        "time_limit_s": 5.0,
        "retries": 0,
        "cache": "off",
        "api_key_env": "",
    }
    reward = JudgeReward(opts, local=local)
    answers = ["7", "the answer is \\boxed{7}", "8", "a much longer answer that pads the others"]
    batched = [s.value for s in reward(answers, [P] * 4)]
    single = [reward([a], [P])[0].value for a in answers]
    assert batched == pytest.approx(single, abs=1e-5)
    model, tok = local._loaded()  # the value is p_yes / (p_yes + p_no) of the next token, computed here directly
    text = tok.apply_chat_template(
        [{"role": "user", "content": reward.units([answers[0]], [P])[0][1]}], tokenize=False, add_generation_prompt=True
    )
    with torch.no_grad():
        probs = model(torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])).logits[0, -1].softmax(-1)
    y, n = probs[single_token_ids(tok, YES)].sum(), probs[single_token_ids(tok, NO)].sum()
    assert batched[0] == pytest.approx(float(y / (y + n)), abs=1e-5)
    strict = JudgeReward({**opts, "min_yes_no_mass": 0.99}, local=local)([answers[0]], [P])[0]
    assert strict.value is None and "did not answer yes or no" in strict.error  # a random model's mass is tiny


def test_a_changed_rubric_shows_in_manifest_diff_through_the_judge_record(tmp_path, serve):
    from grpolab.card import objective_card
    from grpolab.manifest import diff_manifests
    from grpolab.rewards import RewardSet

    server = serve(digit_judge)
    manifests = []
    for rubric in [POINTWISE, POINTWISE + " Be strict."]:
        cfg = from_dict(
            {
                "reward": {
                    "weights": {"judge": 1.0},
                    "judge": {
                        "endpoint": server.url,
                        "model": "scripted",
                        "rubric": str(tmp_path / "rubric.txt"),
                        "cache": "off",
                    },
                }
            }
        )
        (tmp_path / "rubric.txt").write_text(rubric)  # the same path, another text
        record = RewardSet(cfg.reward.weights, {}, 5.0, None, judge=cfg.reward.judge).judge_record()
        manifests.append({"objective": objective_card(cfg), "judge": record})  # as grpolab.runs writes them
    changed = {k for k, _, _ in diff_manifests(*manifests)}
    assert changed == {"judge.rubric_sha256"}, "the card is the same: it names the rubric's path, not its text"
    assert manifests[0]["judge"]["identity"]["reported"]["version"] == "v1"


def test_a_run_whose_card_held_the_judges_identity_still_resumes(tmp_path):
    """Manifests written when the objective card recorded the judge's identity and rubric sha256 are read in today's
    form (grpolab.card.recorded.upgrade_manifest): the same run compares equal, a changed rubric still does not."""
    from grpolab.card import objective_card
    from grpolab.config import to_dict
    from grpolab.runs import check_resume

    options = {"endpoint": "http://127.0.0.1:9/v1", "model": "m", "rubric": str(tmp_path / "r.txt")}
    cfg = from_dict({"reward": {"weights": {"judge": 1.0}, "judge": options}})
    identity = {"kind": "endpoint", "base_url": "http://127.0.0.1:9/v1", "model": "m", "reported": None}
    card = objective_card(cfg)
    current = {"config": to_dict(cfg), "objective": card, "judge": {"identity": identity, "rubric_sha256": "ab"}}
    earlier_entry = {k: v for k, v in card["judge"].items() if k not in ("model", "endpoint")}
    earlier = {
        "config": to_dict(cfg),
        "objective": {**card, "judge": {"judge": identity, **earlier_entry, "rubric_sha256": "ab"}},
    }
    assert check_resume(earlier, current, tmp_path, allow_changes=False) == []
    changed = {**earlier, "objective": {**earlier["objective"], "judge": {**earlier["objective"]["judge"]}}}
    changed["objective"]["judge"]["rubric_sha256"] = "cd"
    with pytest.raises(GrpolabError, match=r"judge.rubric_sha256: 'cd' -> 'ab'"):
        check_resume(changed, current, tmp_path, allow_changes=False)
