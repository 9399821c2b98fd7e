"""Metric definitions: the defaults catch the common forms, a user's regex is checked, values come with their step."""

import re

import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from jobs.results.metrics import (
    LEGACY_DEFAULT_REGEXES,
    MetricDefinitionError,
    MetricExtractor,
    default_metric_definitions,
    validate_metric_definitions,
)
from jobs.submission.forms import TrainingJobForm


def extract(text, definitions=None):
    return [(point.name, point.value, point.step) for point in MetricExtractor(definitions or default_metric_definitions()).extract(text)]


@pytest.mark.parametrize("line, expected", [
    ("step=3 loss=0.123456", [("loss", 0.123456, 3)]),
    ("Loss: 0.5", [("loss", 0.5, None)]),
    ("epoch 2 iter 40 loss 1e-3 acc: 91.5%", [("loss", 0.001, 40), ("accuracy", 91.5, 40)]),
    ("accuracy=0.9 step 7/10", [("accuracy", 0.9, 7)]),
    ("val_loss=0.2 lossy 3 loss=nan", []),
])
def test_the_defaults_catch_the_common_forms_and_the_examples_output(line, expected):
    assert extract(line) == expected


def test_a_users_regex_gives_its_value_group_and_its_step_group():
    definitions = validate_metric_definitions([{"name": "top5", "regex": r"it (?P<step>\d+): top-5 (?P<value>[\d.]+)"}])
    assert extract("it 12: top-5 0.87", definitions) == [("top5", 0.87, 12)]


@pytest.mark.parametrize("definitions, reason", [
    ([{"name": "loss", "regex": "loss=(\\d+"}], "missing )"),
    ([{"name": "loss", "regex": "loss=\\d+"}], "captures nothing"),
    ([{"name": "loss", "regex": "(a)"}, {"name": "loss", "regex": "(b)"}], "given twice"),
    ([{"name": "1st", "regex": "(a)"}], "must start with a letter"),
    ({"name": "loss"}, "Give a list"),
])
def test_bad_definitions_are_refused_with_the_reason(definitions, reason):
    with pytest.raises(MetricDefinitionError, match=re.escape(reason)):
        validate_metric_definitions(definitions)


@pytest.mark.django_db
def test_the_job_form_refuses_a_bad_regex_with_the_reason():
    form = TrainingJobForm(data={"metrics": [{"name": "loss", "regex": "loss=([0-9.]+"}]})
    assert not form.is_valid()
    assert "missing )" in form.errors["metrics"][0]
    good = TrainingJobForm(data={"metrics": [{"name": "loss", "regex": "loss=([0-9.]+)"}]})
    good.is_valid()
    assert "metrics" not in good.errors


def test_a_catastrophic_pattern_runs_in_linear_time_on_a_long_line():
    import time

    extractor = MetricExtractor(validate_metric_definitions([{"name": "evil", "regex": r"(a+)+b=(\d+)"}]))
    started = time.perf_counter()
    assert extractor.extract("a" * 1999 + "c") == []
    assert time.perf_counter() - started < 0.5, "backtracking would take minutes here"


def test_lookbehind_and_back_references_are_refused_with_the_reason():
    for pattern in (r"(?<=x)loss=(\d+)", r"(a)\1=(\d+)"):
        with pytest.raises(MetricDefinitionError, match="linear-time"):
            validate_metric_definitions([{"name": "x", "regex": pattern}])


def test_jobs_made_before_re2_keep_their_default_metrics():
    from jobs.results.metrics import LEGACY_DEFAULT_REGEXES

    legacy = [{"name": f"m{index}", "regex": regex} for index, regex in enumerate(sorted(LEGACY_DEFAULT_REGEXES))]
    points = MetricExtractor(legacy).extract("step=3 loss=0.5 acc=0.9")
    assert sorted(point.value for point in points) == [0.5, 0.9]


def test_a_nul_or_a_line_break_in_a_metric_is_refused():
    for regex in ("loss=(\\d+)\x00", "loss=(\\d+)\n"):
        with pytest.raises(MetricDefinitionError, match="control characters"):
            validate_metric_definitions([{"name": "loss", "regex": regex}])
    with pytest.raises(MetricDefinitionError):
        validate_metric_definitions([{"name": "lo\nss", "regex": "loss=(\\d+)"}])


# Patterns whose matches depend on where a line starts and ends, or that could match across lines.
BATCH_PATTERNS = [
    r"^loss=(\d+)", r"(\d+)$", r"\bacc (\d)\b", r"\Bx(\d)", r"loss\s*(\d+)", r"[^a]*?(\d)", r"(\d*)", r"\A(\d)",
    r"(\d)\z", r"(?-m)^(\d)", r"(?i:LOSS)[=:]?(\S+)", r"é(\d)", r".*(\d)$", r"(?s)x.(\d)",
]


@given(st.lists(st.text(alphabet="loss=acc é9x1 \t:\r\n0.", max_size=12), max_size=12),
       st.lists(st.sampled_from(BATCH_PATTERNS), min_size=1, max_size=4, unique=True))
@hypothesis_settings(max_examples=400, deadline=None)
@example(["loss", "=1"], [r"loss\s*(\d+)"])
@example(["a", "9"], [r"^loss=(\d+)", r"\A(\d)"])
def test_a_batch_finds_what_each_line_alone_gives(lines, patterns):
    extractor = MetricExtractor([{"name": f"m{number}", "regex": pattern} for number, pattern in enumerate(patterns)])
    alone = [(index, extractor.extract(text)) for index, text in enumerate(lines)]
    assert extractor.extract_many(lines) == [(index, points) for index, points in alone if points]


def test_a_batch_with_the_defaults_and_the_legacy_defaults_finds_the_same_points():
    lines = ["noise", "step=3 loss=0.5 acc=0.9", "x" * 2500 + " loss=1", "loss=2 " + "y" * 2500, "Loss: 0.25", ""]
    legacy = [{"name": name, "regex": pattern} for name, pattern in zip(("loss", "accuracy"), LEGACY_DEFAULT_REGEXES, strict=False)]
    for definitions in (default_metric_definitions(), legacy):
        extractor = MetricExtractor(definitions)
        expected = [(index, extractor.extract(text)) for index, text in enumerate(lines)]
        assert extractor.extract_many(lines) == [(index, points) for index, points in expected if points]
